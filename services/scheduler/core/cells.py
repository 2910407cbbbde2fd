"""The physical cells at run time: the tree, per-cell counters, and buddy free lists.

Counters are kept on every cell for the leaves below it, so a search can skip a
whole subtree in O(1):

- `free`: leaves on healthy nodes with no job and no reservation;
- `oppo`: leaves on healthy nodes held by opportunistic work that is not already
  being preempted (a guaranteed job may take them).

Buddy allocation (HiveD): each chain (a top-level cell type) keeps the cells not
bound to any VC in free lists per cell type. Binding a VC cell takes a free cell
of exactly that type; only when there is none is the smallest bigger free cell
split. Unbinding merges buddies back. With the capacity check done when the config
is loaded, this is what makes every VC's quota bindable at any time (VC safety).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from libs.common.ids import NodeName
from services.scheduler.cluster.model import ClusterConfig, PhysicalCell
from services.scheduler.core.buddy import host_ip

if TYPE_CHECKING:
    from services.scheduler.core.jobs import JobRecord

# Buddy states of a cell on the frontier of its chain; cells inside a free or a
# taken cell have state INSIDE.
INSIDE, FREE, SPLIT, TAKEN = 0, 1, 2, 3


class Node:
    __slots__ = ("name", "healthy", "reason", "cells", "host_ip")

    def __init__(self, name: NodeName):
        self.name = name
        self.healthy = True
        self.reason = ""
        self.cells: list[Cell] = []  # node-level cells (one per sku on the node)
        self.host_ip = host_ip(name)


class Cell:
    __slots__ = (
        "address", "type", "level", "chain", "sku", "parent", "children", "node", "gpus",
        "leaf_count", "is_node_level", "in_node", "pinned_id", "order", "leaves", "node_cells",
        "ancestors", "chain_obj",
        # dynamic state
        "free", "oppo", "buddy", "vc", "quota_key", "held", "job", "reserved_for", "unit",
    )

    def __init__(self, spec: PhysicalCell, *, level: int, chain: Chain, sku: str, parent: Cell | None,
                 node: Node | None, is_node_level: bool, gpus: tuple[int, ...], order: int):
        self.address = spec.address
        self.type = spec.cellType
        self.level = level
        self.chain = chain.name
        self.chain_obj = chain
        self.sku = sku
        self.parent = parent
        self.children: list[Cell] = []
        self.node = node
        self.gpus = gpus
        self.is_node_level = is_node_level
        self.in_node = node is not None  # at or below the node level
        self.pinned_id = spec.pinnedCellId
        self.order = order
        self.leaves: list[Cell] = []
        self.node_cells: list[Cell] = []
        self.leaf_count = 0
        # Self first, then up to the top: the cells whose counters a leaf feeds (and, last, its sku's totals).
        self.ancestors: tuple[Counted, ...] = (self,) if parent is None else (self,) + parent.ancestors
        self.free = 0
        self.oppo = 0
        self.buddy = INSIDE
        self.vc: str | None = None  # on a TAKEN cell: the VC it is bound or pinned to
        self.quota_key: tuple[str, str] | None = None  # (chain, type) of the VC quota it counts against
        self.held = 0  # on a TAKEN cell: leaves held (or reserved) by the VC's guaranteed jobs
        self.job: JobRecord | None = None  # on a leaf: the attempt running there
        self.reserved_for: JobRecord | None = None  # on a leaf: the attempt it is kept for
        self.unit: Cell | None = None  # on a leaf: the TAKEN cell it lies in, if any

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return f"Cell({self.address})"


class Chain:
    """All physical cells whose top-level type is `name`, and their buddy free lists."""

    def __init__(self, name: str, types: list[str], sku: str):
        self.name = name
        self.types = types  # top -> leaf
        self.sku = sku
        self.tops: list[Cell] = []
        # Leaves bound to no VC (what binding could still take): free ones, and ones of opportunistic work.
        self.unbound_free = 0
        self.unbound_oppo = 0
        # Ordered sets (dicts): insertion order keeps every choice deterministic.
        self.free: dict[str, dict[Cell, None]] = {t: {} for t in types}
        # Types no VC quota of this chain is bigger than (set by ClusterState): a cell of such a type
        # may be cut out of any free bigger cell without taking a cell some VC's quota will need.
        self.split_freely: set[str] = set()

    def bindable(self, type_name: str, *, anywhere: bool = False) -> Iterator[Cell]:
        """Cells of `type_name` that binding may take now, in buddy order.

        Free cells of that type first; only when there is none, cells inside the
        free cells of the smallest bigger type that has any. With `anywhere` (only
        for a type in `split_freely`), after the free cells of that type come the cells
        inside every free bigger cell, smallest bigger type first.
        """
        free_here = self.free[type_name]
        anywhere = anywhere and type_name in self.split_freely
        if free_here:
            yield from list(free_here)
            if not anywhere:
                return
        position = self.types.index(type_name)
        for bigger in reversed(self.types[:position]):
            free_bigger = self.free[bigger]
            if free_bigger:
                for cell in list(free_bigger):
                    yield from _descendants_of_type(cell, type_name)
                if not anywhere:
                    return

    def take(self, cell: Cell) -> None:
        """Remove `cell` from the free lists, splitting the free cell that holds it."""
        path = []
        current: Cell | None = cell
        while current is not None and current.buddy != FREE:
            if current.buddy != INSIDE:
                raise AssertionError(f"cell {cell.address} is not free to bind (state {current.buddy} at {current.address})")
            path.append(current)
            current = current.parent
        if current is None:
            raise AssertionError(f"cell {cell.address} is inside no free cell")
        del self.free[current.type][current]
        path.append(current)
        for outer, inner in zip(reversed(path), list(reversed(path))[1:], strict=False):  # each cell and the next
            outer.buddy = SPLIT
            for child in outer.children:
                if child is not inner:
                    child.buddy = FREE
                    self.free[child.type][child] = None
        cell.buddy = TAKEN

    def give_back(self, cell: Cell) -> None:
        """Return a taken cell to the free lists, merging buddies that are all free."""
        assert cell.buddy == TAKEN, cell
        cell.buddy = FREE
        self.free[cell.type][cell] = None
        parent = cell.parent
        while parent is not None and all(child.buddy == FREE for child in parent.children):
            for child in parent.children:
                del self.free[child.type][child]
                child.buddy = INSIDE
            parent.buddy = FREE
            self.free[parent.type][parent] = None
            parent = parent.parent


def _descendants_of_type(cell: Cell, type_name: str) -> Iterator[Cell]:
    if cell.type == type_name:
        yield cell
        return
    for child in cell.children:
        yield from _descendants_of_type(child, type_name)


class SkuTotals:
    """Counters over every leaf of one sku: the last entry of each cell's `ancestors`."""

    __slots__ = ("sku", "free", "oppo", "address")

    def __init__(self, sku: str):
        self.sku = sku
        self.free = 0
        self.oppo = 0
        self.address = f"all {sku} cells"


