"""Read a HiveD-format cluster config, check it, and fill in what it leaves implicit.

Accepted shape (unknown top-level keys such as `kubeApiServerAddress` are ignored):

    physicalCluster:
      skuTypes:   {<sku>: {gpu: 1, cpu: 4, memory: 8192Mi}}    # optional, see below
      cellTypes:  {<type>: {childCellType, childCellNumber, isNodeLevel}}
      physicalCells: [{cellType, cellAddress, pinnedCellId, cellChildren: [...]}]
    virtualClusters:
      <vc>: {virtualCells: [{cellType: "A.B", cellNumber: 2}], pinnedCells: [{pinnedCellId}]}

A leaf cell type is a `childCellType` that is not itself a key of `cellTypes`; it
must be a sku. Without any `skuTypes` section (HiveD's older format) every leaf type
becomes a sku of one GPU with cpu and memory not accounted.

Every problem found is reported at once, each naming its path.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from libs.common.ids import NAME_PATTERN
from services.scheduler.cluster.model import (
    CellType,
    ClusterConfig,
    ClusterConfigError,
    PhysicalCell,
    SkuType,
    VirtualCell,
    VirtualCluster,
)
from services.scheduler.cluster.quantities import parse_memory_mb
from services.scheduler.core.buddy import shortfall

_PC = "physicalCluster"


def load_cluster_config(data: dict | str | Path) -> ClusterConfig:
    """Parse and validate a cluster config; raises ClusterConfigError listing every problem."""
    raw = _read(data)
    errors: list[str] = []
    if not isinstance(raw, dict):
        raise ClusterConfigError(["$: a cluster config must be a mapping with physicalCluster and virtualClusters"])
    physical = raw.get("physicalCluster")
    if not isinstance(physical, dict):
        raise ClusterConfigError([f"{_PC}: required mapping is missing"])
    skus = _sku_types(physical.get("skuTypes"), errors)
    cell_types = _cell_types(physical.get("cellTypes"), skus, errors)
    cells = _physical_cells(physical.get("physicalCells"), cell_types, skus, errors)
    vcs = _virtual_clusters(raw.get("virtualClusters"), cell_types, cells, errors)
    if not errors:
        _check_capacity(cell_types, cells, vcs, errors)
    if errors:
        raise ClusterConfigError(errors)
    return ClusterConfig(skuTypes=skus, cellTypes=cell_types, physicalCells=cells, virtualClusters=vcs)


def _read(data: dict | str | Path) -> Any:
    if isinstance(data, dict):
        return data
    if isinstance(data, str) and "\n" not in data and data.endswith((".yaml", ".yml")) and Path(data).is_file():
        data = Path(data)
    if isinstance(data, Path):
        try:
            text = data.read_text()
        except OSError as exc:
            raise ClusterConfigError([f"$: cannot read {data}: {exc.strerror}"]) from exc
    else:
        text = data
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterConfigError([f"$: not valid YAML: {exc}"]) from exc


# --- skus and cell types ---------------------------------------------------------


def _whole_number(value: Any, path: str, errors: list[str], *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        errors.append(f"{path}: must be a whole number >= {minimum}, got {value!r}")
        return minimum
    return value


def _sku_types(raw: Any, errors: list[str]) -> dict[str, SkuType]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append(f"{_PC}.skuTypes: must be a mapping of sku name to {{gpu, cpu, memory}}")
        return {}
    skus: dict[str, SkuType] = {}
    for name, spec in raw.items():
        path = f"{_PC}.skuTypes.{name}"
        if not isinstance(spec, dict):
            errors.append(f"{path}: must be a mapping with gpu, cpu and memory")
            continue
        for key in spec:
            if key not in ("gpu", "cpu", "memory"):
                errors.append(f"{path}.{key}: unknown key (expected gpu, cpu, memory)")
        gpu = _whole_number(spec.get("gpu", 0), f"{path}.gpu", errors, minimum=0)
        cpu = _whole_number(spec.get("cpu", 0), f"{path}.cpu", errors, minimum=0)
        try:
            memory = parse_memory_mb(spec.get("memory", 0))
        except ValueError as exc:
            errors.append(f"{path}.memory: {exc}")
            memory = 0
        if gpu == 0 and cpu == 0 and memory == 0:
            errors.append(f"{path}: a sku must offer at least one of gpu, cpu, memory")
        skus[str(name)] = SkuType(name=str(name), gpu=gpu, cpu=cpu, memoryMB=memory)
    return skus


def _cell_types(raw: Any, skus: dict[str, SkuType], errors: list[str]) -> dict[str, CellType]:
    if not isinstance(raw, dict) or not raw:
        errors.append(f"{_PC}.cellTypes: required mapping of cell type name to its children is missing")
        return {}
    specs: dict[str, tuple[str, int, bool]] = {}
    for name, spec in raw.items():
        name = str(name)
        path = f"{_PC}.cellTypes.{name}"
        if not isinstance(spec, dict):
            errors.append(f"{path}: must be a mapping with childCellType and childCellNumber")
            continue
        for key in spec:
            if key not in ("childCellType", "childCellNumber", "isNodeLevel"):
                errors.append(f"{path}.{key}: unknown key (expected childCellType, childCellNumber, isNodeLevel)")
        child = spec.get("childCellType")
        if not isinstance(child, str) or not child:
            errors.append(f"{path}.childCellType: required, the name of a cell type or sku")
            continue
        number = _whole_number(spec.get("childCellNumber"), f"{path}.childCellNumber", errors, minimum=1)
        node_level = spec.get("isNodeLevel", False)
        if not isinstance(node_level, bool):
            errors.append(f"{path}.isNodeLevel: must be true or false, got {node_level!r}")
            node_level = False
        if name in skus:
            errors.append(f"{path}: {name!r} is both a cell type and a sku type")
        specs[name] = (child, number, node_level)

    leaf_types = {child for child, _, _ in specs.values() if child not in specs}
    for name, (child, _, _) in specs.items():
        if child in leaf_types and skus and child not in skus:
            errors.append(
                f"{_PC}.cellTypes.{name}.childCellType: unknown sku {child!r} "
                f"(neither a cell type nor one of skuTypes: {', '.join(sorted(skus))})"
            )
    if not skus:
        for leaf in sorted(leaf_types):
            skus[leaf] = SkuType(name=leaf, gpu=1)

    result: dict[str, CellType] = {}
    for sku in skus.values():
        result[sku.name] = CellType(name=sku.name, skuType=sku.name)
    cyclic: set[str] = set()
    for name in specs:
        trail = [name]
        current = specs[name][0]
        while current in specs:
            if current in trail:
                cycle = trail[trail.index(current):] + [current]
                if current not in cyclic:
                    errors.append(f"{_PC}.cellTypes.{current}: cycle in cell types: {' -> '.join(cycle)}")
                    cyclic.update(cycle)
                break
            trail.append(current)
            current = specs[current][0]
        else:
            continue
        cyclic.add(name)

    def build(name: str) -> CellType | None:
        if name in result:
            return result[name]
        if name in cyclic or name not in specs:
            return None
        child, number, node_level = specs[name]
        child_type = build(child)
        if child_type is None:
            return None
        cell_type = CellType(
            name=name,
            childCellType=child,
            childCellNumber=number,
            isNodeLevel=node_level,
            level=child_type.level + 1,
            leafCellNumber=number * child_type.leafCellNumber,
            skuType=child_type.skuType,
        )
        result[name] = cell_type
        return cell_type

    for name in specs:
        build(name)
    return result


def _node_levels(cell_types: dict[str, CellType], name: str) -> list[str]:
    found = []
    current: str | None = name
    while current is not None:
        if cell_types[current].isNodeLevel:
            found.append(current)
        current = cell_types[current].childCellType
    return found


# --- physical cells ----------------------------------------------------------------


class _CellBuilder:
    """Expands the physical cell specs into complete trees with addresses."""

    def __init__(self, cell_types: dict[str, CellType], skus: dict[str, SkuType], errors: list[str]):
        self.cell_types = cell_types
        self.skus = skus
        self.errors = errors
        self.addresses: dict[str, str] = {}  # address -> path where first seen
        self.node_skus: dict[tuple[str, str], str] = {}  # (node, sku) -> path
        self.pinned: dict[str, str] = {}  # pinnedCellId -> path

    def top(self, spec: Any, index: int) -> PhysicalCell | None:
        path = f"{_PC}.physicalCells[{index}]"
        if not isinstance(spec, dict):
            self.errors.append(f"{path}: must be a mapping with cellType")
            return None
        type_name = spec.get("cellType")
        if type_name not in self.cell_types:
            self.errors.append(f"{path}.cellType: unknown cell type {type_name!r}")
            return None
        node_levels = _node_levels(self.cell_types, type_name)
        if len(node_levels) != 1:
            problem = "has no node-level cell type (isNodeLevel: true)" if not node_levels else (
                f"has several node-level cell types ({', '.join(node_levels)})")
            self.errors.append(f"{path}.cellType: the hierarchy of {type_name!r} {problem}")
            return None
        local = spec.get("cellAddress")
        return self.cell(spec, path, type_name, local=str(index) if local is None else str(local),
                         parent_address="", node=None, index_path=[index], leaf_counter=None)

    def cell(self, spec: dict, path: str, type_name: str, *, local: str, parent_address: str,
             node: str | None, index_path: list[int], leaf_counter: list[int] | None) -> PhysicalCell | None:
        cell_type = self.cell_types[type_name]
        for key in spec:
            if key not in ("cellType", "cellAddress", "pinnedCellId", "cellChildren"):
                self.errors.append(f"{path}.{key}: unknown key (expected cellType, cellAddress, pinnedCellId, cellChildren)")
        if "cellType" in spec and spec["cellType"] != type_name:
            self.errors.append(f"{path}.cellType: is {spec['cellType']!r} but the parent's childCellType is {type_name!r}")
        explicit = spec.get("cellAddress")
        index: int | None = None
        if cell_type.isNodeLevel:
            node = str(explicit) if explicit is not None else f"{type_name}-{'-'.join(map(str, index_path))}"
            address = node
            key = (node, cell_type.skuType)
            if key in self.node_skus:
                self.errors.append(f"{path}.cellAddress: duplicate cell address {node!r} (also at {self.node_skus[key]})")
            else:
                self.node_skus[key] = path
            leaf_counter = [0]
        elif cell_type.is_leaf:
            assert node is not None and leaf_counter is not None
            position = leaf_counter[0]
            leaf_counter[0] += 1
            sku = self.skus[cell_type.skuType]
            if explicit is None:
                index = position
            elif isinstance(explicit, int) and not isinstance(explicit, bool) and explicit >= 0:
                index = explicit
            elif isinstance(explicit, str) and explicit.isdigit():
                index = int(explicit)
            elif sku.gpu > 0:
                self.errors.append(f"{path}.cellAddress: {explicit!r} is not a GPU index (a whole number >= 0)")
                return None
            address = f"{node}/{explicit if index is None else index}"
        elif node is not None:
            address = f"{parent_address}/{type_name}.{local if explicit is None else explicit}"
        else:
            address = local if not parent_address else f"{parent_address}/{local if explicit is None else explicit}"
        if not cell_type.isNodeLevel:
            if address in self.addresses:
                self.errors.append(f"{path}.cellAddress: duplicate cell address {address!r} (also at {self.addresses[address]})")
            else:
                self.addresses[address] = path

        pinned = spec.get("pinnedCellId")
        if pinned is not None:
            pinned = str(pinned)
            if pinned in self.pinned:
                self.errors.append(f"{path}.pinnedCellId: duplicate pinnedCellId {pinned!r} (also at {self.pinned[pinned]})")
            else:
                self.pinned[pinned] = path

        children: list[PhysicalCell] = []
        if not cell_type.is_leaf:
            raw_children = spec.get("cellChildren") or []
            if not isinstance(raw_children, list):
                self.errors.append(f"{path}.cellChildren: must be a list of cells")
                raw_children = []
            if len(raw_children) > cell_type.childCellNumber:
                self.errors.append(
                    f"{path}.cellChildren: {len(raw_children)} children but cell type {type_name!r} "
                    f"has childCellNumber {cell_type.childCellNumber}")
                raw_children = raw_children[: cell_type.childCellNumber]
            for position in range(cell_type.childCellNumber):
                child_spec = raw_children[position] if position < len(raw_children) else None
                child_spec = child_spec if child_spec is not None else {}
                child_path = f"{path}.cellChildren[{position}]"
                if not isinstance(child_spec, dict):
                    self.errors.append(f"{child_path}: must be a mapping")
                    continue
                child = self.cell(child_spec, child_path, cell_type.childCellType, local=str(position),
                                  parent_address=address, node=node, index_path=index_path + [position],
                                  leaf_counter=leaf_counter)
                if child is not None:
                    children.append(child)
        return PhysicalCell(cellType=type_name, address=address, node=node, index=index,
                            pinnedCellId=pinned, children=children)


def _physical_cells(raw: Any, cell_types: dict[str, CellType], skus: dict[str, SkuType],
                    errors: list[str]) -> list[PhysicalCell]:
    if not isinstance(raw, list):
        errors.append(f"{_PC}.physicalCells: required list of cells is missing")
        return []
    if not cell_types:
        return []
    builder = _CellBuilder(cell_types, skus, errors)
    cells = [builder.top(spec, index) for index, spec in enumerate(raw)]
    built = [cell for cell in cells if cell is not None]
    # A node holding several skus gets one node-level cell per sku; tell them apart.
    per_node = Counter(node for node, _ in builder.node_skus)
    if any(count > 1 for count in per_node.values()):
        built = [_suffix_shared_nodes(cell, per_node, cell_types) for cell in built]
    return built


def _suffix_shared_nodes(cell: PhysicalCell, per_node: Counter, cell_types: dict[str, CellType]) -> PhysicalCell:
    if cell_types[cell.cellType].isNodeLevel and per_node[cell.node] > 1:
        return msgspec_replace(cell, address=f"{cell.node}[{cell_types[cell.cellType].skuType}]")
    if cell.node is not None:
        return cell
    return msgspec_replace(cell, children=[_suffix_shared_nodes(c, per_node, cell_types) for c in cell.children])


def msgspec_replace(cell: PhysicalCell, **changes: Any) -> PhysicalCell:
    import msgspec

    return msgspec.structs.replace(cell, **changes)


def iter_cells(cell: PhysicalCell):
    yield cell
    for child in cell.children:
        yield from iter_cells(child)


# --- virtual clusters ----------------------------------------------------------------


def _virtual_clusters(raw: Any, cell_types: dict[str, CellType], cells: list[PhysicalCell],
                      errors: list[str]) -> dict[str, VirtualCluster]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append("virtualClusters: must be a mapping of VC name to {virtualCells, pinnedCells}")
        return {}
    chains = {cell.cellType for cell in cells}
    pinned_ids = {c.pinnedCellId for top in cells for c in iter_cells(top) if c.pinnedCellId is not None}
    pinned_owner: dict[str, str] = {}
    result: dict[str, VirtualCluster] = {}
    for name, spec in raw.items():
        name = str(name)
        path = f"virtualClusters.{name}"
        if not NAME_PATTERN.match(name):
            errors.append(f"{path}: VC name {name!r} may only use letters, digits, '_' and '-'")
        spec = spec or {}
        if not isinstance(spec, dict):
            errors.append(f"{path}: must be a mapping with virtualCells and/or pinnedCells")
            continue
        for key in spec:
            if key not in ("virtualCells", "pinnedCells"):
                errors.append(f"{path}.{key}: unknown key (expected virtualCells, pinnedCells)")
        virtual_cells = []
        for index, cell_spec in enumerate(spec.get("virtualCells") or []):
            cell = _virtual_cell(cell_spec, f"{path}.virtualCells[{index}]", cell_types, chains, errors)
            if cell is not None:
                virtual_cells.append(cell)
        pinned = []
        for index, pin_spec in enumerate(spec.get("pinnedCells") or []):
            pin_path = f"{path}.pinnedCells[{index}].pinnedCellId"
            pin = pin_spec.get("pinnedCellId") if isinstance(pin_spec, dict) else None
            if pin is None:
                errors.append(f"{pin_path}: required")
                continue
            pin = str(pin)
            if pin not in pinned_ids:
                errors.append(f"{pin_path}: unknown pinned cell {pin!r} (no physical cell has this pinnedCellId)")
            elif pin in pinned_owner:
                errors.append(f"{pin_path}: pinned cell {pin!r} is already given to VC {pinned_owner[pin]}")
            else:
                pinned_owner[pin] = name
                pinned.append(pin)
        result[name] = VirtualCluster(name=name, virtualCells=virtual_cells, pinnedCells=pinned)
    return result


def _virtual_cell(spec: Any, path: str, cell_types: dict[str, CellType], chains: set[str],
                  errors: list[str]) -> VirtualCell | None:
    if not isinstance(spec, dict):
        errors.append(f"{path}: must be a mapping with cellType and cellNumber")
        return None
    type_path = spec.get("cellType")
    if not isinstance(type_path, str) or not type_path:
        errors.append(f"{path}.cellType: required, a cell type path like 'RACK.NODE'")
        return None
    number = _whole_number(spec.get("cellNumber"), f"{path}.cellNumber", errors, minimum=0)
    parts = type_path.split(".")
    for part in parts:
        if part not in cell_types:
            errors.append(f"{path}.cellType: unknown cell type {part!r} in {type_path!r}")
            return None
    if parts[0] not in chains:
        errors.append(
            f"{path}.cellType: no physical cell has type {parts[0]!r}; a path starts at a cellType used in "
            f"physicalCells ({', '.join(sorted(chains)) or 'none'})")
        return None
    for parent, child in zip(parts, parts[1:], strict=False):
        if cell_types[parent].childCellType != child:
            errors.append(f"{path}.cellType: {child!r} is not the child cell type of {parent!r} in {type_path!r}")
            return None
    return VirtualCell(chain=parts[0], cellType=parts[-1], cellNumber=number)


# --- capacity ----------------------------------------------------------------------------


def free_cells_per_type(cell: PhysicalCell, pinned: set[str]) -> Counter:
    """Cells left for buddy allocation once the VCs' pinned cells are taken out."""
    if cell.pinnedCellId in pinned:
        return Counter()
    if not any(c.pinnedCellId in pinned for c in iter_cells(cell)):
        return Counter({cell.cellType: 1})
    total: Counter = Counter()
    for child in cell.children:
        total += free_cells_per_type(child, pinned)
    return total


