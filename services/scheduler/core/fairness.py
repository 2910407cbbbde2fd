"""Fair share among the users of a VC: dominant-resource fairness (DRF) orders a VC's
guaranteed jobs within a priority.

Queue order in a VC's lane is (priority, fair tag, arrival) (`JobRecord.key`). A job's fair
tag is the dominant share of the VC its user would hold once every job of theirs ahead of it
is placed: the cells their guaranteed jobs of the VC hold, plus the cells their queued jobs
ahead of it ask for, each sku's cells as a share of the VC's cells of that sku, the largest
share over skus. Among waiting jobs of one priority the user holding the smallest share goes
first (ties: arrival), so a pass that places jobs in queue order fills the VC as DRF's
progressive filling does: 40 jobs of one user and 32 of another interleave, and a user with
nothing running goes before one with jobs running.

Tags and not a share read at each pick, because the queue is kept sorted (queues.py: lists, buckets,
bisect). A tag stays right while the user's cells move from "asked for" to "held": placing a user's
first queued job changes none of their tags. Tags change when a user's held cells shrink (a
release), when a later job of theirs is placed first (its cells now count ahead), when a queued job
leaves without running (cancelled, preempted, fallen back) or joins ahead of the user's other jobs
(a higher priority, an old place kept across attempts), or when a job is placed on another sku than
its tag counted. Those users are marked, and their jobs re-tagged (`Queues.reorder`) before a pass
walks the queue and after it: a pass never sees a stale tag, and position and reasons read between
passes are current.

HiveD's guarantees stay: only the order within one priority of a VC's lane changes. Priority
comes first, and preemption is by priority only (never for fairness); cells, quotas, VC
safety and gangs are untouched; a job that does not fit still lets the jobs after it try (no
head-of-line blocking); a gang waiting past its deadline holds back the jobs after it in this
order, as it held back later arrivals. Opportunistic jobs (their own lane, idle cells
anywhere, not the VC's) stay in arrival order, tag 0.

Shares are exact integers (no float ties): a sku's cells weigh lcm(VC's cells per sku) / the
VC's cells of that sku, so equal shares compare equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from libs.common.protocol.model import OPPORTUNISTIC_PRIORITY
from services.scheduler.core.jobs import JobRecord

UserKey = tuple[str, str]  # (VC, user)
Cells = dict[str, int]  # sku -> leaf cells


def held_cells(record: JobRecord) -> Cells:
    """Leaf cells per sku the attempt holds (placed tasks)."""
    cells: Cells = {}
    for leaves in record.placed.values():
        if leaves:
            cells[leaves[0].sku] = cells.get(leaves[0].sku, 0) + len(leaves)
    return cells


class _User:
    __slots__ = ("queued", "holders", "tail", "last")

    def __init__(self) -> None:
        self.queued: dict[JobRecord, None] = {}  # their queued guaranteed attempts in the VC's lane
        self.holders: dict[JobRecord, None] = {}  # their guaranteed attempts holding cells of the VC
        self.tail: Cells = {}  # held + every queued job's demand: the share of a job joining at the back
        self.last: tuple[int, int] | None = None  # the (priority, arrival) order of their last queued job


class FairShare:
    """Per VC and user: what they hold and queue, and their jobs' fair tags (see the module's docstring).

    `demand(record)`: the leaf cells per sku the attempt's unplaced tasks ask for (the core estimates
    it: the sku where they weigh least). `reorder(record, tag)`: the queue moves the attempt to its new tag.
    """

    def __init__(self, vc_cells: dict[str, Cells], demand: Callable[[JobRecord], Cells],
                 reorder: Callable[[JobRecord, int], None]):
        self._weights: dict[str, Cells] = {}
        for vc, cells in vc_cells.items():
            cells = {sku: n for sku, n in cells.items() if n > 0}
            scale = math.lcm(*cells.values()) if cells else 1
            self._weights[vc] = {sku: scale // n for sku, n in cells.items()}
        self._demand = demand
        self._reorder = reorder
        self._users: dict[UserKey, _User] = {}
        self._dirty: dict[UserKey, None] = {}  # users whose tags may be stale (a dict: deterministic order)
        self._where: dict[JobRecord, UserKey] = {}  # queued attempt -> its user, as registered
        self._seen: dict[JobRecord, Cells] = {}  # holding attempt -> the cells counted as its user's

    @staticmethod
    def tracks(record: JobRecord) -> bool:
        """Queued in its VC's lane (guaranteed), where the order is fair."""
        return not record.opportunistic

    @staticmethod
    def counts(record: JobRecord) -> bool:
        """Its cells count in its user's share: placed as guaranteed work of the VC (a job lazily
        downgraded to opportunistic still runs on them; borrowed work runs outside the quota)."""
        return record.spec.priority > OPPORTUNISTIC_PRIORITY and not record.borrowed

    def share(self, vc: str, cells: Cells) -> int:
        weights = self._weights.get(vc, {})
        return max((count * weights.get(sku, 0) for sku, count in cells.items()), default=0)

    def _user(self, key: UserKey) -> _User:
        user = self._users.get(key)
        if user is None:
            user = self._users[key] = _User()
        return user

    @staticmethod
    def _order(record: JobRecord) -> tuple[int, int]:
        return (-record.priority, record.queue.order)

    # --- what the core tells -------------------------------------------------------------

    def queued(self, record: JobRecord) -> None:
        """The attempt joins its VC's lane: its tag is set before the queue files it."""
        if not self.tracks(record):
            record.queue.fair = 0
            return
        key = (record.vc, record.spec.user)
        user = self._user(key)
        user.queued[record] = None
        self._where[record] = key
        order = self._order(record)
        if key not in self._dirty and (user.last is None or order > user.last):
            # Joins behind every job of theirs (the usual case): the tags ahead stand.
            demand = record.queue.fair_demand = self._demand(record)
            record.queue.fair = self.share(record.vc, user.tail)
            _add(user.tail, demand)
            user.last = order
        else:
            record.queue.fair = 0  # set right by the next refresh, before any pass walks the queue
            self._dirty[key] = None

    def dequeued(self, record: JobRecord) -> None:
        """The attempt left its lane (placed in full, cancelled, preempted, fallen back)."""
        key = self._where.pop(record, None)
        if key is None:
            return
        user = self._users[key]
        user.queued.pop(record, None)
        if record.pending_groups or not record.placed or record.borrowed:
            self._dirty[key] = None  # cells it asked for are no longer asked for, nor held
        self._forget_if_idle(key, user)

    def holding(self, record: JobRecord) -> None:
        """The attempt got (more) cells."""
        if not self.counts(record):
            return
        key = (record.vc, record.spec.user)
        user = self._user(key)
        user.holders[record] = None
        held = held_cells(record)
        got = dict(held)
        for sku, count in self._seen.get(record, {}).items():
            got[sku] = got.get(sku, 0) - count
        self._seen[record] = held
        # Its user's later tags counted all it asked for, on the sku where that weighed least: placed in
        # part, or on another sku, or never counted (restored), their share moved; and placed before
        # their jobs ahead of it (it fitted, they did not), its cells count for those now.
        if got != record.queue.fair_demand or record not in self._where or any(
                self._order(other) < self._order(record) for other in user.queued):
            self._dirty[key] = None

    def released(self, record: JobRecord) -> None:
        """The attempt's cells are free again (or it is forgotten)."""
        key = (record.vc, record.spec.user)
        user = self._users.get(key)
        self._seen.pop(record, None)
        if user is None or record not in user.holders:
            return
        del user.holders[record]
        self._dirty[key] = None
        self._forget_if_idle(key, user)

    def _forget_if_idle(self, key: UserKey, user: _User) -> None:
        if not user.queued and not user.holders:
            del self._users[key]
            self._dirty.pop(key, None)

    # --- tags ------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-tag the jobs of every user marked since the last refresh (cost: their queued jobs)."""
        dirty, self._dirty = self._dirty, {}
        for key in dirty:
            user = self._users.get(key)
            if user is not None:
                self._retag(key, user)

    def _retag(self, key: UserKey, user: _User) -> None:
        vc = key[0]
        tail: Cells = {}
        for holder in user.holders:
            _add(tail, held_cells(holder))
        records = sorted(user.queued, key=self._order)
        for record in records:
            tag = self.share(vc, tail)
            demand = self._demand(record)
            record.queue.fair_demand = demand
            _add(tail, demand)
            if tag != record.queue.fair:
                self._reorder(record, tag)
        user.tail = tail
        user.last = self._order(records[-1]) if records else None

    def expected_tags(self, queued: Iterable[JobRecord], holders: Iterable[JobRecord]) -> dict[JobRecord, int]:
        """The tags computed from scratch (validate_state compares them with the queue's)."""
        by_user: dict[UserKey, list[JobRecord]] = {}
        tails: dict[UserKey, Cells] = {}
        for holder in holders:
            if self.counts(holder) and holder.placed:
                _add(tails.setdefault((holder.vc, holder.spec.user), {}), held_cells(holder))
        for record in queued:
            if self.tracks(record):
                by_user.setdefault((record.vc, record.spec.user), []).append(record)
        tags: dict[JobRecord, int] = {}
        for key, records in by_user.items():
            tail = dict(tails.get(key, {}))
            for record in sorted(records, key=self._order):
                tags[record] = self.share(key[0], tail)
                _add(tail, self._demand(record))
        return tags

    @property
    def pending_refresh(self) -> bool:
        return bool(self._dirty)


def _add(into: Cells, cells: Cells) -> None:
    for sku, count in cells.items():
        into[sku] = into.get(sku, 0) + count