# What keeps counters over leaves: a cell, or every cell of a sku.
Counted = Cell | SkuTotals


class CellTree:
    """Every physical cell of a config, indexed for the scheduler."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.nodes: dict[str, Node] = {}
        self.chains: dict[str, Chain] = {}
        self.leaves_by_address: dict[str, Cell] = {}
        self.pinned: dict[str, Cell] = {}
        self.all_cells: list[Cell] = []
        self.sku_chains: dict[str, list[Chain]] = {}
        self.sku_leaves: dict[str, int] = {}
        self.sku_max_node_leaves: dict[str, int] = {}
        for top_spec in config.physicalCells:
            chain = self.chains.get(top_spec.cellType)
            if chain is None:
                types = []
                current: str | None = top_spec.cellType
                while current is not None:
                    types.append(current)
                    current = config.cellTypes[current].childCellType
                sku = config.cellTypes[top_spec.cellType].skuType
                chain = self.chains[top_spec.cellType] = Chain(top_spec.cellType, types, sku)
                self.sku_chains.setdefault(sku, []).append(chain)
            top = self._build(top_spec, chain, parent=None, node=None)
            top.buddy = FREE
            chain.tops.append(top)
            chain.free[top.type][top] = None
        self.sku_totals: dict[str, SkuTotals] = {}
        for cell in self.all_cells:
            totals = self.sku_totals.get(cell.sku)
            if totals is None:
                totals = self.sku_totals[cell.sku] = SkuTotals(cell.sku)
            cell.ancestors = cell.ancestors + (totals,)
            if cell.is_leaf:
                totals.free += 1
                self.sku_leaves[cell.sku] = self.sku_leaves.get(cell.sku, 0) + 1
            if cell.is_node_level:
                self.sku_max_node_leaves[cell.sku] = max(self.sku_max_node_leaves.get(cell.sku, 0), cell.leaf_count)

    def _build(self, spec: PhysicalCell, chain: Chain, *, parent: Cell | None, node: Node | None) -> Cell:
        cell_type = self.config.cellTypes[spec.cellType]
        if cell_type.isNodeLevel:
            name = spec.node
            assert name is not None, f"node-level cell {spec.address} names no node"  # the loader checks it
            node = self.nodes.get(name)
            if node is None:
                node = self.nodes[name] = Node(NodeName(name))
        gpus: tuple[int, ...] = ()
        sku = self.config.skuTypes[cell_type.skuType]
        if cell_type.is_leaf and sku.gpu > 0 and spec.index is not None:
            gpus = tuple(range(spec.index * sku.gpu, (spec.index + 1) * sku.gpu))
        cell = Cell(spec, level=cell_type.level, chain=chain, sku=cell_type.skuType, parent=parent, node=node,
                    is_node_level=cell_type.isNodeLevel, gpus=gpus, order=len(self.all_cells))
        self.all_cells.append(cell)
        if cell_type.isNodeLevel:
            assert node is not None
            node.cells.append(cell)
        if spec.pinnedCellId is not None:
            self.pinned[spec.pinnedCellId] = cell
        for child_spec in spec.children:
            cell.children.append(self._build(child_spec, chain, parent=cell, node=node))
        if cell.is_leaf:
            cell.leaves = [cell]
            cell.free = 1
            chain.unbound_free += 1
            self.leaves_by_address[cell.address] = cell
        else:
            cell.leaves = [leaf for child in cell.children for leaf in child.leaves]
            cell.free = sum(child.free for child in cell.children)
        cell.leaf_count = len(cell.leaves)
        if cell.is_node_level:
            cell.node_cells = [cell]
        elif not cell.in_node:
            cell.node_cells = [n for child in cell.children for n in child.node_cells]
        return cell


def node_of(cell: Cell) -> Node:
    """The node of a cell at or below the node level (a leaf's)."""
    node = cell.node
    assert node is not None, f"{cell.address} is above the node level"
    return node


def leaf_counts(leaf: Cell) -> tuple[int, int]:
    """What a leaf adds to the (free, oppo) counters of the cells above it."""
    node = leaf.node
    assert node is not None  # a leaf is on a node
    if not node.healthy:
        return 0, 0
    job = leaf.job
    if job is None:
        return (1 if leaf.reserved_for is None else 0), 0
    return 0, (1 if job.opportunistic and not job.preempting else 0)


def refresh_leaf(leaf: Cell) -> bool:
    """Recompute a leaf's counters after its job, reservation, job state or node health changed.

    Returns whether the leaf became more usable to others (freed, or its work became preemptible).
    """
    free, oppo = leaf_counts(leaf)
    delta_free = free - leaf.free
    delta_oppo = oppo - leaf.oppo
    if delta_free:
        for cell in leaf.ancestors:
            cell.free += delta_free
    if delta_oppo:
        for cell in leaf.ancestors:
            cell.oppo += delta_oppo
    if leaf.unit is None:
        chain = leaf.chain_obj
        chain.unbound_free += delta_free
        chain.unbound_oppo += delta_oppo
    return delta_free > 0 or (delta_oppo > 0 and delta_free >= 0)
