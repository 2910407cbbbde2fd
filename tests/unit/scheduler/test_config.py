"""Loading HiveD-format cluster configs: what is inferred, and every validation error."""

from __future__ import annotations

import copy

import pytest

from services.scheduler.cluster import ClusterConfigError, load_cluster_config, local_cluster_config
from services.scheduler.cluster.quantities import parse_memory_mb

from .builders import cluster, reference_hived

BASE = {
    "physicalCluster": {
        "skuTypes": {"K80": {"gpu": 1, "cpu": 4, "memory": "8192Mi"}},
        "cellTypes": {
            "K80-NODE": {"childCellType": "K80", "childCellNumber": 4, "isNodeLevel": True},
            "K80-RACK": {"childCellType": "K80-NODE", "childCellNumber": 2},
        },
        "physicalCells": [
            {"cellType": "K80-RACK", "cellChildren": [{"cellAddress": "n1"}, {"cellAddress": "n2"}]},
        ],
    },
    "virtualClusters": {"vc1": {"virtualCells": [{"cellType": "K80-RACK.K80-NODE", "cellNumber": 2}]}},
}


def changed(change) -> dict:
    data = copy.deepcopy(BASE)
    change(data)
    return data


PC = "physicalCluster"


def _set(path: list, value):
    def apply(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


INVALID = [
    ("unknown-cell-type-in-physical-cells", _set([PC, "physicalCells", 0, "cellType"], "K81-RACK"),
     "physicalCluster.physicalCells[0].cellType: unknown cell type 'K81-RACK'"),
    ("unknown-sku", _set([PC, "cellTypes", "K80-NODE", "childCellType"], "K81"),
     "physicalCluster.cellTypes.K80-NODE.childCellType: unknown sku 'K81'"),
    ("cycle-in-cell-types", lambda d: d[PC]["cellTypes"].update(
        {"A": {"childCellType": "B", "childCellNumber": 1}, "B": {"childCellType": "A", "childCellNumber": 1}}),
     "cycle in cell types"),
    ("vc-asks-more-than-exist", _set(["virtualClusters", "vc1", "virtualCells", 0, "cellNumber"], 3),
     "the VCs ask for more cells than exist in chain 'K80-RACK'"),
    ("two-vcs-ask-more-than-exist", lambda d: d["virtualClusters"].update(
        {"vc2": {"virtualCells": [{"cellType": "K80-RACK", "cellNumber": 1}]}}),
     "vc2: 1 x K80-RACK"),
    ("duplicate-node-address", _set([PC, "physicalCells", 0, "cellChildren", 1, "cellAddress"], "n1"),
     "duplicate cell address 'n1'"),
    ("duplicate-gpu-index", _set([PC, "physicalCells", 0, "cellChildren", 0, "cellChildren"],
                                 [{"cellAddress": 0}, {"cellAddress": 0}]),
     "duplicate cell address 'n1/0'"),
    ("gpu-index-not-a-number", _set([PC, "physicalCells", 0, "cellChildren", 0, "cellChildren"],
                                    [{"cellAddress": "gpu-a"}]),
     "'gpu-a' is not a GPU index"),
    ("too-many-children", _set([PC, "physicalCells", 0, "cellChildren"],
                               [{"cellAddress": "n1"}, {"cellAddress": "n2"}, {"cellAddress": "n3"}]),
     "3 children but cell type 'K80-RACK' has childCellNumber 2"),
    ("no-node-level", _set([PC, "cellTypes", "K80-NODE", "isNodeLevel"], False),
     "has no node-level cell type"),
    ("two-node-levels", _set([PC, "cellTypes", "K80-RACK", "isNodeLevel"], True),
     "has several node-level cell types"),
    ("memory-without-unit", _set([PC, "skuTypes", "K80", "memory"], 8192),
     "physicalCluster.skuTypes.K80.memory: memory 8192 needs a unit"),
    ("memory-not-a-quantity", _set([PC, "skuTypes", "K80", "memory"], "lots"),
     "is not a quantity like 8192Mi"),
    ("negative-gpu", _set([PC, "skuTypes", "K80", "gpu"], -1), "physicalCluster.skuTypes.K80.gpu: must be a whole number >= 0"),
    ("child-number-zero", _set([PC, "cellTypes", "K80-NODE", "childCellNumber"], 0),
     "physicalCluster.cellTypes.K80-NODE.childCellNumber: must be a whole number >= 1"),
    ("vc-path-not-a-chain-top", _set(["virtualClusters", "vc1", "virtualCells", 0, "cellType"], "K80-NODE"),
     "no physical cell has type 'K80-NODE'"),
    ("vc-path-not-parent-child", _set(["virtualClusters", "vc1", "virtualCells", 0, "cellType"], "K80-RACK.K80"),
     "'K80' is not the child cell type of 'K80-RACK'"),
    ("vc-path-unknown-type", _set(["virtualClusters", "vc1", "virtualCells", 0, "cellType"], "K80-RACK.GPU"),
     "unknown cell type 'GPU'"),
    ("unknown-pinned-cell", _set(["virtualClusters", "vc1", "pinnedCells"], [{"pinnedCellId": "nope"}]),
     "virtualClusters.vc1.pinnedCells[0].pinnedCellId: unknown pinned cell 'nope'"),
    ("bad-vc-name", lambda d: d["virtualClusters"].update({"my.vc": {}}), "VC name 'my.vc' may only use"),
    ("unknown-key-in-cell-type", _set([PC, "cellTypes", "K80-NODE", "childCellCount"], 2),
     "physicalCluster.cellTypes.K80-NODE.childCellCount: unknown key"),
    ("missing-cell-types", lambda d: d[PC].pop("cellTypes"), "physicalCluster.cellTypes: required"),
    ("sku-offers-nothing", _set([PC, "skuTypes", "K80"], {"gpu": 0, "cpu": 0, "memory": "0"}),
     "a sku must offer at least one of gpu, cpu, memory"),
]


@pytest.mark.parametrize("change,expected", [(c, e) for _, c, e in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_config_names_the_path_and_the_problem(change, expected):
    with pytest.raises(ClusterConfigError) as error:
        load_cluster_config(changed(change))
    assert any(expected in message for message in error.value.errors), error.value.errors


def test_every_problem_is_reported_at_once():
    def two_problems(data):
        data[PC]["skuTypes"]["K80"]["memory"] = "lots"
        data["virtualClusters"]["vc1"]["virtualCells"][0]["cellType"] = "K80-RACK.GPU"

    with pytest.raises(ClusterConfigError) as error:
        load_cluster_config(changed(two_problems))
    assert len(error.value.errors) == 2


def test_pinned_cell_cannot_be_given_to_two_vcs():
    def pin(data):
        data[PC]["physicalCells"][0]["cellChildren"][0]["pinnedCellId"] = "p1"
        data["virtualClusters"]["vc1"]["virtualCells"][0]["cellNumber"] = 1
        data["virtualClusters"]["vc1"]["pinnedCells"] = [{"pinnedCellId": "p1"}]
        data["virtualClusters"]["vc2"] = {"pinnedCells": [{"pinnedCellId": "p1"}]}

    with pytest.raises(ClusterConfigError, match="pinned cell 'p1' is already given to VC vc1"):
        load_cluster_config(changed(pin))


def test_pinned_cells_count_against_capacity():
    def pin(data):
        data[PC]["physicalCells"][0]["cellChildren"][0]["pinnedCellId"] = "p1"
        data["virtualClusters"]["vc2"] = {"pinnedCells": [{"pinnedCellId": "p1"}]}

    with pytest.raises(ClusterConfigError, match="more cells than exist"):
        load_cluster_config(changed(pin))


def test_yaml_syntax_error_is_a_config_error():
    with pytest.raises(ClusterConfigError, match="not valid YAML"):
        load_cluster_config("physicalCluster: [unclosed\n")


def test_inferred_addresses_and_node_names():
    config = load_cluster_config(BASE)
    assert config.node_names() == ["n1", "n2"]
    node = config.physicalCells[0].children[0]
    assert [leaf.address for leaf in node.children] == ["n1/0", "n1/1", "n1/2", "n1/3"]
    assert config.skuTypes["K80"].memoryMB == 8192


def test_node_level_cell_without_address_gets_a_stable_name():
    data = changed(_set([PC, "physicalCells", 0, "cellChildren"], None))
    assert load_cluster_config(data).node_names() == load_cluster_config(data).node_names() == \
        ["K80-NODE-0-0", "K80-NODE-0-1"]


def test_yaml_text_file_path_and_dict_give_the_same_config(tmp_path):
    import yaml

    text = yaml.safe_dump(BASE)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    assert load_cluster_config(text) == load_cluster_config(path) == load_cluster_config(BASE) \
        == load_cluster_config(str(path))


@pytest.mark.parametrize("name", ["two-racks", "mixed-skus", "eight-gpu-node"])
def test_fixture_clusters_load(name):
    config = cluster(name)
    assert config.node_names()
    assert config.virtualClusters


def test_mixed_skus_fixture_details():
    config = cluster("mixed-skus")
    assert config.skuTypes["CPU"].gpu == 0
    assert config.virtualClusters["ops"].pinnedCells == ["ops-t4"]
    assert config.node_names() == ["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2", "10.0.2.1"]


REFERENCE_CONFIGS = ["hived-config-1.yaml", "hived-config-2.yaml", "hived-config-3.yaml", "hived-config-33.yaml",
                     "hived-config-4.yaml", "hived-config-5.yaml", "hived-config-6.yaml", "hived-config-7.yaml",
                     "hived-config-8.yaml"]


@pytest.mark.parametrize("name", REFERENCE_CONFIGS)
def test_reference_hived_configs_load(name):
    config = load_cluster_config(reference_hived(name))
    assert set(config.virtualClusters) <= {"vc1", "vc2", "default"}
    assert all(node.startswith("10.151.41.") for node in config.node_names())


def test_reference_design_config_loads_without_sku_types():
    config = load_cluster_config(reference_hived("design-hivedscheduler.yaml"))
    # One node holds two GPU models (CT1 GPUs 8, 9 and eight P100s): two node-level cells, one node.
    assert config.node_names().count("1.0.0.2") == 1
    assert config.skuTypes["CT1"].gpu == 1


@pytest.mark.parametrize("gpus,cpus,memory,nodes,sku,leaf", [
    (2, 16, 32000, 1, "gpu", {"gpu": 1, "cpu": 8, "memoryMB": 16000}),
    (0, 8, 16384, 1, "cpu", {"gpu": 0, "cpu": 1, "memoryMB": 2048}),
    (4, 8, 8000, 3, "gpu", {"gpu": 1, "cpu": 2, "memoryMB": 2000}),
], ids=["one-gpu-node", "cpu-only", "three-nodes"])
def test_local_cluster_config(gpus, cpus, memory, nodes, sku, leaf):
    config = local_cluster_config(gpus=gpus, cpus=cpus, memory_mb=memory, nodes=nodes)
    assert list(config.skuTypes) == [sku]
    sku_type = config.skuTypes[sku]
    assert {"gpu": sku_type.gpu, "cpu": sku_type.cpu, "memoryMB": sku_type.memoryMB} == leaf
    assert list(config.virtualClusters) == ["default"]
    expected_nodes = ["local"] if nodes == 1 else [f"local-{i}" for i in range(nodes)]
    assert config.node_names() == expected_nodes


def test_local_cluster_config_needs_some_resource():
    with pytest.raises(ValueError):
        local_cluster_config(gpus=0, cpus=0, memory_mb=1024)


@pytest.mark.parametrize("text,mb", [("8192Mi", 8192), ("16Gi", 16384), ("1Ti", 1048576), ("2G", 1907),
                                     ("0", 0), (0, 0), ("1.5Gi", 1536)],
                         ids=["Mi", "Gi", "Ti", "decimal-G", "zero-text", "zero", "fraction"])
def test_memory_quantities(text, mb):
    assert parse_memory_mb(text) == mb