def _check_capacity(cell_types: dict[str, CellType], cells: list[PhysicalCell],
                    vcs: dict[str, VirtualCluster], errors: list[str]) -> None:
    pinned = {pin for vc in vcs.values() for pin in vc.pinnedCells}
    free: dict[str, Counter] = {}
    for top in cells:
        free.setdefault(top.cellType, Counter()).update(free_cells_per_type(top, pinned))
    demand: dict[str, Counter] = {}
    askers: dict[str, list[str]] = {}
    for vc in vcs.values():
        for cell in vc.virtualCells:
            demand.setdefault(cell.chain, Counter())[cell.cellType] += cell.cellNumber
            if cell.cellNumber:
                askers.setdefault(cell.chain, []).append(f"{vc.name}: {cell.cellNumber} x {cell.cellType}")
    for chain, wanted in demand.items():
        missing = shortfall(chain, cell_types, free.get(chain, Counter()), wanted)
        if missing:
            count, type_name = missing
            have = sum(1 for top in cells if top.cellType == chain)
            errors.append(
                f"virtualClusters: the VCs ask for more cells than exist in chain {chain!r}: "
                f"{'; '.join(askers[chain])} needs {count} more {type_name!r} cell(s) than the {have} "
                f"physical one(s) left after pinned cells")


