"""Mutable cluster state: VC quotas and bound cells, and every change to a leaf.

All changes to who holds a leaf go through `ClusterState`, which keeps the
counters, the per-unit `held` counts and the VC bindings consistent: a VC cell
(unit) is bound lazily when the VC's guaranteed work first needs it and given
back to the buddy free lists as soon as none of that work holds it any more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core.buddy import shortfall
from services.scheduler.core.cells import FREE, INSIDE, TAKEN, Cell, CellTree, Chain, Node, refresh_leaf
from services.scheduler.core.jobs import JobRecord


class Quota:
    """`total` cells of one type in one chain promised to a VC; `bound` are the physical cells taken so far."""

    __slots__ = ("chain", "type", "total", "bound", "leaf_count", "inside_node", "nodes_per_cell", "leaves_per_node")

    def __init__(self, chain: Chain, type_name: str, total: int, leaf_count: int, inside_node: bool):
        self.chain = chain
        self.type = type_name
        self.total = total
        self.bound: dict[Cell, None] = {}
        self.leaf_count = leaf_count
        self.inside_node = inside_node  # below the node level: a task cannot span two such cells
        self.nodes_per_cell = 1
        self.leaves_per_node = leaf_count

    def tasks_per_cell(self, size: int) -> int:
        """How many tasks of `size` leaf cells one empty cell of this quota hosts."""
        return self.nodes_per_cell * (self.leaves_per_node // size)

    @property
    def unbound(self) -> int:
        return self.total - len(self.bound)


class VcRecord:
    __slots__ = ("name", "quotas", "pinned", "sku_quotas", "sku_guaranteed", "sku_virtual", "units", "held")

    def __init__(self, name: str):
        self.name = name
        self.quotas: dict[tuple[str, str], Quota] = {}
        self.pinned: dict[str, Cell] = {}
        self.sku_quotas: dict[str, list[Quota]] = {}  # smallest cells first
        self.sku_guaranteed: dict[str, int] = {}  # leaf cells promised per sku, pinned cells included
        self.sku_virtual: dict[str, int] = {}  # the same without pinned cells (what unpinned jobs may use)
        self.units: dict[str, dict[Cell, None]] = {}  # sku -> bound (not pinned) cells
        self.held: dict[str, int] = {}  # sku -> leaves of its bound (not pinned) cells its guaranteed work holds

    def may_bind(self, sku: str) -> bool:
        """Whether the VC may still bind more cells of this sku (cells no VC holds can help it)."""
        return any(quota.unbound > 0 for quota in self.sku_quotas.get(sku, ()))

    @property
    def skus(self) -> list[str]:
        """Skus unpinned guaranteed jobs of the VC may use."""
        return list(self.sku_virtual)


def _holds(leaf: Cell) -> bool:
    """Whether a leaf keeps its unit bound: guaranteed work of the unit's VC runs or is reserved there."""
    unit = leaf.unit
    if unit is None:
        return False
    job = leaf.job
    if job is not None and not job.opportunistic and job.vc == unit.vc:
        return True
    job = leaf.reserved_for
    return job is not None and not job.opportunistic and job.vc == unit.vc


