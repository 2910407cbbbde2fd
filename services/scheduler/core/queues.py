"""Waiting attempts in queue order: one lane per VC for guaranteed jobs (VCs do not
compete for quota) and one lane (None) for opportunistic jobs, each also split by sku.

A scheduling pass only walks the (lane, sku) lists marked dirty since the last
pass -- cells of that sku were freed where that lane may use them, a job arrived,
time passed -- so the work per event follows what changed, not the queue length.

Each list is also split into buckets of jobs that ask for the same thing
(`JobRecord.bucket`: shape, skus, class; in the opportunistic lane also the VC).
Inside a bucket a later job can fit only where the one before it fits, so a pass
looks at the heads of the buckets in queue order and leaves a bucket at its first
job that does not fit: what it costs follows the number of buckets and of jobs it
places, not the length of the queue.

A gang that has waited long enough starts holding back the jobs behind it when a pass
looks at it, wherever it stands in its bucket: the gangs past their deadline that do not
hold anyone back yet are indexed per bucket (`due`), so a pass that leaves a bucket early
still looks at them, in queue order, as a plain scan would.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter

from services.scheduler.core.jobs import JobRecord

Lane = str | None
Pair = tuple[Lane, str | None]


_key: Callable[[JobRecord], tuple[int, int, int]] = attrgetter("queue.key")  # JobRecord.key, read in C


class Queues:
    def __init__(self, vc_order: list[str]):
        self.lanes: dict[Lane, list[JobRecord]] = {}
        self.by_sku: dict[Pair, list[JobRecord]] = {}
        # Per list, bucket key -> its jobs in queue order (see the module's docstring).
        self.buckets: dict[Pair, dict[tuple[object, ...], list[JobRecord]]] = {}
        self.dirty: set[Pair] = set()
        # Per list, the jobs no pass has looked at since they arrived (or since the gang they waited
        # behind went): a list held back behind an aged gang only needs to look at these.
        self.fresh: dict[Pair, dict[JobRecord, None]] = {}
        # (gang_deadline, push count, record): when a waiting gang becomes old enough to hold back backfill.
        self._deadlines: list[tuple[float, int, JobRecord]] = []
        self._due_at: list[tuple[float, int, JobRecord]] = []  # the same, for `due` (see promote_due)
        # Per list, bucket key -> its gangs past their deadline that hold nobody back yet, in queue order.
        self.due: dict[Pair, dict[tuple[object, ...], list[JobRecord]]] = {}
        self._pushed = 0
        self._vc_rank: dict[str | None, int] = {vc: rank for rank, vc in enumerate(vc_order)}

    @staticmethod
    def lane_of(record: JobRecord) -> Lane:
        return None if record.opportunistic else record.vc

    @staticmethod
    def _skus_of(record: JobRecord) -> list[str | None]:
        return list(record.skus) or [None]

    def add(self, record: JobRecord) -> None:
        lane = self.lane_of(record)
        record.queue.fresh = True
        if record.queue.gang_deadline != float("inf"):
            self._pushed += 1
            heapq.heappush(self._deadlines, (record.queue.gang_deadline, self._pushed, record))
            heapq.heappush(self._due_at, (record.queue.gang_deadline, self._pushed, record))
        _insert(self.lanes.setdefault(lane, []), record)
        for sku in self._skus_of(record):
            _insert(self.by_sku.setdefault((lane, sku), []), record)
            _insert(self.buckets.setdefault((lane, sku), {}).setdefault(record.queue.bucket, []), record)
            self.fresh.setdefault((lane, sku), {})[record] = None
            self.dirty.add((lane, sku))

    def remove(self, record: JobRecord) -> bool:
        lane = self.lane_of(record)
        if not _remove(self.lanes.get(lane), record):
            return False
        for sku in self._skus_of(record):
            _remove(self.by_sku.get((lane, sku)), record)
            buckets = self.buckets.get((lane, sku), {})
            bucket = buckets.get(record.queue.bucket)
            _remove(bucket, record)
            if bucket is not None and not bucket:
                del buckets[record.queue.bucket]
            self.fresh.get((lane, sku), {}).pop(record, None)
        self.not_due(record)
        return True

    # When the re-tagged jobs are at least this share of their lane, each list they touch is sorted
    # again instead of each job moved: a list.sort of a list whose order moved in places costs a few
    # C-level passes over it, each job's removal and insertion two bisects and two moves per list.
    # (decide_cpu, 10,000 jobs queued: from 1/64 to 1/16 of the lane within the noise for two users'
    # 5,000 each and 50 users' 200 each; always sorting cost the 50 users' case half again.)
    RESORT_SHARE = 1 / 16

    def retag(self, changes: list[tuple[JobRecord, int]]) -> None:
        """Give queued jobs new fair tags (fairness.py): each moves in every list it is in, keeping its
        notes. Its lists are looked at again; a job noted waiting behind an aged gang keeps the note (it
        still waits, the gang's placement looks at it again), even where it moved ahead."""
        if not changes:
            return
        if len(changes) < self.RESORT_SHARE * len(self.lanes.get(self.lane_of(changes[0][0]), ())):
            for record, fair in changes:
                found = [queue for queue in self._lists_of(record) if _remove(queue, record)]
                record.queue.fair = fair
                for queue in found:
                    _insert(queue, record)
            return
        touched: dict[int, list[JobRecord]] = {}
        places: set[tuple[object, ...]] = set()  # jobs alike (one user's, mostly) are in the same lists
        for record, fair in changes:
            place = (self.lane_of(record), *record.skus, record.queue.bucket, record.queue.due)
            if place not in places:
                places.add(place)
                for queue in self._lists_of(record):
                    touched[id(queue)] = queue
            record.queue.fair = fair
        for queue in touched.values():
            queue.sort(key=_key)

    def _lists_of(self, record: JobRecord) -> list[list[JobRecord]]:
        """Every list a queued job is in (marking them to be looked at again)."""
        lane = self.lane_of(record)
        lists = []
        if (queue := self.lanes.get(lane)) is not None:
            lists.append(queue)
        for sku in self._skus_of(record):
            pair = (lane, sku)
            self.dirty.add(pair)
            for queue in (self.by_sku.get(pair), self.buckets.get(pair, {}).get(record.queue.bucket),
                          self.due.get(pair, {}).get(record.queue.bucket) if record.queue.due else None):
                if queue is not None:
                    lists.append(queue)
        return lists

    def promote_due(self, now: float, may_age: Callable[[JobRecord], bool]) -> None:
        """Queued gangs whose deadline has passed (and that `may_age`) join `due`."""
        due_at = self._due_at
        while due_at and due_at[0][0] <= now:
            _, _, record = heapq.heappop(due_at)
            if record.queue.due or record.queue.blocking or not self._queued(record) or not may_age(record):
                continue
            record.queue.due = True
            lane = self.lane_of(record)
            for sku in self._skus_of(record):
                _insert(self.due.setdefault((lane, sku), {}).setdefault(record.queue.bucket, []), record)

    def not_due(self, record: JobRecord) -> None:
        """The gang holds back backfill now, or left the queue."""
        if not record.queue.due:
            return
        record.queue.due = False
        lane = self.lane_of(record)
        for sku in self._skus_of(record):
            buckets = self.due.get((lane, sku), {})
            gangs = buckets.get(record.queue.bucket)
            _remove(gangs, record)
            if gangs is not None and not gangs:
                del buckets[record.queue.bucket]

    def next_due(self, pair: Pair, bucket: tuple[object, ...], after: tuple[int, int, int] | None) -> JobRecord | None:
        """The bucket's first gang in `due` after the queue position `after` (None: from the start)."""
        gangs = self.due.get(pair, {}).get(bucket)
        if not gangs:
            return None
        index = 0 if after is None else bisect_right(gangs, after, key=_key)
        return gangs[index] if index < len(gangs) else None

    def looked_at(self, record: JobRecord) -> None:
        if not record.queue.fresh:
            return
        record.queue.fresh = False
        lane = self.lane_of(record)
        for sku in self._skus_of(record):
            self.fresh.get((lane, sku), {}).pop(record, None)

    def look_again(self, record: JobRecord) -> None:
        record.queue.fresh = True
        lane = self.lane_of(record)
        for sku in self._skus_of(record):
            self.fresh.setdefault((lane, sku), {})[record] = None
            self.dirty.add((lane, sku))

    def position(self, record: JobRecord) -> int:
        """Waiting jobs ahead of this one in its lane."""
        queue = self.lanes.get(self.lane_of(record), [])
        return bisect_left(queue, record.key, key=_key)

    def mark(self, lane: Lane, skus: Sequence[str | None]) -> None:
        for sku in skus or (None,):
            if (lane, sku) in self.by_sku:
                self.dirty.add((lane, sku))

    def mark_due(self, now: float) -> None:
        """Time passed: the lists of gangs that have just become old enough are looked at."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, record = heapq.heappop(deadlines)
            if self._queued(record):
                self.mark(self.lane_of(record), record.skus)

    def _queued(self, record: JobRecord) -> bool:
        queue = self.lanes.get(self.lane_of(record))
        if not queue:
            return False
        index = bisect_left(queue, record.key, key=_key)
        return index < len(queue) and queue[index] is record

    def take_dirty(self) -> list[Pair]:
        """The dirty lists in pass order: VCs as configured, unknown VCs, opportunistic work last."""
        dirty, self.dirty = self.dirty, set()
        return self.in_pass_order(pair for pair in dirty if self.by_sku.get(pair))

    def in_pass_order(self, pairs: Iterable[Pair]) -> list[Pair]:
        rank = self._vc_rank
        return sorted(pairs, key=lambda pair: (pair[0] is None, rank.get(pair[0], len(rank)), pair[0] or "",
                                               pair[1] or ""))


def _insert(queue: list[JobRecord], record: JobRecord) -> None:
    queue.insert(bisect_left(queue, record.key, key=_key), record)


def _remove(queue: list[JobRecord] | None, record: JobRecord) -> bool:
    if not queue:
        return False
    index = bisect_left(queue, record.key, key=_key)
    if index < len(queue) and queue[index] is record:
        del queue[index]
        return True
    return False
