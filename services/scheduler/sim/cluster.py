"""The cluster a simulation runs on: a HiveD config for the scheduler core, plus the plain
GPU counts (nodes, VC quotas) that the simpler policy models and the metrics use.

Three ways in, chosen by `load_sim_cluster` from the file:
- a HiveD-format YAML config, used as it is;
- VC capacities like Philly's `philly_vc.csv` (`vc,node num`): one VC per row owning
  that many nodes of `gpus_per_node` GPUs of one sku; nodes are grouped in racks;
- a GPU node list like Alibaba's `openb_node_list_gpu_node.csv` (`sn,...,gpu,model`):
  one sku per GPU model, every node in one VC (default "default").
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from services.scheduler.cluster import ClusterConfig, PhysicalCell, load_cluster_config
from services.scheduler.sim.readers import read_alibaba_nodes, read_philly_vcs
from services.scheduler.sim.readers.alibaba import is_alibaba_nodes
from services.scheduler.sim.readers.philly import is_philly_vcs
from services.scheduler.sim.readers.rows import read_header
from services.scheduler.sim.trace import SkippedRow

DEFAULT_SKU = "gpu"
DEFAULT_GPUS_PER_NODE = 8
# Philly-style clusters: nodes per rack (a rack is a top-level cell, so buddy allocation
# keeps a VC's nodes and a multi-node gang's tasks close together).
DEFAULT_RACK_NODES = 16


class SimCluster(msgspec.Struct, frozen=True, kw_only=True):
    source: str  # file name
    kind: str  # "hived", "vc-capacities", "node-list"
    config: ClusterConfig
    node_gpus: list[int]  # GPUs of every node (one entry per node-level cell), config order
    vc_quota: dict[str, int]  # GPUs guaranteed to each VC, config order
    vc_nodes: dict[str, list[int]]  # each VC's quota as nodes (GPUs each): its private cluster
    skipped: list[SkippedRow] = []
    notes: list[str] = []

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus)

    @property
    def max_node_gpus(self) -> int:
        return max(self.node_gpus, default=0)


class ClusterFileError(ValueError):
    """The cluster file cannot be used; the message says why."""


def load_sim_cluster(path: Path | str, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE, sku: str = DEFAULT_SKU,
                     rack_nodes: int = DEFAULT_RACK_NODES, vc: str = "default") -> SimCluster:
    path = Path(path)
    if not path.is_file():
        raise ClusterFileError(f"{path}: no such file")
    if path.suffix.lower() in (".yaml", ".yml"):
        return from_config(load_cluster_config(path), source=path.name, kind="hived")
    header = read_header(path)
    if is_philly_vcs(header):
        nodes, skipped = read_philly_vcs(path)
        if not nodes:
            raise ClusterFileError(f"{path.name}: no usable VC rows")
        cluster = cluster_from_vc_capacities(nodes, gpus_per_node=gpus_per_node, sku=sku, rack_nodes=rack_nodes,
                                             source=path.name)
        return msgspec.structs.replace(cluster, skipped=skipped)
    if is_alibaba_nodes(header):
        node_rows, skipped = read_alibaba_nodes(path)
        if not node_rows:
            raise ClusterFileError(f"{path.name}: no usable GPU nodes")
        cluster = cluster_from_node_list(node_rows, vc=vc, source=path.name)
        return msgspec.structs.replace(cluster, skipped=skipped)
    raise ClusterFileError(
        f"{path.name}: not a cluster file (header: {','.join(header) or 'none'}); expected a HiveD YAML config, "
        "VC capacities (vc,node num) or a GPU node list (sn,...,gpu,model)")


def cluster_from_vc_capacities(nodes_per_vc: dict[str, int], *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                               sku: str = DEFAULT_SKU, rack_nodes: int = DEFAULT_RACK_NODES,
                               source: str = "vc capacities") -> SimCluster:
    """One sku, nodes of `gpus_per_node` GPUs in racks; each VC owns its nodes as node-level virtual cells."""
    total = sum(nodes_per_vc.values())
    # The largest rack size up to rack_nodes that divides the node count, so all racks are alike.
    rack = max(size for size in range(1, max(1, min(rack_nodes, total)) + 1) if total % size == 0)
    cell_types, node_type = _node_cell_types(sku, gpus_per_node)
    physical: list[dict] = []
    names = [f"node-{index:04d}" for index in range(total)]
    if rack > 1:
        rack_type = f"{sku}-rack"
        cell_types[rack_type] = {"childCellType": node_type, "childCellNumber": rack}
        for start in range(0, total, rack):
            physical.append({"cellType": rack_type,
                             "cellChildren": [{"cellAddress": name} for name in names[start:start + rack]]})
        vc_cell = f"{rack_type}.{node_type}"
    else:
        physical = [{"cellType": node_type, "cellAddress": name} for name in names]
        vc_cell = node_type
    raw = {
        "physicalCluster": {"skuTypes": {sku: {"gpu": 1}}, "cellTypes": cell_types, "physicalCells": physical},
        "virtualClusters": {name: {"virtualCells": [{"cellType": vc_cell, "cellNumber": count}]}
                            for name, count in nodes_per_vc.items()},
    }
    notes = [f"{len(nodes_per_vc)} VCs, {total} nodes of {gpus_per_node} {sku} GPUs"
             + (f" in racks of {rack} nodes" if rack > 1 else "")]
    return msgspec.structs.replace(from_config(load_cluster_config(raw), source=source, kind="vc-capacities"),
                                   notes=notes)


def cluster_from_node_list(node_rows: list[tuple[str, int, str]], *, vc: str = "default",
                           source: str = "node list") -> SimCluster:
    """One sku per GPU model, one node-level cell type per (model, GPUs per node); one VC holds every node."""
    skus: dict[str, dict] = {}
    cell_types: dict[str, dict] = {}
    physical: list[dict] = []
    counts: dict[str, int] = {}
    for name, gpus, model in node_rows:
        skus.setdefault(model, {"gpu": 1})
        node_type = f"{model}-{gpus}gpu-node"
        cell_types.setdefault(node_type, {"childCellType": model, "childCellNumber": gpus, "isNodeLevel": True})
        physical.append({"cellType": node_type, "cellAddress": name})
        counts[node_type] = counts.get(node_type, 0) + 1
    raw = {
        "physicalCluster": {"skuTypes": skus, "cellTypes": cell_types, "physicalCells": physical},
        "virtualClusters": {vc: {"virtualCells": [{"cellType": t, "cellNumber": n} for t, n in counts.items()]}},
    }
    gpus = sum(g for _, g, _ in node_rows)
    note = (f"{len(node_rows)} GPU nodes, {gpus} GPUs of {len(skus)} models ({', '.join(sorted(skus))}), "
            f"all in VC {vc}; CPU and memory are not accounted")
    return msgspec.structs.replace(from_config(load_cluster_config(raw), source=source, kind="node-list"),
                                   notes=[note])


def _node_cell_types(sku: str, gpus_per_node: int) -> tuple[dict[str, dict], str]:
    """Buddy levels inside a node (2, 4, ... GPUs) when the node size is a power of two."""
    cell_types: dict[str, dict] = {}
    child, size = sku, 1
    if gpus_per_node & (gpus_per_node - 1) == 0:
        while size * 2 < gpus_per_node:
            name = f"{sku}-{size * 2}"
            cell_types[name] = {"childCellType": child, "childCellNumber": 2}
            child, size = name, size * 2
    node_type = f"{sku}-node"
    cell_types[node_type] = {"childCellType": child, "childCellNumber": gpus_per_node // size, "isNodeLevel": True}
    return cell_types, node_type


# --- plain GPU counts from any config -------------------------------------------------


def from_config(config: ClusterConfig, *, source: str, kind: str) -> SimCluster:
    cell_types = config.cellTypes

    def gpus_of(cell_type: str, count: int = 1) -> int:
        info = cell_types[cell_type]
        return info.leafCellNumber * config.skuTypes[info.skuType].gpu * count

    def node_cells(cell: PhysicalCell) -> list[PhysicalCell]:
        if cell.node is not None:
            return [cell]
        return [node for child in cell.children for node in node_cells(child)]

    nodes = [node for top in config.physicalCells for node in node_cells(top)]
    pinned: dict[str, PhysicalCell] = {}

    def collect_pinned(cell: PhysicalCell) -> None:
        if cell.pinnedCellId is not None:
            pinned[cell.pinnedCellId] = cell
        for child in cell.children:
            collect_pinned(child)

    for top in config.physicalCells:
        collect_pinned(top)

    quota: dict[str, int] = {}
    private: dict[str, list[int]] = {}
    for name, vc in config.virtualClusters.items():
        bins: list[int] = []
        for virtual in vc.virtualCells:
            node_type = _node_type_below(config, virtual.cellType)
            if node_type is None:  # a cell smaller than a node: a partial node of its own
                bins.extend([gpus_of(virtual.cellType)] * virtual.cellNumber)
            else:
                per_cell = cell_types[virtual.cellType].leafCellNumber // cell_types[node_type].leafCellNumber
                bins.extend([gpus_of(node_type)] * (per_cell * virtual.cellNumber))
        for pinned_id in vc.pinnedCells:
            cell = pinned[pinned_id]
            bins.extend(gpus_of(node.cellType) for node in node_cells(cell))
        quota[name] = sum(bins)
        private[name] = bins
    return SimCluster(source=source, kind=kind, config=config,
                      node_gpus=[gpus_of(node.cellType) for node in nodes], vc_quota=quota, vc_nodes=private)


def _node_type_below(config: ClusterConfig, cell_type: str) -> str | None:
    """The node-level type at or below this type, or None when the type is smaller than a node."""
    current: str | None = cell_type
    while current is not None:
        info = config.cellTypes[current]
        if info.isNodeLevel:
            return current
        current = info.childCellType
    return None
