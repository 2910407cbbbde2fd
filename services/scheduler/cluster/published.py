"""What the scheduler tells others about the cluster's layout (pure; no I/O).

The sku types and each node's cells go into the `ClusterView` the scheduler
publishes (bucket pai_cluster), so rest can answer `GET /api/v2/cluster/sku-types`
and `GET /api/v2/cluster/nodes`, and refuse at submit a job that can never fit
its VC, without reading the cluster file itself.
"""

from __future__ import annotations

from typing import Any

from services.scheduler.cluster.model import ClusterConfig, PhysicalCell


def sku_types_view(config: ClusterConfig) -> dict[str, dict[str, Any]]:
    """sku name -> what one leaf cell of it offers, and the most leaves one node has."""
    per_node = _leaves_per_node(config)
    return {
        name: {
            "gpu": sku.gpu,
            "cpu": sku.cpu,
            "memory": sku.memoryMB,
            "maxLeafCellsPerNode": max((counts.get(name, 0) for counts in per_node.values()), default=0),
        }
        for name, sku in config.skuTypes.items()
    }


def node_cells_view(config: ClusterConfig) -> dict[str, list[dict[str, Any]]]:
    """node name -> its node-level cells: address, cell type, sku and leaf cells."""
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in config.node_names()}

    def visit(cell: PhysicalCell) -> None:
        cell_type = config.cellTypes[cell.cellType]
        if cell.node is not None and cell_type.isNodeLevel:
            found.setdefault(cell.node, []).append({
                "address": cell.address,
                "cellType": cell.cellType,
                "sku": cell_type.skuType,
                "leafCells": cell_type.leafCellNumber,
                "pinnedCellId": cell.pinnedCellId,
            })
            return
        for child in cell.children:
            visit(child)

    for top in config.physicalCells:
        visit(top)
    return found


def _leaves_per_node(config: ClusterConfig) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for node, cells in node_cells_view(config).items():
        for cell in cells:
            counts.setdefault(node, {})
            counts[node][cell["sku"]] = counts[node].get(cell["sku"], 0) + cell["leafCells"]
    return counts
