"""One scheduling pass: an object per pass, walking the queue lists whose cells changed.

`SchedulingPass(core).run()` is what `SchedulerCore.handle` runs after the events of a
call. The pass is the core's own walk: it reads and changes the core's bookkeeping (its
queues, aged gangs, the shape fallback's buckets) and asks the core to place each job it
tries (`SchedulerCore._try_place`, whose modes are placing.py's planners).

- Each pass walks the (lane, sku) lists marked dirty since the last one (queues.py), VCs'
  lists first, opportunistic ones last, and tries the waiting jobs in queue order, so a
  gang that does not fit does not block smaller jobs behind it.
- Jobs asking for the same thing share a bucket: a pass looks only at bucket heads, in
  queue order, and leaves a bucket at its first job that does not fit, so its cost follows
  the number of buckets and of jobs placed, not the queue's length. A job is not tried
  again until cells it may use were freed since it last failed, nor when a job at least as
  large already failed in the same pass (cells only get scarcer within a pass).
- Anti-starvation: a gang that has waited `gang_priority_after_s` stops the backfill behind
  it (`_age`); age is looked at whenever the gang's queue is, and on every Tick.
- When a list has no usable cell left for anyone further down, the walk stops there (only
  jobs not yet seen get a reason), so long queues stay cheap.
- Shape fallback: the buckets whose job found no room in its VC but may fall back are walked
  again after every VC's list (`_fallback_walk`), where only the BORROW mode is tried.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.scheduler.core import reasons
from services.scheduler.core.decisions import Decision
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.queues import Pair
from services.scheduler.core.rules import Shape, dominates, fallback_kind, kept_unheld, may_age

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import SchedulerCore

Lane = str | None
Bucket = tuple[object, ...]
# Heap entries: (queue position, tie-break, bucket key, record).
_Entry = tuple[tuple[int, int, int], int, "Bucket | None", "JobRecord | None"]


class LanePass:
    """What one scheduling pass learns about a lane, shared by its sku lists."""

    __slots__ = ("now", "blockers", "blocking_ids", "failed_shapes", "cut_off_by")

    def __init__(self, now: float):
        self.now = now
        self.blockers: list[JobRecord] = []  # aged gangs met so far, in queue order
        self.blocking_ids: set[str] = set()
        # The shape fallback's walk: the aged gangs as it began. A VC's list is cut off at the first of
        # them for the whole walk, even once it is placed (see _fallback_walk).
        self.cut_off_by: list[JobRecord] | None = None
        # (skus, shape, priority) that did not fit
        self.failed_shapes: list[tuple[frozenset[str], Shape, int]] = []


class SchedulingPass:
    """One pass over the dirty queue lists; `run()` returns its decisions."""

    def __init__(self, core: SchedulerCore):
        self.core = core
        self.state = core._state
        self.queues = core._queues
        self.policy = core.policy
        self.decisions: list[Decision] = []
        self.falling_back = False  # in the second walk of the pass, where jobs may fall back
        self.failed_before_fallback = -1  # the epoch of the first walk of the pass

    def run(self) -> list[Decision]:
        core, state, queues = self.core, self.state, self.queues
        for freed in state.take_freed():
            if freed[0] == "vc":
                queues.mark(freed[1], (freed[2],))
            elif freed[0] == "unbound":
                # Cells no VC holds only help VCs that may still bind more of that sku.
                for vc in core._sku_lanes.get(freed[1], ()):
                    if state.vcs[vc].may_bind(freed[1]):
                        queues.mark(vc, (freed[1],))
            else:
                queues.mark(None, (freed[1],))
                if self.policy.shape_fallback is not None:
                    # Idle cells anywhere: guaranteed jobs of VCs with quota left may fall back onto them.
                    for vc in core._sku_lanes.get(freed[1], ()):
                        record = state.vcs[vc]
                        if record.held.get(freed[1], 0) < record.sku_virtual.get(freed[1], 0):
                            queues.mark(vc, (freed[1],))
        for sku in core._reserve.shrunk():
            queues.mark(None, (sku,))
            state.note_reserve_shrank(sku)
        state.next_epoch()
        queues.promote_due(core._clock(), lambda record: may_age(self.policy, record))
        lane_passes: dict[Lane, LanePass] = {}
        for pair in queues.take_dirty():  # the VCs' lists, then the opportunistic ones
            if pair[0] is None and core._fallback_buckets:
                self._fallback_walk()
            self._run_list(pair, self._lane_pass(lane_passes, pair[0]))
        if core._fallback_buckets:
            self._fallback_walk()
        return self.decisions

    def _lane_pass(self, lane_passes: dict[Lane, LanePass], lane: Lane, *, cut_off: bool = False) -> LanePass:
        lane_pass = lane_passes.get(lane)
        if lane_pass is None:
            core = self.core
            lane_pass = lane_passes[lane] = LanePass(core._clock())
            for blocker in sorted(core._blocking.get(lane, ()), key=lambda record: record.key):
                if blocker.waiting and core._jobs.get(blocker.id) is blocker:
                    lane_pass.blockers.append(blocker)
                    lane_pass.blocking_ids.add(blocker.id)
            if cut_off:
                lane_pass.cut_off_by = list(lane_pass.blockers)
        return lane_pass

    def _fallback_walk(self) -> None:
        """Shape fallback, once every VC's list has been walked: the buckets whose job found no room in
        its VC but may fall back are walked again, and now only falling back is tried. After the
        walk, not at once: every guaranteed job that fits its own quota is placed first, and nothing
        in this walk preempts, so no job takes back cells a fallback job got in the same pass (a Place
        and a Preempt of one attempt in one answer). Jobs an aged gang placed here held back are
        looked at in the next pass: the walk is for the jobs that found no room in the first one,
        and those behind an aged gang were not tried there, though they may share a bucket with
        one that was (so each list stays cut off where it was as the walk began). The walk counts
        as a new pass (epoch) for the queue's bookkeeping; the jobs that failed in the first walk
        are tried whatever was freed since."""
        core = self.core
        chosen: dict[Pair, set[Bucket]] = {}
        for pair, bucket in core._fallback_buckets:
            chosen.setdefault(pair, set()).add(bucket)
        core._fallback_buckets = {}
        self.falling_back = True
        self.failed_before_fallback = self.state.epoch
        self.state.next_epoch()
        lane_passes: dict[Lane, LanePass] = {}
        try:
            for pair in self.queues.in_pass_order(chosen):
                self._run_list(pair, self._lane_pass(lane_passes, pair[0], cut_off=True), only=chosen[pair])
        finally:
            self.falling_back = False

    def _run_list(self, pair: Pair, lane_pass: LanePass, only: set[Bucket] | None = None) -> None:
        """Try the jobs of one (lane, sku) list in queue order, looking only at the heads of its buckets.

        The heads are merged in queue order (a heap). A job placed lets the next of its bucket
        in; a job that does not fit, waits behind an aged gang or found nothing freed since it
        last failed closes its bucket for this pass: the jobs behind it ask for the same and
        would fail too. Jobs holding reservations or waiting for victims are looked at whatever
        their bucket does, and so are gangs old enough to hold back backfill that do not yet
        (Queues.due): the plain scan looks at them, they stop the jobs behind them from then on.
        Jobs no pass has looked at yet get their reason at the end. `only`: walk just these
        buckets (the shape fallback's second walk).
        """
        epoch = self.state.epoch
        blockers = lane_pass.blockers
        for gone in [b for b in blockers if not (b.queue.blocking and b.waiting)]:  # placed from another list
            blockers.remove(gone)
            lane_pass.blocking_ids.discard(gone.id)
        lane, sku = pair
        # Past the first aged gang that wants this sku, every job of the list is held back behind it. In the
        # opportunistic lane an aged gang holds back only its own VC's jobs (see _blocked_by): no cut-off.
        vc_lane = lane is not None
        cut_off_by = lane_pass.cut_off_by if lane_pass.cut_off_by is not None else blockers
        held_back_after = min((b.key for b in cut_off_by if sku in b.skus_set), default=None) if vc_lane else None
        full = self._lane_full_check(pair)
        buckets = self.queues.buckets.get(pair, {})
        # Opportunistic work only takes free cells: a bucket asking for more than are free is not looked at
        # (unless its head is a gang about to age: it must be looked at to start holding back backfill).
        free = self.state.tree.sku_totals[sku].free if lane is None and sku is not None else None
        # Entries (queue position, tie-break, bucket key, record): a bucket's next job (record None), a
        # job holding reservations (bucket key None), or a gang of a bucket left early that may age (both).
        heap: list[_Entry] = []
        count = itertools.count()
        next_due = self.queues.next_due
        for bucket, queued in buckets.items():
            head = queued[0]
            if bucket[0] == "never" or (only is not None and bucket not in only):
                continue  # they only need a reason, given once
            if free is not None and self._bucket_cells(pair, bucket, head) > free and (
                    head.queue.blocking or head.queue.gang_deadline > lane_pass.now):
                gang = next_due(pair, bucket, None) if only is None else None
                if gang is not None:
                    heap.append((gang.key, next(count), bucket, gang))
                continue
            heap.append((head.key, next(count), bucket, None))
        for waiting in self._holding_reservations(pair) if only is None else ():
            heap.append((waiting.key, next(count), None, waiting))
        heapq.heapify(heap)
        cursor: dict[Bucket, int] = {}
        while heap:
            _, _, bucket_key, entry = heapq.heappop(heap)
            members: list[JobRecord] | None = None
            if entry is None:
                assert bucket_key is not None
                members = buckets.get(bucket_key)
                index = cursor.get(bucket_key, 0)
                if not members or index >= len(members):
                    continue
                record = members[index]
            else:
                record = entry
                if record.queue.seen_epoch == epoch or not (record.queue.due or bucket_key is None):
                    if bucket_key is not None:  # a gang seen from another list, or no longer due: the next one
                        gang = next_due(pair, bucket_key, record.key)
                        if gang is not None:
                            heapq.heappush(heap, (gang.key, next(count), bucket_key, gang))
                    continue
            if held_back_after is not None and record.key > held_back_after:
                break
            if full is not None and full(record):
                # No cell this list may use is left: nobody further down can be placed in this pass.
                break
            goes_on = self._visit(record, sku, lane_pass)
            if record.id in lane_pass.blocking_ids and not (record.queue.blocking and record.waiting):
                # An aged gang placed (or gone) in this pass no longer holds anyone back.
                lane_pass.blocking_ids.discard(record.id)
                blockers.remove(record)
                if lane_pass.cut_off_by is None:
                    held_back_after = min((b.key for b in blockers if sku in b.skus_set),
                                          default=None) if vc_lane else None
            elif record.queue.blocking and record.waiting and sku in record.skus_set and vc_lane:
                held_back_after = record.key if held_back_after is None else min(held_back_after, record.key)
            if members is not None and goes_on:
                assert bucket_key is not None
                if index < len(members) and members[index] is record:
                    index += 1  # still queued (waiting for its victims): the next one may fit elsewhere
                cursor[bucket_key] = index
                if index < len(members):
                    heapq.heappush(heap, (members[index].key, next(count), bucket_key, None))
            elif bucket_key is not None and only is None and not (record.queue.blocking and record.waiting) and (
                    record.queue.behind is None or record.queue.behind not in lane_pass.blocking_ids):
                # The bucket is left here (or this gang did not age): the later jobs of the bucket would
                # not fit, but a gang among them old enough to hold back backfill must still be looked
                # at where it stands in the queue, or the jobs behind it would go ahead of it. (Not
                # when this one waits behind an aged gang: so does the rest of its bucket.)
                gang = next_due(pair, bucket_key, record.key)
                if gang is not None:
                    heapq.heappush(heap, (gang.key, next(count), bucket_key, gang))
        if only is None:
            self._note_unseen(pair, lane_pass)

    def _visit(self, record: JobRecord, sku: str | None, lane_pass: LanePass) -> bool:
        """Look at one job in a pass; False when the jobs behind it in its bucket cannot fit in this pass."""
        core, decisions = self.core, self.decisions
        epoch = self.state.epoch
        if record.queue.seen_epoch == epoch:
            # Already looked at from another sku list in this pass and still queued: it did not fit there.
            return bool(record.victims)
        record.queue.seen_epoch = epoch
        self.queues.looked_at(record)
        if record.preempting or not record.waiting or core._jobs.get(record.id) is not record:
            return True  # a preempted job is queued again by its Release
        if record.never is not None:
            if record.queue.reason_key is None:
                core._waits.set_reason(record, reasons.never(record.never), decisions)
            return True
        now = lane_pass.now
        if not self._may_fit_now(record):
            # Nothing it may use was freed since it last failed: it keeps its reason.
            self._age(record, now, lane_pass)
            return False
        blockers = lane_pass.blockers
        if blockers and not record.victims and not record.reserved:
            if record.queue.behind in lane_pass.blocking_ids:
                return False  # still behind the same gang
            blocker = _blocked_by(record, blockers)
            if blocker is not None:
                self._note_behind(record, blocker)
                return False
        shape = record.shape
        if shape is not None and not record.victims and not record.reserved and any(
                record.skus_set <= skus and record.priority <= priority and dominates(shape, failed)
                for skus, failed, priority in lane_pass.failed_shapes):
            # Cells only get scarcer during a pass: a job at least as large as one that failed fails too
            # (in its VC: it may still fall back, as the plain scan that tries it would find).
            group = record.pending_groups[0]
            core._note_fallback(record, self.state.vcs[record.vc], group.tasks)
            core._waits.fail(record, group, group.tasks, decisions)
            self._age(record, now, lane_pass)
            return False
        core._try_place(record, decisions, falling_back=self.falling_back)
        failed = record.waiting and record.queue.failed_epoch == epoch and not record.victims
        tree, config = self.state.tree, self.state.config
        if shape is not None and failed and not kept_unheld(self.policy, config, tree, record) and (
                not self.falling_back or fallback_kind(self.policy, record) == self.policy.shape_fallback):
            # (A job kept to cells no VC holds failing says nothing of one that may use a VC's idle cells,
            # a larger one included: a task of a whole node is no large borrower; nor a guaranteed job that
            # may not fall back, or only to cells no VC holds, of one that may.)
            lane_pass.failed_shapes.append((record.skus_set, shape, record.priority))
        self._age(record, now, lane_pass)
        return not failed

    def _note_behind(self, record: JobRecord, blocker: JobRecord) -> None:
        if record.queue.behind != blocker.id:
            record.queue.behind = blocker.id
            self.core._waits.set_reason(record, reasons.behind_gang(
                blocker.id, None if blocker.opportunistic else blocker.vc, blocker.queued_at,
                blocker.queue.blocking, self.core._clock), self.decisions)

    def _holding_reservations(self, pair: Pair) -> list[JobRecord]:
        """Queued jobs of the list whose victims are gone, to take their reserved cells (few).

        Those still waiting for a victim's Release have nothing to do until it comes.
        """
        lane, sku = pair
        lane_of = self.queues.lane_of
        return [record for record in self.core._reserving if not record.victims and record.waiting
                and lane_of(record) == lane and (sku in record.skus_set or (sku is None and not record.skus))]

    def _bucket_cells(self, pair: Pair, bucket_key: Bucket, head: JobRecord) -> int:
        """Leaf cells of the pair's sku one placement of a bucket's jobs takes (0 when unknown)."""
        if bucket_key[0] != "same":
            return 0  # a job of its own (no single shape): not cached, its key is never seen again
        cache = self.core._bucket_demand
        cells = cache.get((pair, bucket_key))
        if cells is None:
            cells = 0
            if head.shape is not None and head.groups[0].gang and pair[1] is not None:
                cells = self.core._cells_for(head.pending_groups[0].tasks, pair[1])
            elif head.shape is not None and pair[1] is not None:
                cells = self.core._cells_for(head.pending_groups[0].tasks[:1], pair[1])
            cache[(pair, bucket_key)] = cells
        return cells

    def _lane_full_check(self, pair: Pair) -> Callable[[JobRecord], bool] | None:
        """A test telling, before a job is tried, that no job from it on in the list can be placed now.

        Opportunistic list: no free cell of the sku anywhere. A VC's list (a VC without pinned
        cells): its guaranteed work holds its whole quota of the sku, and the job (like every
        job after it, the list being in priority order) has no lower-priority guaranteed work
        of the VC to preempt. None: no such shortcut for this list.
        """
        lane, sku = pair
        if sku is None:
            return None
        state = self.state
        if lane is None:
            totals = state.tree.sku_totals[sku]
            return lambda record: totals.free == 0 and not record.reserved and not record.victims
        vc = state.vcs.get(lane)
        if vc is None or vc.pinned or sku not in vc.sku_virtual:
            return None
        if any(record.vc == lane for record in self.core._reserving):
            return None  # a job of the VC waits to take its reserved cells: it must be reached
        holding = self.core._holding.get(lane, {})
        lowest: list[float] = []  # the lowest priority of the VC's guaranteed work holding cells, once needed

        def full(record: JobRecord) -> bool:
            if record.reserved or record.victims or vc.sku_virtual[sku] > vc.held.get(sku, 0):
                return False
            if not lowest:
                # Placing jobs of this list adds holders no lower than the jobs still to come: computed once.
                lowest.append(min((job.priority for job in holding if not job.opportunistic), default=float("inf")))
            return lowest[0] >= record.priority

        return full

    def _note_unseen(self, pair: Pair, lane_pass: LanePass) -> None:
        """Jobs of the list no pass has looked at yet, not reached in this one, get their reason.

        They were not reached because nothing they may use is left, an aged gang holds them
        back, or a job of their bucket ahead of them did not fit: each would not fit now.
        """
        core, decisions = self.core, self.decisions
        epoch = self.state.epoch
        blockers = lane_pass.blockers
        for record in list(self.queues.fresh.get(pair, ())):
            if record.queue.seen_epoch == epoch:
                continue
            record.queue.seen_epoch = epoch
            self.queues.looked_at(record)
            if record.preempting or not record.waiting or core._jobs.get(record.id) is not record:
                continue
            if record.never is not None:
                if record.queue.reason_key is None:
                    core._waits.set_reason(record, reasons.never(record.never), decisions)
                continue
            blocker = _blocked_by(record, blockers) if blockers else None
            if blocker is not None:
                self._note_behind(record, blocker)
                continue
            group = record.pending_groups[0]
            unplaced = [t for t in group.tasks if (t.role, t.index) not in record.placed]
            core._waits.fail(record, group, unplaced, decisions)
            self._age(record, lane_pass.now, lane_pass)

    def _age(self, record: JobRecord, now: float, lane_pass: LanePass) -> None:
        """A gang that waited long enough for cells stops the backfill behind it."""
        notes = record.queue
        reason = notes.reason_key
        if notes.blocking == 0 and now >= notes.gang_deadline and notes.failed_epoch >= 0 \
                and record.waiting and reason is not None and reason[0] in ("vc", "idle"):
            cells = reason[-1]
            assert isinstance(cells, int)
            notes.blocking = cells
            self.core._blocking.setdefault(self.queues.lane_of(record), {})[record] = None
            self.queues.not_due(record)
        if notes.blocking and record.waiting and record.id not in lane_pass.blocking_ids:
            lane_pass.blockers.append(record)
            lane_pass.blocking_ids.add(record.id)

    def _may_fit_now(self, record: JobRecord) -> bool:
        """False when nothing the job may use was freed since it last failed to fit (it would fail again)."""
        failed = record.queue.failed_epoch
        if failed < 0 or record.victims or record.reserved:
            return True
        if self.falling_back and failed == self.failed_before_fallback and fallback_kind(self.policy, record):
            return True  # it found no room in its VC in this pass: now it may fall back
        state = self.state
        if record.opportunistic:
            return any(state.freed_anywhere.get(sku, -1) >= failed for sku in record.skus)
        in_vc = state.freed_in_vc
        vc = state.vcs[record.vc]
        fallback = fallback_kind(self.policy, record)
        outside = state.freed_anywhere if fallback == "idle" else state.freed_unbound if fallback else None
        return any(in_vc.get((record.vc, sku), -1) >= failed
                   or (state.freed_unbound.get(sku, -1) >= failed and vc.may_bind(sku))
                   or (outside is not None and outside.get(sku, -1) >= failed)
                   for sku in record.skus)


def _blocked_by(record: JobRecord, blockers: list[JobRecord]) -> JobRecord | None:
    """An aged gang of the same lane, ahead in the queue, that competes for one of the job's skus.

    In the opportunistic lane (one for the whole cluster) only a gang of the job's own VC holds
    it back: one VC's big opportunistic gang does not stop every VC's opportunistic work, which
    under a sustained overload would leave idle cells unused while the gang waits for enough
    of them at once. The gang still gets the cells its own VC's later jobs would have taken.
    """
    key = record.key
    for blocker in blockers:
        if blocker.key < key and not blocker.skus_set.isdisjoint(record.skus) and (
                not blocker.opportunistic or blocker.vc == record.vc):
            return blocker
    return None

