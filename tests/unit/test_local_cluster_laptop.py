"""The laptop's one-node cluster: CPU cells oversubscribed; what the scheduler publishes about the layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.scheduler.cluster import load_cluster_config, local_cluster_config
from services.scheduler.cluster.published import node_cells_view, sku_types_view

CLUSTERS = Path(__file__).parents[1] / "fixtures" / "clusters"


@pytest.mark.parametrize("cpus,factor,cells", [(2, 1, 2), (2, 4, 8), (6, 3, 18)], ids=["exact", "default-4", "three"])
def test_cpu_cells_per_core(cpus, factor, cells):
    config = local_cluster_config(node="laptop", gpus=0, cpus=cpus, memory_mb=cpus * 1024, cpu_oversubscription=factor)
    (node,) = node_cells_view(config)["laptop"]
    assert node["leafCells"] == cells and node["sku"] == "cpu"
    # each cell offers a whole CPU and a core's memory: a one-CPU task takes one cell
    assert sku_types_view(config)["cpu"] == {"gpu": 0, "cpu": 1, "memory": 1024, "maxLeafCellsPerNode": cells}


def test_gpus_are_never_oversubscribed():
    config = local_cluster_config(node="box", gpus=2, cpus=8, memory_mb=8192, cpu_oversubscription=4)
    assert [c["leafCells"] for c in node_cells_view(config)["box"]] == [2]


def test_oversubscription_must_be_positive():
    with pytest.raises(ValueError):
        local_cluster_config(gpus=0, cpus=2, memory_mb=1024, cpu_oversubscription=0)


def test_cluster_file_nodes_and_skus_are_published_exactly():
    config = load_cluster_config(CLUSTERS / "mixed-skus.yaml")
    cells = node_cells_view(config)
    skus = sku_types_view(config)
    assert set(cells) == set(config.node_names())
    for name, sku in config.skuTypes.items():
        assert skus[name]["gpu"] == sku.gpu and skus[name]["cpu"] == sku.cpu
        per_node = [sum(c["leafCells"] for c in node if c["sku"] == name) for node in cells.values()]
        assert skus[name]["maxLeafCellsPerNode"] == max(per_node)