class ClusterState:
    """The cells, the VCs' bindings and when cells last became more usable.

    The pass number (`epoch`) and the freed-cell marks change only through the methods here
    (note_freed, next_epoch, take_freed, note_reserve_shrank, note_room_in_unit); the core and
    the planners read them.
    """

    def __init__(self, config: ClusterConfig, *, bind_anywhere: bool = False):
        self.config = config
        self.tree = CellTree(config)
        self.vcs: dict[str, VcRecord] = {}
        for vc_spec in config.virtualClusters.values():
            vc = self.vcs[vc_spec.name] = VcRecord(vc_spec.name)
            for virtual in vc_spec.virtualCells:
                if virtual.cellNumber == 0:
                    continue
                key = (virtual.chain, virtual.cellType)
                quota = vc.quotas.get(key)
                if quota is None:
                    cell_type = config.cellTypes[virtual.cellType]
                    chain = self.tree.chains[virtual.chain]
                    node_level = next(t for t in chain.types if config.cellTypes[t].isNodeLevel)
                    inside_node = chain.types.index(virtual.cellType) > chain.types.index(node_level)
                    quota = vc.quotas[key] = Quota(chain, virtual.cellType, 0, cell_type.leafCellNumber, inside_node)
                    if not inside_node:
                        quota.leaves_per_node = config.cellTypes[node_level].leafCellNumber
                        quota.nodes_per_cell = cell_type.leafCellNumber // quota.leaves_per_node
                quota.total += virtual.cellNumber
            for quota in vc.quotas.values():  # skus in the order the VC lists them
                vc.sku_virtual.setdefault(quota.chain.sku, 0)
                vc.sku_guaranteed.setdefault(quota.chain.sku, 0)
            for quota in sorted(vc.quotas.values(), key=lambda q: (q.leaf_count, q.chain.name)):
                sku = quota.chain.sku
                vc.sku_quotas.setdefault(sku, []).append(quota)
                vc.sku_guaranteed[sku] = vc.sku_guaranteed.get(sku, 0) + quota.total * quota.leaf_count
                vc.sku_virtual[sku] = vc.sku_virtual.get(sku, 0) + quota.total * quota.leaf_count
                vc.units.setdefault(sku, {})
            for pin in vc_spec.pinnedCells:
                cell = self.tree.pinned[pin]
                vc.pinned[pin] = cell
                self.tree.chains[cell.chain].take(cell)
                self._mark_bound(cell, vc.name, None)
                vc.sku_guaranteed[cell.sku] = vc.sku_guaranteed.get(cell.sku, 0) + cell.leaf_count
        for chain in self.tree.chains.values():
            # Types at least as big as every VC cell of the chain: cutting one out of a free bigger cell
            # takes nothing a VC's quota could need (those bigger cells are no VC's cell type).
            biggest = min((chain.types.index(quota.type) for vc in self.vcs.values() for quota in vc.quotas.values()
                           if quota.chain is chain), default=len(chain.types) - 1)
            chain.split_freely = set(chain.types[:biggest + 1])
        # Binding may cut a cell out of any free bigger cell (see Chain.bindable), not only out of the
        # smallest bigger one when no free cell of its type is left (SchedulingPolicy.bind_anywhere).
        self.bind_anywhere = bind_anywhere
        # When cells last became more usable, by scheduling pass number (`epoch`): a job
        # that failed in a later pass cannot fit now unless cells it may use were freed since.
        self._epoch = 0
        self._freed_anywhere: dict[str, int] = {}  # sku -> epoch (what opportunistic jobs may use)
        self._freed_unbound: dict[str, int] = {}  # sku -> epoch (cells no VC holds: what binding may take)
        self._freed_in_vc: dict[tuple[str, str], int] = {}  # (vc, sku) -> epoch (inside the VC's cells)
        self.unhealthy_leaves: dict[str, int] = {}  # sku -> leaves on unhealthy nodes
        # What was freed since the last pass, coarsely, to know which queues to look at:
        # ("vc", vc, sku), ("unbound", sku), ("any", sku).
        self._freed_since_pass: set[tuple[str, ...]] = set()
        # While set, every unbinding is recorded here, so a tentative change can be undone exactly.
        self._unbind_log: list[tuple[VcRecord, Quota, Cell]] | None = None

    # --- passes and freed cells -----------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current scheduling pass's number."""
        return self._epoch

    @property
    def freed_anywhere(self) -> Mapping[str, int]:
        return self._freed_anywhere

    @property
    def freed_unbound(self) -> Mapping[str, int]:
        return self._freed_unbound

    @property
    def freed_in_vc(self) -> Mapping[tuple[str, str], int]:
        return self._freed_in_vc

    def next_epoch(self) -> int:
        """A new pass (or the shape fallback's second walk of one) begins: its number."""
        self._epoch += 1
        return self._epoch

    def take_freed(self) -> set[tuple[str, ...]]:
        """What was freed since the last pass, coarsely, to know which queues to look at (and forget it):
        ("vc", vc, sku), ("unbound", sku), ("any", sku)."""
        freed, self._freed_since_pass = self._freed_since_pass, set()
        return freed

    def note_reserve_shrank(self, sku: str) -> None:
        """The adaptive reserve gives back idle cells of the sku: for opportunistic work as if freed."""
        self._freed_anywhere[sku] = self._epoch

    def note_room_in_unit(self, unit: Cell) -> None:
        """A VC keeps a newly bound cell with room left in it: for its other jobs as if cells were freed
        in the VC."""
        assert unit.vc is not None  # a unit is a cell bound to a VC
        self._freed_in_vc[(unit.vc, unit.sku)] = self._epoch

    @contextmanager
    def unbinds_recorded(self) -> Iterator[list[tuple[VcRecord, Quota, Cell]]]:
        """Record every unbinding while inside, so a tentative change can be undone exactly."""
        log: list[tuple[VcRecord, Quota, Cell]] = []
        self._unbind_log = log
        try:
            yield log
        finally:
            self._unbind_log = None

    def note_freed(self, leaf: Cell) -> None:
        epoch = self._epoch
        sku = leaf.sku
        self._freed_anywhere[sku] = epoch
        self._freed_since_pass.add(("any", sku))
        unit = leaf.unit
        if unit is None:
            self._freed_unbound[sku] = epoch
            self._freed_since_pass.add(("unbound", sku))
        else:
            vc = unit.vc
            assert vc is not None  # a unit is a cell bound to a VC
            self._freed_in_vc[(vc, sku)] = epoch
            self._freed_since_pass.add(("vc", vc, sku))

    def refresh(self, leaf: Cell) -> None:
        if refresh_leaf(leaf):
            self.note_freed(leaf)

    def set_node_health(self, node: Node, healthy: bool, reason: str) -> None:
        node.healthy = healthy
        node.reason = reason
        for cell in node.cells:
            change = cell.leaf_count if not healthy else -cell.leaf_count
            self.unhealthy_leaves[cell.sku] = self.unhealthy_leaves.get(cell.sku, 0) + change
            for leaf in cell.leaves:
                if refresh_leaf(leaf) or healthy:
                    # A node back: its leaves held by guaranteed work may be taken again by a job of higher
                    # priority of that VC, though no leaf is freed. For jobs that failed while it was down
                    # that is as if cells were freed (they are tried again).
                    self.note_freed(leaf)

    # --- binding ------------------------------------------------------------------------

    def _mark_bound(self, cell: Cell, vc: str, quota_key: tuple[str, str] | None) -> None:
        cell.chain_obj.unbound_free -= cell.free
        cell.chain_obj.unbound_oppo -= cell.oppo
        cell.vc = vc
        cell.quota_key = quota_key
        cell.held = 0
        for leaf in cell.leaves:
            leaf.unit = cell
            if _holds(leaf):
                self._add_held(cell, 1)

    def _add_held(self, unit: Cell, delta: int) -> None:
        unit.held += delta
        if unit.quota_key is not None:
            vc = unit.vc
            assert vc is not None  # a cell counted against a quota is bound to the quota's VC
            held = self.vcs[vc].held
            held[unit.sku] = held.get(unit.sku, 0) + delta
            if delta < 0:
                # More of the VC's quota unused, even with no leaf freed (one on an unhealthy node): a job of
                # the VC may now fit its quota in count, so bind or fall back (SchedulerCore.shape_fallback).
                self._freed_in_vc[(vc, unit.sku)] = self._epoch
                self._freed_since_pass.add(("vc", vc, unit.sku))

    def bind(self, vc: VcRecord, quota: Quota, cell: Cell, *, taken: bool = False) -> None:
        """Bind a free (or already taken by a tentative plan) cell to the VC's quota."""
        assert quota.unbound > 0, f"VC {vc.name} has no unbound {quota.type} cell left"
        if not taken:
            quota.chain.take(cell)
        quota.bound[cell] = None
        vc.units[quota.chain.sku][cell] = None
        self._mark_bound(cell, vc.name, (quota.chain.name, quota.type))

    def unbind_if_idle(self, unit: Cell | None) -> None:
        if unit is None or unit.held > 0 or unit.quota_key is None or unit.buddy != TAKEN:
            return
        assert unit.vc is not None  # a cell counted against a quota is bound to the quota's VC
        vc = self.vcs[unit.vc]
        quota = vc.quotas[unit.quota_key]
        if self._unbind_log is not None:
            self._unbind_log.append((vc, quota, unit))
        self.release_unit(vc, quota, unit)
        self._freed_unbound[unit.sku] = self._epoch
        self._freed_anywhere[unit.sku] = self._epoch
        self._freed_since_pass.update({("unbound", unit.sku), ("any", unit.sku)})

    def release_unit(self, vc: VcRecord, quota: Quota, unit: Cell) -> None:
        """Give a VC cell back to the buddy free lists."""
        del quota.bound[unit]
        del vc.units[unit.sku][unit]
        for leaf in unit.leaves:
            leaf.unit = None
        unit.vc = None
        unit.quota_key = None
        unit.chain_obj.unbound_free += unit.free
        unit.chain_obj.unbound_oppo += unit.oppo
        quota.chain.give_back(unit)

    def bindable_cell_for(self, cell: Cell) -> bool:
        """Whether buddy allocation could take exactly this cell now."""
        current: Cell | None = cell
        while current is not None:
            if current.buddy == FREE:
                return True
            if current.buddy != INSIDE:
                return False
            current = current.parent
        return False

    def chain_is_safe(self, chain: Chain) -> bool:
        """Whether every VC's unbound quota in the chain can still be carved out of its free cells."""
        free = {t: len(cells) for t, cells in chain.free.items()}
        demand: dict[str, int] = {}
        for vc in self.vcs.values():
            for (chain_name, type_name), quota in vc.quotas.items():
                if chain_name == chain.name:
                    demand[type_name] = demand.get(type_name, 0) + quota.unbound
        return shortfall(chain.name, self.config.cellTypes, Counter(free), Counter(demand)) is None

    # --- leaves ---------------------------------------------------------------------------

    def set_leaf(self, leaf: Cell, *, job: JobRecord | None, reserved_for: JobRecord | None) -> None:
        unit = leaf.unit
        before = _holds(leaf)
        leaf.job = job
        leaf.reserved_for = reserved_for
        if unit is not None:
            change = _holds(leaf) - before
            if change:
                self._add_held(unit, change)
        self.refresh(leaf)

    def refresh_job_leaves(self, job: JobRecord, change: Callable[[], object]) -> None:
        """Apply `change()` (a change to the job's standing) and fix the counters of its leaves."""
        leaves = job.leaves() + [leaf for _, _, plan in job.reserved for leaves in plan for leaf in leaves]
        before = [_holds(leaf) for leaf in leaves]
        change()
        units = []
        for leaf, held in zip(leaves, before, strict=True):
            if leaf.unit is not None:
                delta = _holds(leaf) - held
                if delta:
                    self._add_held(leaf.unit, delta)
                units.append(leaf.unit)
            self.refresh(leaf)
        for unit in dict.fromkeys(units):
            self.unbind_if_idle(unit)