# --- the one-machine default ----------------------------------------------------------------


def local_cluster_config(*, node: str = "local", gpus: int, cpus: int, memory_mb: int, nodes: int = 1,
                         cpu_oversubscription: int = 1) -> ClusterConfig:
    """The cluster of `pai up`: `nodes` identical nodes with these resources each, one VC "default".

    With GPUs, each GPU is a leaf cell of sku "gpu" carrying its share of cpu and
    memory; without, CPU cells of sku "cpu": `cpu_oversubscription` cells per core,
    each offering 1 CPU and a core's share of memory, so a core runs that many
    one-CPU tasks side by side (most example jobs mostly wait or print; a
    cluster file keeps exact cells). Several nodes are named `<node>-0`, `<node>-1`, ...
    """
    if nodes < 1:
        raise ValueError("nodes must be >= 1")
    if gpus < 0 or cpus < 0 or memory_mb < 0:
        raise ValueError("gpus, cpus and memory_mb must be >= 0")
    if cpu_oversubscription < 1:
        raise ValueError("cpu_oversubscription must be >= 1")
    if gpus > 0:
        sku = {"gpu": {"gpu": 1, "cpu": cpus // gpus, "memory": f"{memory_mb // gpus}Mi"}}
        leaf, per_node = "gpu", gpus
    elif cpus > 0:
        sku = {"cpu": {"gpu": 0, "cpu": 1, "memory": f"{memory_mb // cpus}Mi"}}
        leaf, per_node = "cpu", cpus * cpu_oversubscription
    else:
        raise ValueError("a node needs at least one GPU or one CPU")
    node_type = f"{leaf}-node"
    cell_types: dict[str, Any] = {node_type: {"childCellType": leaf, "childCellNumber": per_node, "isNodeLevel": True}}
    names = [node] if nodes == 1 else [f"{node}-{i}" for i in range(nodes)]
    if nodes == 1:
        physical = [{"cellType": node_type, "cellAddress": node}]
        top = node_type
    else:
        top = f"{leaf}-nodes"
        cell_types[top] = {"childCellType": node_type, "childCellNumber": nodes}
        physical = [{"cellType": top, "cellChildren": [{"cellAddress": name} for name in names]}]
    return load_cluster_config({
        "physicalCluster": {"skuTypes": sku, "cellTypes": cell_types, "physicalCells": physical},
        "virtualClusters": {"default": {"virtualCells": [{"cellType": top, "cellNumber": 1}]}},
    })
