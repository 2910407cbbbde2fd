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
its tag counted. Those users are marked, and their jobs re-tagged (`Queues.retag`) before a pass
walks the queue and after it: a pass never sees a stale tag, and position and reasons read between
passes are current.

Only users who share a priority of a VC's lane with another user compete, so only their tags are
kept: a (VC, priority) where one user alone has queued jobs has every tag 0, and its queue order is
arrival order, the order their shares would give (a user's tags never fall along their own queue).
That keeps one user's backlog cheap: a release of theirs, which moves every tag of theirs, costs
nothing while nobody else waits beside them (it cost a re-tag of the whole backlog, per release).
A user whose every queued job is alone is left stale (`_stale`): their running share is not kept
and is counted again, from their jobs, when a priority of theirs gains a second user.

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
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable

from libs.common.protocol.model import OPPORTUNISTIC_PRIORITY
from services.scheduler.core.jobs import JobRecord

UserKey = tuple[str, str]  # (VC, user)
GroupKey = tuple[str, int]  # (VC, priority): the jobs whose order tags decide between users
Cells = dict[str, int]  # sku -> leaf cells


def held_cells(record: JobRecord) -> Cells:
    """Leaf cells per sku the attempt holds (placed tasks)."""
    cells: Cells = {}
    for leaves in record.placed.values():
        if leaves:
            cells[leaves[0].sku] = cells.get(leaves[0].sku, 0) + len(leaves)
    return cells


class _User:
    __slots__ = ("queued", "orders", "holders", "tail", "last", "priorities", "tagged")

    def __init__(self) -> None:
        # Their queued guaranteed attempts in the VC's lane, by (priority, arrival) order (`_order`),
        # and those orders sorted: a re-tag walks them in order without sorting them again.
        self.queued: dict[tuple[int, int], JobRecord] = {}
        self.orders: list[tuple[int, int]] = []
        self.holders: dict[JobRecord, None] = {}  # their guaranteed attempts holding cells of the VC
        self.tail: Cells = {}  # held + every queued job's demand: the share of a job joining at the back
        self.last: tuple[int, int] | None = None  # the (priority, arrival) order of their last queued job
        self.priorities: dict[int, int] = {}  # priority -> how many of their queued jobs have it
        self.tagged = False  # some queued job of theirs may have a tag other than 0


class FairShare:
    """Per VC and user: what they hold and queue, and their jobs' fair tags (see the module's docstring).

    `demand(record)`: the leaf cells per sku the attempt's unplaced tasks ask for (the core estimates
    it: the sku where they weigh least). `retag([(record, tag), ...])`: the queue moves the attempts to
    their new tags.
    """

    def __init__(self, vc_cells: dict[str, Cells], demand: Callable[[JobRecord], Cells],
                 retag: Callable[[list[tuple[JobRecord, int]]], None]):
        self._weights: dict[str, Cells] = {}
        for vc, cells in vc_cells.items():
            cells = {sku: n for sku, n in cells.items() if n > 0}
            scale = math.lcm(*cells.values()) if cells else 1
            self._weights[vc] = {sku: scale // n for sku, n in cells.items()}
        self._demand = demand
        self._move = retag
        self._users: dict[UserKey, _User] = {}
        self._dirty: dict[UserKey, None] = {}  # users whose tags may be stale (a dict: deterministic order)
        # Users alone in every (VC, priority) where they queue: tags all 0, `tail` and `last` not kept.
        self._stale: dict[UserKey, None] = {}
        self._groups: dict[GroupKey, dict[str, None]] = {}  # (VC, priority) -> the users with jobs queued there
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
        largest = 0  # (a loop: a re-tag asks this once per queued job of the user)
        for sku, count in cells.items():
            weighed = count * weights.get(sku, 0)
            if weighed > largest:
                largest = weighed
        return largest

    def _user(self, key: UserKey) -> _User:
        user = self._users.get(key)
        if user is None:
            user = self._users[key] = _User()
        return user

    def _contended(self, key: UserKey, user: _User) -> bool:
        """Some queued job of the user shares its (VC, priority) with another user's."""
        vc = key[0]
        return any(len(self._groups[(vc, priority)]) > 1 for priority in user.priorities)

    def _join_group(self, key: UserKey, user: _User, priority: int) -> bool:
        """Count a queued job of the user at `priority`; whether that (VC, priority) is contended now."""
        vc, name = key
        members = self._groups.setdefault((vc, priority), {})
        if name not in members:
            if len(members) == 1:  # its lone user competes from now on: their tags are wanted
                self._dirty[(vc, next(iter(members)))] = None
            members[name] = None
        user.priorities[priority] = user.priorities.get(priority, 0) + 1
        return len(members) > 1

    def _leave_group(self, key: UserKey, user: _User, priority: int) -> None:
        vc, name = key
        left = user.priorities[priority] - 1
        if left:
            user.priorities[priority] = left
            return
        del user.priorities[priority]
        members = self._groups[(vc, priority)]
        del members[name]
        if len(members) == 1:  # its last other user is alone there now: their tags there go to 0
            self._dirty[(vc, next(iter(members)))] = None
        elif not members:
            del self._groups[(vc, priority)]

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
        self._where[record] = key
        contended = self._join_group(key, user, record.priority)
        order = self._order(record)
        user.queued[order] = record
        insort(user.orders, order)
        if key not in self._dirty and key not in self._stale and (user.last is None or order > user.last):
            # Joins behind every job of theirs (the usual case): the tags ahead stand.
            demand = record.queue.fair_demand = self._demand(record)
            record.queue.fair = self.share(record.vc, user.tail) if contended else 0
            user.tagged = user.tagged or contended
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
        order = self._order(record)
        del user.queued[order]
        del user.orders[bisect_left(user.orders, order)]
        self._leave_group(key, user, record.priority)
        if record.pending_groups or not record.placed or record.borrowed:
            self._dirty[key] = None  # cells it asked for are no longer asked for, nor held
        self._forget_if_idle(key, user)

    def holding(self, record: JobRecord) -> None:
        """The attempt's cells changed (more of them, or some given back)."""
        counted = record.queue.fair_demand
        record.queue.fair_demand = None  # what it still asks for changed with its cells
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
        # (Alone, it is cheaper to mark them than to look: their refresh costs nothing.)
        if key in self._stale or not self._contended(key, user) or got != counted or (
                record not in self._where) or (user.orders and user.orders[0] < self._order(record)):
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
            self._stale.pop(key, None)

    # --- tags ------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-tag the jobs of every user marked since the last refresh (cost: the queued jobs of those
        who compete with another user; nothing for a user alone, once their tags are 0)."""
        dirty, self._dirty = self._dirty, {}
        for key in dirty:
            user = self._users.get(key)
            if user is None:
                continue
            if self._contended(key, user):
                self._stale.pop(key, None)
                self._retag(key, user)
            else:
                self._stale[key] = None
                if user.tagged:
                    self._move([(record, 0) for record in user.queued.values() if record.queue.fair])
                    user.tagged = False

    def _retag(self, key: UserKey, user: _User) -> None:
        vc = key[0]
        groups = self._groups
        tail: Cells = {}
        for holder in user.holders:
            _add(tail, held_cells(holder))
        queued = user.queued
        records = [queued[order] for order in user.orders]
        changes = []
        for record in records:
            tag = self.share(vc, tail) if len(groups[(vc, record.priority)]) > 1 else 0
            demand = record.queue.fair_demand
            if demand is None:
                demand = record.queue.fair_demand = self._demand(record)
            _add(tail, demand)
            if tag != record.queue.fair:
                changes.append((record, tag))
        self._move(changes)
        user.tail = tail
        user.last = self._order(records[-1]) if records else None
        user.tagged = True

    def expected_tags(self, queued: Iterable[JobRecord], holders: Iterable[JobRecord], *,
                      alone_too: bool = False) -> dict[JobRecord, int]:
        """The tags computed from scratch (validate_state compares them with the queue's); with
        `alone_too`, the shares of users alone in their (VC, priority) too, which the queue leaves 0."""
        by_user: dict[UserKey, list[JobRecord]] = {}
        tails: dict[UserKey, Cells] = {}
        users_of: dict[GroupKey, set[str]] = {}
        for holder in holders:
            if self.counts(holder) and holder.placed:
                _add(tails.setdefault((holder.vc, holder.spec.user), {}), held_cells(holder))
        for record in queued:
            if self.tracks(record):
                by_user.setdefault((record.vc, record.spec.user), []).append(record)
                users_of.setdefault((record.vc, record.priority), set()).add(record.spec.user)
        tags: dict[JobRecord, int] = {}
        for key, records in by_user.items():
            tail = dict(tails.get(key, {}))
            for record in sorted(records, key=self._order):
                alone = len(users_of[(record.vc, record.priority)]) == 1
                tags[record] = 0 if alone and not alone_too else self.share(key[0], tail)
                _add(tail, self._demand(record))
        return tags

    @property
    def pending_refresh(self) -> bool:
        return bool(self._dirty)


def _add(into: Cells, cells: Cells) -> None:
    for sku, count in cells.items():
        into[sku] = into.get(sku, 0) + count
