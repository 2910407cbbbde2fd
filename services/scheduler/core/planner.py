"""Where a group of tasks can go: inside its VC's cells, or anywhere for opportunistic work.

A plan lists the leaves of each task and the VC cells it needs bound. Binding
during planning is real (so buddy splitting is exact) and is undone when the plan
is dropped: `Plan.abandon`.
"""

from __future__ import annotations

from services.scheduler.core.cells import Cell, Chain
from services.scheduler.core.search import View, capacity, fit_across, fit_group
from services.scheduler.core.state import ClusterState, Quota, VcRecord


class Plan:
    __slots__ = ("_free_lists", "leaves", "new_units")

    def __init__(self, leaves: list[list[Cell]], new_units: list[tuple[Quota, Cell]]):
        self.leaves = leaves  # per task, in the order of the sizes asked for
        self.new_units = new_units  # taken from the free lists, not yet bound to the VC
        self._free_lists: dict[Chain, dict[str, dict[Cell, None]]] = {}  # as they were before the first take

    def take(self, quota: Quota, cell: Cell) -> None:
        """Take a VC cell from the free lists for this plan (bound if the plan is committed)."""
        chain = quota.chain
        if chain not in self._free_lists:
            self._free_lists[chain] = {name: dict(cells) for name, cells in chain.free.items()}
        chain.take(cell)
        self.new_units.append((quota, cell))

    def abandon(self) -> None:
        for quota, cell in reversed(self.new_units):
            quota.chain.give_back(cell)
        self.new_units = []
        # Giving back merges buddies into a cell put at the end of its free list: the lists are put back
        # in their order too, so a plan tried and dropped leaves no trace. Otherwise a job failing would
        # change where (or whether) the next job of the same shape fits, and a job behind it could go
        # first only because the one ahead was tried.
        for chain, free_lists in self._free_lists.items():
            chain.free = free_lists
        self._free_lists = {}


def plan_opportunistic(state: ClusterState, sku: str, sizes: list[int], view: View, *,
                       unheld_only: bool = False, reserve: int = 0) -> Plan | None:
    """Idle cells, by the same best fit as guaranteed work: cells no VC holds first, then anywhere.

    A VC's next guaranteed job goes into the idle cells of the VC cells it already holds
    before binding any other, so work borrowed there is the first to be preempted; cells
    no VC holds are taken back only once a VC must bind a new cell and none is idle. With
    `unheld_only` the job waits rather than go where it would likely be preempted.
    """
    chains = state.tree.sku_chains.get(sku, ())
    total = sum(sizes)
    if sum(chain.unbound_free for chain in chains) >= total + reserve:
        unheld = [cell for chain in chains for type_name in chain.types for cell in chain.free[type_name]]
        leaves = fit_group(unheld, sizes, view)
        if leaves is None and len(sizes) > 1:
            leaves = fit_across([node for cell in unheld for node in _nodes_of(cell)], sizes, view)
        if leaves is not None:
            return Plan(leaves, [])
    if unheld_only:
        return None
    if reserve:
        # The reserve: the idle cells no VC holds stay out of reach, so only the holes of VCs' cells are
        # left (searched directly: excluding every idle leaf one by one cost more than the search).
        held = [cell for vc in state.vcs.values()
                for cell in (*vc.units.get(sku, ()), *(p for p in vc.pinned.values() if p.sku == sku))]
        leaves = fit_group(held, sizes, view)
        if leaves is None and len(sizes) > 1:
            leaves = fit_across([node for cell in held for node in _nodes_of(cell)], sizes, view)
        return Plan(leaves, []) if leaves is not None else None
    tops = [top for chain in chains for top in chain.tops]
    leaves = fit_group(tops, sizes, view)
    if leaves is None and len(sizes) > 1 and state.tree.sku_totals[sku].free >= sum(sizes):
        # Bigger than any one top-level cell: across them, in cell order so neighbours stay together.
        leaves = fit_across([node for top in tops for node in top.node_cells], sizes, view)
    return Plan(leaves, []) if leaves is not None else None


