"""Finding leaf cells for a group of tasks: pure functions over the cell counters.

A `View` says which leaves a job may use in one attempt at placing it (free ones;
with `take_oppo` also those of opportunistic work; plus `extra` leaves such as those
of chosen victims or the job's own reservation; minus `excluded` ones) and records
the leaves tentatively taken so far, so several tasks can be fitted before anything
is committed.

Topology: a group goes into the lowest cell that can hold it, chosen by best fit
(the cell with the fewest usable leaves that is still enough), so two 1-GPU tasks
land on buddy GPUs and large cells stay whole for large jobs.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.core.cells import Cell, Chain, Counted, node_of


class View:
    __slots__ = ("take_oppo", "extra", "extra_leaves", "extra_unbound", "excluded", "taken", "taken_leaves", "log")

    def __init__(self, *, take_oppo: bool = False, extra_leaves: Iterable[Cell] = (), excluded: Iterable[Cell] = ()):
        self.take_oppo = take_oppo
        self.extra: dict[Counted, int] = {}
        self.extra_leaves: set[Cell] = set()
        self.extra_unbound: dict[str, int] = {}  # chain -> extra leaves bound to no VC (binding may take them)
        self.excluded: set[Cell] = set()
        self.taken: dict[Counted, int] = {}
        self.taken_leaves: set[Cell] = set()
        self.log: list[Cell] = []
        for leaf in extra_leaves:
            self.add_extra(leaf)
        for leaf in excluded:
            self.exclude(leaf)

    def base_ok(self, leaf: Cell) -> bool:
        return bool(leaf.free or (self.take_oppo and leaf.oppo))

    def add_extra(self, leaf: Cell) -> None:
        if leaf in self.extra_leaves or self.base_ok(leaf) or not node_of(leaf).healthy:
            return
        self.extra_leaves.add(leaf)
        if leaf.unit is None:
            self.extra_unbound[leaf.chain] = self.extra_unbound.get(leaf.chain, 0) + 1
        for cell in leaf.ancestors:
            self.extra[cell] = self.extra.get(cell, 0) + 1

    def exclude(self, leaf: Cell) -> None:
        if leaf in self.excluded or not self.base_ok(leaf):
            return
        self.excluded.add(leaf)
        for cell in leaf.ancestors:
            self.extra[cell] = self.extra.get(cell, 0) - 1

    def unbound_usable(self, chain: Chain) -> int:
        """Usable leaves of the chain bound to no VC: what binding one more VC cell may take."""
        usable = chain.unbound_free + (chain.unbound_oppo if self.take_oppo else 0)
        return usable + self.extra_unbound.get(chain.name, 0) if self.extra_unbound else usable

    def avail(self, cell: Cell) -> int:
        count = cell.free + cell.oppo if self.take_oppo else cell.free
        if self.extra:
            count += self.extra.get(cell, 0)
        if self.taken:
            count -= self.taken.get(cell, 0)
        return count

    def leaf_ok(self, leaf: Cell) -> bool:
        if leaf in self.taken_leaves or leaf in self.excluded:
            return False
        return self.base_ok(leaf) or leaf in self.extra_leaves

    def take(self, leaf: Cell) -> None:
        self.taken_leaves.add(leaf)
        self.log.append(leaf)
        taken = self.taken
        for cell in leaf.ancestors:
            taken[cell] = taken.get(cell, 0) + 1

    def mark(self) -> int:
        return len(self.log)

    def undo(self, mark: int) -> None:
        while len(self.log) > mark:
            leaf = self.log.pop()
            self.taken_leaves.discard(leaf)
            for cell in leaf.ancestors:
                self.taken[cell] -= 1


def take_in(cell: Cell, need: int, view: View) -> list[Cell] | None:
    """Take `need` usable leaves inside `cell` (all on its node), as close together as possible."""
    avail = view.avail
    if avail(cell) < need:
        return None
    # Descend to the smallest cell that still has enough (best fit keeps buddies together).
    children = cell.children
    while children:
        best = None
        best_avail = 0
        for child in children:
            child_avail = avail(child)
            if child_avail >= need and (best is None or child_avail < best_avail):
                best, best_avail = child, child_avail
        if best is None:
            break
        cell = best
        children = cell.children
    # No single child is enough (or a leaf is reached): its usable leaves in order are the closest.
    taken: list[Cell] = []
    leaf_ok = view.leaf_ok
    for leaf in cell.leaves:
        if leaf_ok(leaf):
            view.take(leaf)
            taken.append(leaf)
            if len(taken) == need:
                return taken
    return None


def capacity(node_cells: list[Cell], size: int, view: View) -> int:
    """How many tasks of `size` leaf cells these nodes could host at most."""
    avail = view.avail
    return sum(avail(node) // size for node in node_cells)


def fit_in(cell: Cell, sizes: list[int], view: View) -> list[list[Cell]] | None:
    """Leaves for each task (sizes in leaf cells, largest first) inside `cell`, or None (view unchanged)."""
    mark = view.mark()
    result: list[list[Cell]] = []
    if cell.in_node:
        for size in sizes:
            leaves = take_in(cell, size, view)
            if leaves is None:
                view.undo(mark)
                return None
            result.append(leaves)
        return result
    return fit_across(cell.node_cells, sizes, view, mark)


def fit_across(node_cells: list[Cell], sizes: list[int], view: View, mark: int | None = None) -> list[list[Cell]] | None:
    """Each task on one node among `node_cells`, best fit, or None (view unchanged)."""
    if mark is None:
        mark = view.mark()
    avail = view.avail
    result: list[list[Cell]] = []
    for size in sizes:
        best = None
        best_avail = 0
        for node_cell in node_cells:
            node_avail = avail(node_cell)
            if node_avail >= size and (best is None or node_avail < best_avail):
                best, best_avail = node_cell, node_avail
                if node_avail == size:
                    break
        leaves = take_in(best, size, view) if best is not None else None
        if leaves is None:
            view.undo(mark)
            return None
        result.append(leaves)
    return result


def fit_group(roots: list[Cell], sizes: list[int], view: View, *, max_tries: int = 64) -> list[list[Cell]] | None:
    """The tasks (sizes, largest first) in the lowest best-fitting cell under one of `roots`."""
    total = sum(sizes)
    avail = view.avail
    candidates = [root for root in roots if avail(root) >= total]
    if not candidates:
        return None
    # Fast path: walk down by best fit from the best-fitting root.
    cell = min(candidates, key=lambda c: (avail(c), c.order))
    while True:
        best = None
        best_avail = 0
        for child in cell.children:
            child_avail = avail(child)
            if child_avail >= total and (best is None or child_avail < best_avail):
                best, best_avail = child, child_avail
        if best is None:
            break
        cell = best
    placed = fit_in(cell, sizes, view)
    if placed is not None:
        return placed
    # Fragmented (enough leaves, not on the right nodes): try other cells, lowest first. Inside a
    # node there is no need to look further: taking leaves in a node already picks the best sub-cell.
    found: list[Cell] = []
    stack = list(candidates)
    while stack:
        current = stack.pop()
        found.append(current)
        if current.in_node:
            continue
        for child in current.children:
            if avail(child) >= total:
                stack.append(child)
    found.sort(key=lambda c: (c.level, avail(c), c.order))
    for tries, current in enumerate(found):
        if current is cell:
            continue
        if tries >= max_tries:
            break
        placed = fit_in(current, sizes, view)
        if placed is not None:
            return placed
    return None
