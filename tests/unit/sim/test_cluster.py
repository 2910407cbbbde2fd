"""Clusters for the simulator: from VC capacities, from a GPU node list, from a HiveD config."""

from __future__ import annotations

import pytest

from services.scheduler.sim.cluster import ClusterFileError, cluster_from_vc_capacities, load_sim_cluster
from tests.unit.sim.helpers import CLUSTERS, TRACES


def test_vc_capacities_give_each_vc_its_nodes_of_eight_gpus():
    cluster = load_sim_cluster(TRACES / "philly-vc-small.csv")
    assert cluster.kind == "vc-capacities"
    assert cluster.vc_quota == {"vc-big": 32, "vc-small": 16}
    assert cluster.vc_nodes == {"vc-big": [8] * 4, "vc-small": [8] * 2}
    assert (cluster.total_gpus, cluster.max_node_gpus, len(cluster.node_gpus)) == (48, 8, 6)
    assert cluster.config.virtualClusters["vc-big"].virtualCells[0].cellNumber == 4


@pytest.mark.parametrize(("nodes", "rack_nodes", "racks"), [
    ({"a": 8, "b": 8}, 16, 1),
    ({"a": 8, "b": 4}, 5, 3),  # 12 nodes, at most 5 a rack: 3 racks of 4
    ({"a": 3, "b": 4}, 4, 0),  # 7 nodes, a prime: no racks, nodes at the top
    ({"a": 4, "b": 4}, 2, 4),
], ids=["one-rack", "racks-that-divide", "prime-node-count", "small-racks"])
def test_nodes_are_grouped_in_equal_racks(nodes, rack_nodes, racks):
    cluster = cluster_from_vc_capacities(nodes, rack_nodes=rack_nodes)
    tops = cluster.config.physicalCells
    assert sum(1 for top in tops if top.cellType == "gpu-rack") == racks
    assert cluster.total_gpus == 8 * sum(nodes.values())


def test_node_sizes_other_than_powers_of_two_have_no_buddy_levels():
    cluster = cluster_from_vc_capacities({"a": 2}, gpus_per_node=6, sku="K80")
    assert cluster.node_gpus == [6, 6]
    assert cluster.config.cellTypes["K80-node"].childCellType == "K80"


def test_a_gpu_node_list_gives_one_sku_per_model_in_one_vc():
    cluster = load_sim_cluster(TRACES / "alibaba-nodes-small.csv")
    assert cluster.kind == "node-list"
    assert sorted(cluster.config.skuTypes) == ["P100", "T4", "V100M32"]
    assert cluster.vc_quota == {"default": 16}
    assert sorted(cluster.vc_nodes["default"]) == [2, 2, 4, 8]
    assert [(row.line, row.kind) for row in cluster.skipped] == [(5, "no-gpu")]


@pytest.mark.parametrize(("file", "quota", "private_nodes"), [
    ("two-racks.yaml", {"vision": 8, "speech": 8}, {"vision": [4, 4], "speech": [4, 4]}),
    ("mixed-skus.yaml", None, None),
], ids=["two-racks", "mixed-skus"])
def test_a_hived_config_is_used_as_it_is(file, quota, private_nodes):
    cluster = load_sim_cluster(CLUSTERS / file)
    assert cluster.kind == "hived"
    assert sum(cluster.vc_quota.values()) <= cluster.total_gpus
    for vc, nodes in cluster.vc_nodes.items():
        assert sum(nodes) == cluster.vc_quota[vc]
    if quota is not None:
        assert cluster.vc_quota == quota
        assert cluster.vc_nodes == private_nodes


def test_a_file_that_is_no_cluster_is_refused_with_what_was_expected(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text("name,size\nx,1\n")
    with pytest.raises(ClusterFileError, match="expected a HiveD YAML config, VC capacities"):
        load_sim_cluster(path)