def plan_guaranteed(state: ClusterState, vc: VcRecord, sku: str, sizes: list[int],
                    view: View, *, bind: bool = True, pin: str | None = None) -> Plan | None:
    """Inside the VC's bound cells, binding more of its quota (buddy allocation) when needed and `bind`;
    with `pin`, inside that pinned cell of the VC alone."""
    if pin is not None:
        pinned = vc.pinned.get(pin)
        if pinned is None or pinned.sku != sku:
            return None
        leaves = fit_group([pinned], sizes, view)
        return Plan(leaves, []) if leaves is not None else None
    units = vc.units.get(sku, {})
    leaves = fit_group(list(units), sizes, view)
    if leaves is not None:
        return Plan(leaves, [])
    total = sum(sizes)
    quotas = [quota for quota in vc.sku_quotas.get(sku, ()) if quota.unbound > 0] if bind else []
    if not quotas:
        return _plan_across(list(units), [], sizes, view)
    # One more VC cell: the bindable one with the most usable leaves (fewest to preempt).
    for quota in quotas:
        if quota.leaf_count < total:
            continue
        chain = quota.chain
        if view.unbound_usable(chain) < total:
            continue  # not enough usable leaves outside the VCs' cells in the whole chain
        candidates = []
        for cell in quota.chain.bindable(quota.type, anywhere=state.bind_anywhere):
            usable = view.avail(cell)
            if usable >= total:
                candidates.append((-usable, cell.order, cell))
                if usable == cell.leaf_count:
                    break
        candidates.sort(key=lambda c: c[:2])
        for _, _, cell in candidates[:8]:
            leaves = fit_group([cell], sizes, view)
            if leaves is not None:
                plan = Plan(leaves, [])
                plan.take(quota, cell)
                return plan
    return _plan_across(list(units), quotas, sizes, view, anywhere=state.bind_anywhere)


def _plan_across(units: list[Cell], quotas: list[Quota], sizes: list[int], view: View, *,
                 anywhere: bool = False) -> Plan | None:
    """A group bigger than one VC cell: across bound cells, binding more one at a time."""
    if len(sizes) == 1:
        return None  # one task lives on one node, so in one VC cell: already tried
    smallest = sizes[-1]
    needed = len(sizes)
    roots = [unit for unit in units if view.avail(unit) >= smallest]
    room = sum(capacity(_nodes_of(root), smallest, view) for root in roots)
    if room + _bindable_room(quotas, smallest, view) < needed:
        return None  # not even with every cell the VC could still bind
    plan = Plan([], [])
    taken_per_quota: dict[int, int] = {}
    while True:
        if room >= needed:
            node_cells = [node for root in roots for node in _nodes_of(root)]
            leaves = fit_across(node_cells, sizes, view)
            if leaves is not None:
                plan.leaves = leaves
                return plan
        added = None
        for index, quota in enumerate(quotas):
            if quota.unbound - taken_per_quota.get(index, 0) <= 0:
                continue
            if quota.leaf_count < sizes[0] and quota.inside_node:
                continue  # a task lives on one node: a VC cell inside a node smaller than the task is no use
            best = None
            best_usable = 0
            for cell in quota.chain.bindable(quota.type, anywhere=anywhere):
                cell_usable = view.avail(cell)
                if cell_usable > best_usable:
                    best, best_usable = cell, cell_usable
                    if cell_usable == cell.leaf_count:
                        break
            if best is not None:
                plan.take(quota, best)
                taken_per_quota[index] = taken_per_quota.get(index, 0) + 1
                added = best
                break
        if added is None:
            plan.abandon()
            return None
        roots.append(added)
        room += capacity(_nodes_of(added), smallest, view)


def _nodes_of(cell: Cell) -> list[Cell]:
    return [cell] if cell.in_node else cell.node_cells


def _bindable_room(quotas: list[Quota], size: int, view: View) -> int:
    """At most how many tasks of `size` the VC's unbound quota could add (an upper bound, from counters)."""
    per_chain: dict[str, int] = {}
    chains = {}
    for quota in quotas:
        if quota.unbound > 0:
            per_chain[quota.chain.name] = per_chain.get(quota.chain.name, 0) + quota.unbound * quota.tasks_per_cell(size)
            chains[quota.chain.name] = quota.chain
    room = 0
    for name, most in per_chain.items():
        chain = chains[name]
        usable = view.unbound_usable(chain)
        room += min(most, usable // size)
    return room


def _cells_of_type(cell: Cell, type_name: str) -> list[Cell]:
    if cell.type == type_name:
        return [cell]
    found = []
    for child in cell.children:
        found.extend(_cells_of_type(child, type_name))
    return found
