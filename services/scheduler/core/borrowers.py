"""Opportunistic work holding cells (borrowers): who is youngest, and the adaptive idle reserve.

`Borrowers` keeps the opportunistic attempts holding cells by age, so a guaranteed job
takes the youngest first (they threw away the least work) without sorting them all each
time. `IdleReserve` is the adaptive reserve (SchedulingPolicy.adaptive_reserve): the idle
cells no VC holds that opportunistic work leaves alone, sized by the costly kills of the
last window.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator

from services.scheduler.core.cells import CellTree
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.policy import AdaptiveReserve
from services.scheduler.core.rules import cell_hours_run


def _age_key(record: JobRecord) -> tuple[float, int]:
    return (record.placed_at if record.placed_at is not None else float("-inf"), record.seq)


class Borrowers:
    """Opportunistic attempts holding cells, oldest first (by placed_at, seq) once sorted."""

    __slots__ = ("_by_age", "_sorted")

    def __init__(self) -> None:
        self._by_age: dict[JobRecord, None] = {}
        self._sorted = True

    def note(self, record: JobRecord) -> None:
        by_age = self._by_age
        if record in by_age:
            return
        if by_age and self._sorted:
            last = next(reversed(by_age))
            if _age_key(record) < _age_key(last):
                self._sorted = False  # a restored or downgraded job: sorted when next needed
        by_age[record] = None

    def forget(self, record: JobRecord) -> None:
        self._by_age.pop(record, None)

    def youngest(self) -> Iterator[JobRecord]:
        """Opportunistic attempts holding cells, youngest first."""
        if not self._sorted:
            self._by_age = dict.fromkeys(sorted(self._by_age, key=_age_key))
            self._sorted = True
        return reversed(self._by_age)


def unheld_idle(tree: CellTree, sku: str) -> int:
    """Idle leaf cells of the sku that no VC holds."""
    return sum(chain.unbound_free for chain in tree.sku_chains.get(sku, ()))


class IdleReserve:
    """Idle cells no VC holds that opportunistic work leaves alone now (the adaptive reserve).

    Under overload every cell no VC holds runs borrowers, so a VC binding a cell kills one or
    binds it with borrowers that stay in its holes until its work grows. Kept idle, the
    reserve lets it bind without either. It grows with the borrowers that a take-back killed
    after long runs and drains as those kills age out of the window, so it costs nothing
    where take-backs are cheap. It holds only in a sustained overload, while the opportunistic
    job first in the queue has waited `after_waiting_s`: a short burst (Philly 5x: the first
    one never waits 6 h) also has costly kills, but there idle cells left to borrowers cost
    less delay than the reserve saves work (5x: 18 s average delay with the gate, 25-94 s
    without, for every size tried).
    """

    __slots__ = ("_settings", "_after", "_clock", "_tree", "_first_waiting", "_costly_kills", "_now")

    def __init__(self, settings: AdaptiveReserve | None, after_waiting_s: float | None, *,
                 clock: Callable[[], float], tree: CellTree, first_waiting: Callable[[], float | None]):
        self._settings = settings  # None: no reserve
        self._after = after_waiting_s  # None: it holds whenever there were costly kills
        self._clock = clock
        self._tree = tree
        self._first_waiting = first_waiting  # when the opportunistic job first in the queue was queued
        self._costly_kills: dict[str, collections.deque[tuple[float, int]]] = {}  # sku -> (when, leaves)
        self._now: dict[str, int] = {}  # sku -> the reserve last computed

    def for_sku(self, sku: str) -> int:
        """The reserve of the sku now, in leaf cells."""
        if self._settings is None:
            return 0
        kills = self._costly_kills.get(sku)
        if not kills:
            return 0
        now = self._clock()
        while kills and kills[0][0] < now - self._settings.window_s:
            kills.popleft()
        reserve = min(self._settings.most_leaves, sum(k[1] for k in kills))
        if reserve and self._after is not None:
            first = self._first_waiting()
            if first is None or now - first < self._after:
                reserve = 0
        self._now[sku] = reserve
        return reserve

    def shrunk(self) -> list[str]:
        """The skus whose reserve is smaller now than when last computed (idle cells given back)."""
        shrunk = []
        for sku in self._costly_kills:
            before = self._now.get(sku, 0)
            if self.for_sku(sku) < before:
                shrunk.append(sku)
        return shrunk

    def note_kills(self, victims: Iterable[JobRecord], sku: str) -> None:
        """Remember the borrowers a guaranteed job kills after a long run (they size the reserve)."""
        if self._settings is None:
            return
        now = self._clock()
        for job in victims:
            if not job.opportunistic:
                continue
            if cell_hours_run(job, now) >= self._settings.min_gpu_h:
                leaves = sum(len(cells) for cells in job.placed.values())
                self._costly_kills.setdefault(sku, collections.deque()).append((now, leaves))

    def held_back(self, skus: list[str]) -> int:
        """Idle cells no VC holds that the reserve kept from opportunistic work in the last pass."""
        return sum(min(self._now.get(sku, 0), unheld_idle(self._tree, sku)) for sku in skus)
