"""The HiveD-style cell scheduler: events in, decisions out, nothing else.

Contract for callers:
- `handle(*events)` applies the events in order, then runs one scheduling pass
  (unless every event was a Restore) and returns the decisions of the whole call.
- Restore events come first, before any other event, one per running attempt.
- Same events and same clock readings give the same decisions: nothing here
  reads the wall clock, uses randomness or depends on hash order.

Policy:
- Queue order is priority (higher first), then arrival, in one lane per VC for
  guaranteed jobs and one lane for opportunistic jobs; in a VC's lane, within a
  priority, the user with the smallest dominant share of the VC goes first
  (`fair_share`, default on; fairness.py), then arrival. Each pass walks the lanes
  whose cells changed and tries the waiting jobs in order, so a gang that does not
  fit does not block smaller jobs behind it. Jobs asking for the same thing share a
  bucket (queues.py): a pass looks only at bucket heads, in queue order, and leaves a
  bucket at its first job that does not fit, so its cost follows the number of
  buckets and of jobs placed, not the queue's length. A job is not tried again until
  cells it may use were freed since it last failed, nor when a job at least as large
  already failed in the same pass (cells only get scarcer within a pass).
- Anti-starvation: a gang (an affinity group of two or more tasks placed together)
  that has waited `gang_priority_after_s` seconds (default 600) stops the backfill
  behind it: later jobs of its VC (or, for an opportunistic gang, later
  opportunistic jobs) that compete for one of its skus wait until it is placed, so
  the cells that free up go to it. Age is looked at whenever the gang's queue is,
  and on every Tick: the service sends Ticks so this happens in quiet times too.
- Guaranteed jobs (priority >= 0) use only their VC's cells: cells bound to the VC
  (lazily, by buddy allocation) up to its quota, or its pinned cells for jobs
  naming a pinnedCellId. Opportunistic jobs (priority -1) use idle cells anywhere.
- Opportunistic admission (no thrash; see services/scheduler/cluster/README.md):
  idle cells no VC holds first, holes in VC cells only when none will do; a preempted
  job queues again at the back of the opportunistic lane (`requeue_at_back`, default
  on), behind the jobs that waited while it ran; a job
  preempted `opportunistic_preemption_budget` times (default 2) waits for cells no
  VC holds, and so does one with a task of half a node or more but less than a
  whole one (`large_borrowers_unheld`, default on). An aged opportunistic gang holds
  back only its own VC's opportunistic jobs. When the pass finds no usable cell left for a queue list it stops walking
  it (only jobs not yet seen get a reason), so long queues stay cheap.
- Compaction before binding: a guaranteed job goes into the free cells of the VC
  cells already bound, then takes opportunistic work in them (youngest first), and
  only then binds another of its quota's cells (`compact_before_binding`, default on).
  Borrowed work in a VC's holes would otherwise push its small jobs into new cells
  until no whole cell is left for its large ones (a sharing anomaly).
- Binding where no VC needs the bigger cell (`bind_anywhere`, default on): a VC cell may
  be cut out of any free bigger cell whose type no VC's quota asks for (a node out of a
  whole idle rack), so binding takes idle cells before borrowed ones.
- Shape fallback (`shape_fallback`: None, "idle" or "unheld", the default): a guaranteed job that
  its VC's unused quota holds in count but no mode above can place (every cell the VC
  holds has some of its work on it, and it may bind no more) runs at once on idle
  cells outside its quota, as borrowed work: opportunistic while it runs (preemptible,
  not counted in the quota); preempted, it is queued again as guaranteed. It is tried
  in a second walk of the pass, after every VC's list, and that walk preempts nothing,
  so no job takes back in the same pass what a fallback job got. "unheld": only cells
  no VC holds, where it is the least likely to be taken back. A job preempted
  `opportunistic_preemption_budget` times falls back only onto such cells.
- Preemption, tried only when a job cannot be placed on free cells: first
  opportunistic work on the cells the job needs (any VC), the most recently
  started first and no more than needed, then guaranteed jobs of
  the same VC with a lower priority. A lower-priority job with lazy preemption is
  first downgraded to opportunistic (it keeps running) and killed only if the
  preemptor still cannot be placed without its cells. The preemptor's cells are
  reserved for it until the victims' Release arrives.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from typing import Callable

from libs.common.messages import TaskPlacement
from libs.common.schedule import ScheduleEntry
from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core import reasons
from services.scheduler.core.cells import Cell
from services.scheduler.core.decisions import Announce, Decision, Place, Preempt, Wait
from services.scheduler.core.demand import GroupDemand, TaskDemand, leaf_cells_for
from services.scheduler.core.eligibility import candidate_skus, never_fits
from services.scheduler.core.fairness import FairShare
from services.scheduler.core.events import (
    Cancel,
    NodeHealth,
    NotSent,
    RefreshReasons,
    Release,
    Restore,
    SchedulerEvent,
    Submit,
    Tick,
)
from services.scheduler.core.invariants import check_invariants
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.lifecycle import (
    CANCELLED_FROM,
    PREEMPTED_FROM,
    AttemptState,
    move,
    waiting_state,
)
from services.scheduler.core.planner import Plan, plan_guaranteed, plan_opportunistic
from services.scheduler.core.preemption import plan_with_victims
from services.scheduler.core.queues import Queues
from services.scheduler.core.search import View
from services.scheduler.core.state import ClusterState, VcRecord
from services.scheduler.core.status import VcStatus, vc_status

GANG_PRIORITY_AFTER_S = 600.0
# After this many preemptions an opportunistic job waits for cells no VC holds (see plan_opportunistic).
OPPORTUNISTIC_PREEMPTION_BUDGET = 2
# Compaction (a guaranteed job taking borrowers in its VC's own cells) gives way to binding another cell
# of its quota when its victims ran longer than this many GPU-hours in all (see _costly_compaction).
COMPACTION_COST_LIMIT_GPU_H = 5.0
# The adaptive idle reserve (see _reserve_for): (window_s, min_gpu_h, most_leaves), and how long the
# opportunistic job first in the queue must have waited (a sustained overload) before it holds.
ADAPTIVE_RESERVE = (48 * 3600.0, 8.0, 512)
RESERVE_AFTER_WAITING_S = 6 * 3600.0

# An attempt's wait is announced (JobWaiting) once it has waited this long (see Announce): a burst's
# jobs, placed within a second or two, are never announced; the reason is stored when queued all the same.
ANNOUNCE_WAIT_AFTER_S = 5.0

# Where a guaranteed job that fits its VC's unused quota in count but in no shape the VC's cells allow
# may run as borrowed work (see _place_tasks): None (it waits), idle cells anywhere, or only idle
# cells no VC holds.
SHAPE_FALLBACKS = (None, "idle", "unheld")

_FREE, _TAKE_OPPO, _VICTIMS = "free", "oppo", "victims"
_FREE_BOUND, _OPPO_BOUND = "free-bound", "oppo-bound"  # inside the cells the VC holds, binding none


class _LanePass:
    """What one scheduling pass learns about a lane, shared by its sku lists."""

    __slots__ = ("now", "blockers", "blocking_ids", "failed_shapes", "cut_off_by")

    def __init__(self, now: float):
        self.now = now
        self.blockers: list[JobRecord] = []  # aged gangs met so far, in queue order
        self.blocking_ids: set[str] = set()
        # The shape fallback's walk: the aged gangs as it began. A VC's list is cut off at the first of
        # them for the whole walk, even once it is placed (see _fallback_pass).
        self.cut_off_by: list[JobRecord] | None = None
        self.failed_shapes: list[tuple[frozenset, tuple, int]] = []  # (skus, shape, priority) that did not fit


class SchedulerCore:
    def __init__(self, config: ClusterConfig, *, clock: Callable[[], float],
                 gang_priority_after_s: float = GANG_PRIORITY_AFTER_S,
                 opportunistic_preemption_budget: int = OPPORTUNISTIC_PREEMPTION_BUDGET,
                 compact_before_binding: bool = True, shape_fallback: str | None = "unheld",
                 bucketed: bool = True, bind_anywhere: bool = True, large_borrowers_unheld: bool = True,
                 requeue_at_back: bool = True,
                 compaction_cost_limit: float | None = COMPACTION_COST_LIMIT_GPU_H,
                 adaptive_reserve: tuple[float, float, int] | None = ADAPTIVE_RESERVE,
                 reserve_after_waiting_s: float | None = RESERVE_AFTER_WAITING_S,
                 announce_wait_after_s: float = ANNOUNCE_WAIT_AFTER_S, fair_share: bool = True):
        # Compaction gives way to binding when it would throw away more than this many GPU-hours (see
        # _costly_compaction); None: compaction always comes first.
        self._compaction_limit = compaction_cost_limit
        # (window_s, min_gpu_h, most_leaves): opportunistic jobs leave idle as many cells no VC holds as the
        # borrowers a guaranteed job killed in the last window_s held, counting only kills that threw
        # away min_gpu_h or more, at most most_leaves (see _reserve_for). None: no reserve. With one VC
        # every borrower is the VC's own work, so there is nobody else's binding to keep cells for.
        self._adaptive = adaptive_reserve if len(config.virtualClusters) > 1 else None
        # The reserve holds only while the opportunistic job first in the queue has waited this long (a
        # sustained overload); None: whenever there were costly kills.
        self._reserve_after = reserve_after_waiting_s
        self._announce_after = announce_wait_after_s
        # (queued_at, job, attempt) of attempts queued while announcements wait, oldest first.
        self._unannounced: collections.deque[tuple[float, str, int]] = collections.deque()
        self._costly_kills: dict[str, collections.deque] = {}  # sku -> (when, leaves) of costly kills
        self._reserve_now: dict[str, int] = {}  # sku -> the reserve last computed
        self.config = config
        # False: every waiting job is a bucket of its own, so a pass tries each in queue order (a plain
        # scan). Slower under long queues; the reference the bucketed pass is tested to decide as.
        self._bucketed = bucketed
        self._clock = clock
        self._gang_after = gang_priority_after_s
        self._preemption_budget = opportunistic_preemption_budget
        self._compact = compact_before_binding
        # An opportunistic group asking for half a node or more goes only to cells no VC holds (see
        # _large_borrower), as one over its preemption budget does.
        # With one VC every borrower is that VC's own work, taken back only by its own guaranteed
        # jobs: keeping it off the VC's idle cells would only make it wait (`pai up`'s one-VC cluster).
        self._large_unheld = large_borrowers_unheld and len(config.virtualClusters) > 1
        # A preempted opportunistic job queues again at the back of the opportunistic lane, as a new
        # arrival would, instead of at its first arrival's place (see _release).
        self._requeue_at_back = requeue_at_back
        if shape_fallback not in SHAPE_FALLBACKS:
            raise ValueError(f"shape_fallback: one of {SHAPE_FALLBACKS}, not {shape_fallback!r}")
        self._fallback = shape_fallback
        self._falling_back = False  # in the second walk of a pass, where jobs may fall back
        # (VC list, bucket) -> None: buckets whose job found no room in its VC in this pass but may fall back.
        self._fallback_buckets: dict[tuple, None] = {}
        self._failed_before_fallback = -1  # the epoch of the first walk of the pass
        self._state = ClusterState(config)
        # Binding a VC cell may cut it out of any free bigger cell, not only out of the smallest bigger
        # one once no free cell of its type is left, where no VC's quota needs the bigger cells (see
        # Chain.bindable). Philly-like clusters (node quotas, racks no VC asks for): a VC binding a node
        # took the free nodes of split racks, which hold borrowers (killed by the binding), while the
        # nodes of whole idle racks stayed idle.
        self._state.bind_anywhere = bind_anywhere
        self._jobs: dict[str, JobRecord] = {}  # every attempt that waits or holds cells
        self._queues = Queues(list(self._state.vcs))  # attempts with tasks still to place
        # Within a priority of a VC's lane, the user holding the smallest share of the VC first (fairness.py);
        # None: arrival order.
        self._fair = FairShare({name: dict(vc.sku_guaranteed) for name, vc in self._state.vcs.items()},
                               self._fair_demand, self._queues.reorder) if fair_share else None
        self._sku_lanes: dict[str, list[str]] = {}  # sku -> VCs that have cells of it
        for name, vc in self._state.vcs.items():
            for sku in vc.skus:
                self._sku_lanes.setdefault(sku, []).append(name)
        self._holding: dict[str, dict[JobRecord, None]] = {}  # VC -> attempts holding cells of it
        # Opportunistic attempts holding cells, oldest first (by placed_at, seq) once sorted: guaranteed
        # jobs take the youngest first (see _plan_taking_youngest) without sorting them all each time.
        self._oppo_by_age: dict[JobRecord, None] = {}
        self._oppo_sorted = True
        self._preemptor_of: dict[str, JobRecord] = {}  # victim job id -> the job waiting for its cells
        self._reserving: dict[JobRecord, None] = {}  # attempts holding reservations (waiting for victims)
        self._blocking: dict[str | None, dict[JobRecord, None]] = {}  # lane -> its aged gangs (see _age)
        self._bucket_demand: dict[tuple, int] = {}  # ((lane, sku), bucket) -> leaf cells it takes (_bucket_cells)
        self._next_seq = 0
        self._started = False
        self._not_sent: dict[tuple[str, str], Decision] = {}  # (kind, job) -> decision to give again
        self.restore_warnings: list[str] = []

    # --- public API ----------------------------------------------------------------------

    def handle(self, *events: SchedulerEvent) -> list[Decision]:
        decisions: list[Decision] = []
        run_pass = False
        refresh: RefreshReasons | None = None
        for event in events:
            match event:
                case Restore():
                    self._restore(event)
                    continue
                case NotSent(decision=decision):
                    self._not_sent[(type(decision).__name__, decision.job)] = decision
                    continue
                case RefreshReasons():
                    refresh = event
                    continue
                case Submit():
                    self._submit(event)
                case Release():
                    self._release(event)
                case Cancel():
                    self._cancel(event)
                case NodeHealth():
                    self._node_health(event)
                case Tick():
                    self._queues.mark_due(self._clock())
                case _:
                    raise TypeError(f"not a scheduler event: {event!r}")
            self._started = True
            run_pass = True
        if run_pass:
            decisions.extend(self._schedule())
            decisions.extend(self._again())
            decisions.extend(self._announcements_due())
        if refresh is not None:
            decisions.extend(self._refreshed_reasons(refresh.older_than))
        return decisions

    def waiting_reason(self, job: str) -> str | None:
        record = self._jobs.get(job)
        if record is None or not record.waiting or record.reason_text is None:
            return None
        return record.reason_text(self._queues.position(record))

    def entry(self, job: str) -> ScheduleEntry | None:
        """What is recorded about the job's current attempt (pai_schedule); None: nothing."""
        record = self._jobs.get(job)
        if record is None:
            return None
        placed = bool(record.sent)
        return ScheduleEntry(
            job=record.id,
            attempt=record.attempt,
            vc=record.vc,
            placed=placed,
            reason="" if placed else (self.waiting_reason(job) or "queued"),
            tasks=list(record.sent.values()),
            updatedAt=self._clock(),
            spec=record.spec,
            queuedAt=record.submitted_at,
            borrowed=record.borrowed,
        )

    def knows(self, job: str) -> bool:
        return job in self._jobs

    def queued_count(self, vc: str | None = None) -> int:
        """Attempts waiting for (more) cells; with `vc`, only that VC's guaranteed ones."""
        if vc is not None:
            return len(self._queues.lanes.get(vc, ()))
        return sum(len(queue) for queue in self._queues.lanes.values())

    def node_names(self) -> list[str]:
        return list(self._state.tree.nodes)

    def vc_status(self) -> list[VcStatus]:
        return vc_status(self._state, self._jobs.values())

    def validate_state(self) -> None:
        check_invariants(self._state, self._jobs, self._queues)
        if self._fair is not None and not self._fair.pending_refresh:
            queued = [record for queue in self._queues.lanes.values() for record in queue]
            expected = self._fair.expected_tags(queued, self._jobs.values())
            for record in queued:
                if record.fair != expected.get(record, 0):
                    raise AssertionError(f"{record} has fair tag {record.fair}, its user's share says "
                                         f"{expected.get(record, 0)}")

    # --- events ------------------------------------------------------------------------------

    def _new_record(self, job: str, attempt: int, spec, *, seq: int | None = None,
                    submitted_at: float | None = None) -> JobRecord:
        if seq is None:
            seq = self._next_seq
            self._next_seq += 1
        record = JobRecord(job, attempt, spec, seq=seq, now=self._clock(), submitted_at=submitted_at)
        record.never = never_fits(self.config, self._state, record)
        vc = self._state.vcs.get(record.vc)
        if vc is not None:
            record.skus = list(dict.fromkeys(
                sku for group in record.groups for sku in candidate_skus(self._state, record, vc, group)))
            record.skus_set = frozenset(record.skus)
        if record.spec.gangAllocation and any(len(group.tasks) > 1 for group in record.groups):
            record.gang_deadline = record.queued_at + self._gang_after
        record.shape = self._shape(record)
        if self._announce_after > 0:
            self._unannounced.append((record.queued_at, job, attempt))
        return record

    def _enqueue(self, record: JobRecord) -> None:
        record.bucket = self._bucket_of(record)
        if self._fair is not None:
            self._fair.queued(record)
        self._queues.add(record)

    def _dequeue(self, record: JobRecord) -> None:
        if self._queues.remove(record) and self._fair is not None:
            self._fair.dequeued(record)

    def _fair_demand(self, record: JobRecord) -> dict[str, int]:
        """Leaf cells per sku the attempt's unplaced tasks ask for, each group on the sku of its VC where
        they weigh least (fair tags: fairness.py); nothing for a job that can never be placed."""
        vc = self._state.vcs.get(record.vc)
        if vc is None or record.never is not None:
            return {}
        fair = self._fair
        demand: dict[str, int] = {}
        for group in record.pending_groups:
            tasks = [task for task in group.tasks if (task.role, task.index) not in record.placed]
            options = [(fair.share(record.vc, {sku: cells}), sku, cells) for sku in candidate_skus(
                self._state, record, vc, group) if vc.sku_guaranteed.get(sku, 0) > 0
                for cells in (self._cells_for(tasks, sku),)]
            if tasks and options:
                _, sku, cells = min(options)
                demand[sku] = demand.get(sku, 0) + cells
        return demand

    def _submit(self, event: Submit) -> None:
        existing = self._jobs.get(event.job)
        if existing is not None:
            if existing.attempt >= event.attempt or existing.holds_cells or existing.victims:
                return  # a redelivery, or an attempt the launcher has not released yet
            self._drop(existing, f"attempt {event.attempt} submitted")
        record = self._new_record(event.job, event.attempt, event.spec, submitted_at=event.at)
        self._jobs[event.job] = record
        self._enqueue(record)

    def _release(self, event: Release) -> None:
        record = self._jobs.get(event.job)
        if record is None or record.attempt != event.attempt:
            return
        cancelled = record.cancelled
        preempted = record.preempting
        self._drop(record, "released, requeued" if event.requeue and not cancelled else "released")
        if event.requeue and not cancelled:
            again = self._new_record(record.id, record.attempt + 1, record.spec, seq=record.seq,
                                     submitted_at=record.submitted_at)
            again.preemptions = record.preemptions + (1 if preempted else 0)
            if self._requeue_at_back and preempted and again.opportunistic:
                # Opportunistic jobs wait when no idle cell is left (Philly 5x: 98% of their queueing
                # delay accrues while no GPU is idle); the cells that free up then go to them one at a time, in
                # queue order. At its first arrival's place a preempted job, which has run already, went
                # before every job that arrived while it ran and has never run. At the back it waits as a
                # new arrival would (FIFO from its preemption: no starvation). The place lives in the
                # core's memory only, as the preemption count does. Figures: the cluster README.
                again.order = self._next_seq
                self._next_seq += 1
            self._jobs[record.id] = again
            self._enqueue(again)

    def _cancel(self, event: Cancel) -> None:
        record = self._jobs.get(event.job)
        if record is None:
            return
        if record.holds_cells:
            # The launcher stops it and sends Release.
            cancelled = CANCELLED_FROM.get(record.state, AttemptState.CANCELLED)
            if record.state is not cancelled:
                move(record, cancelled, "cancelled")
            self._drop_reservations(record)
            self._dequeue(record)
            return
        self._drop(record, "cancelled")

    def _node_health(self, event: NodeHealth) -> None:
        node = self._state.tree.nodes.get(event.node)
        if node is None or node.healthy == event.healthy:
            return
        self._state.set_node_health(node, event.healthy, event.reason)

    def _note_holding(self, record: JobRecord) -> None:
        self._holding.setdefault(record.vc, {})[record] = None
        if self._fair is not None:
            self._fair.holding(record)
        if record.opportunistic:
            self._note_opportunistic(record)
        record.held_skus = frozenset(leaves[0].sku for leaves in record.placed.values())

    def _drop(self, record: JobRecord, why: str) -> None:
        """Forget an attempt: free its cells and reservations, leave the queue."""
        state = self._state
        units = []
        for leaves in record.placed.values():
            for leaf in leaves:
                state.set_leaf(leaf, job=None, reserved_for=leaf.reserved_for)
                units.append(leaf.unit)
        record.placed = {}
        self._holding.get(record.vc, {}).pop(record, None)
        if self._fair is not None:
            self._fair.released(record)
        self._oppo_by_age.pop(record, None)
        self._drop_reservations(record)
        for unit in dict.fromkeys(units):
            state.unbind_if_idle(unit)
        self._stop_blocking(record)
        self._dequeue(record)
        if self._jobs.get(record.id) is record:
            del self._jobs[record.id]
        preemptor = self._preemptor_of.pop(record.id, None)
        if preemptor is not None:
            preemptor.victims.discard(record.id)
            self._queues.mark(self._queues.lane_of(preemptor), preemptor.skus)
        for victim in record.victims:
            self._preemptor_of.pop(victim, None)
        record.victims = set()
        move(record, AttemptState.RELEASED, why)

    def _drop_reservations(self, record: JobRecord) -> None:
        state = self._state
        units = []
        for _, _, plan in record.reserved:
            for leaves in plan:
                for leaf in leaves:
                    if leaf.reserved_for is record:
                        state.set_leaf(leaf, job=leaf.job, reserved_for=None)
                        units.append(leaf.unit)
        record.reserved = []
        self._reserving.pop(record, None)
        for unit in dict.fromkeys(units):
            state.unbind_if_idle(unit)

    # --- restore ------------------------------------------------------------------------------

    def _restore(self, event: Restore) -> None:
        from services.scheduler.core.restore import restore_attempt

        if self._started:
            self.restore_warnings.append(f"{event.job}: Restore after other events; applied anyway")
        existing = self._jobs.get(event.job)
        if existing is not None:
            self._drop(existing, f"attempt {event.attempt} restored")
        record = self._new_record(event.job, event.attempt, event.spec)
        record.restored = True
        record.placed_at = float("-inf")
        self._jobs[event.job] = record
        self.restore_warnings.extend(restore_attempt(self._state, record, event.tasks, borrowed=event.borrowed))
        record.sent = {(t.role, t.index): t for t in event.tasks if (t.role, t.index) in record.placed}
        if record.placed:
            self._note_holding(record)
        if record.pending_groups:
            self._enqueue(record)
        if not record.placed and not record.pending_groups:
            move(record, AttemptState.RELEASED, "restored with nothing left to run")
            del self._jobs[event.job]
        else:
            self._settle(record, "restored")

    # --- scheduling pass --------------------------------------------------------------------

    def _schedule(self) -> list[Decision]:
        if self._fair is not None:
            self._fair.refresh()  # what the events changed: the pass walks current fair tags
        decisions = self._walk()
        if self._fair is not None:
            self._fair.refresh()  # what the pass changed: positions and reasons read until the next one
        return decisions

    def _walk(self) -> list[Decision]:
        decisions: list[Decision] = []
        state = self._state
        queues = self._queues
        for freed in state.freed_since_pass:
            if freed[0] == "vc":
                queues.mark(freed[1], (freed[2],))
            elif freed[0] == "unbound":
                # Cells no VC holds only help VCs that may still bind more of that sku.
                for vc in self._sku_lanes.get(freed[1], ()):
                    if state.vcs[vc].may_bind(freed[1]):
                        queues.mark(vc, (freed[1],))
            else:
                queues.mark(None, (freed[1],))
                if self._fallback is not None:
                    # Idle cells anywhere: guaranteed jobs of VCs with quota left may fall back onto them.
                    for vc in self._sku_lanes.get(freed[1], ()):
                        record = state.vcs[vc]
                        if record.held.get(freed[1], 0) < record.sku_virtual.get(freed[1], 0):
                            queues.mark(vc, (freed[1],))
        if self._adaptive is not None:
            for sku in self._costly_kills:
                before = self._reserve_now.get(sku, 0)
                if self._reserve_for(sku) < before:
                    queues.mark(None, (sku,))
                    state.freed_anywhere[sku] = state.epoch
        state.freed_since_pass.clear()
        state.epoch += 1
        self._queues.promote_due(self._clock(), self._may_age)
        lane_passes: dict[str | None, _LanePass] = {}
        dirty = queues.take_dirty()  # the VCs' lists, then the opportunistic ones
        for pair in dirty:
            if pair[0] is None and self._fallback_buckets:
                self._fallback_pass(decisions)
            self._run_list(pair, self._lane_pass(lane_passes, pair[0]), decisions)
        if self._fallback_buckets:
            self._fallback_pass(decisions)
        return decisions

    def _lane_pass(self, lane_passes: dict[str | None, _LanePass], lane: str | None, *,
                   cut_off: bool = False) -> _LanePass:
        lane_pass = lane_passes.get(lane)
        if lane_pass is None:
            lane_pass = lane_passes[lane] = _LanePass(self._clock())
            for blocker in sorted(self._blocking.get(lane, ()), key=lambda record: record.key):
                if blocker.waiting and self._jobs.get(blocker.id) is blocker:
                    lane_pass.blockers.append(blocker)
                    lane_pass.blocking_ids.add(blocker.id)
            if cut_off:
                lane_pass.cut_off_by = list(lane_pass.blockers)
        return lane_pass

    def _fallback_pass(self, decisions: list[Decision]) -> None:
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
        chosen: dict[tuple, set[tuple]] = {}
        for pair, bucket in self._fallback_buckets:
            chosen.setdefault(pair, set()).add(bucket)
        self._fallback_buckets = {}
        self._falling_back = True
        self._failed_before_fallback = self._state.epoch
        self._state.epoch += 1
        lane_passes: dict[str | None, _LanePass] = {}
        try:
            for pair in self._queues.in_pass_order(chosen):
                self._run_list(pair, self._lane_pass(lane_passes, pair[0], cut_off=True), decisions,
                               only=chosen[pair])
        finally:
            self._falling_back = False

    def _run_list(self, pair: tuple[str | None, str | None], lane_pass: _LanePass,
                  decisions: list[Decision], only: set[tuple] | None = None) -> None:
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
        epoch = self._state.epoch
        blockers = lane_pass.blockers
        for gone in [b for b in blockers if not (b.blocking and b.waiting)]:  # placed from another list
            blockers.remove(gone)
            lane_pass.blocking_ids.discard(gone.id)
        lane, sku = pair
        # Past the first aged gang that wants this sku, every job of the list is held back behind it. In the
        # opportunistic lane an aged gang holds back only its own VC's jobs (see _blocked_by): no cut-off.
        vc_lane = lane is not None
        cut_off_by = lane_pass.cut_off_by if lane_pass.cut_off_by is not None else blockers
        held_back_after = min((b.key for b in cut_off_by if sku in b.skus_set), default=None) if vc_lane else None
        full = self._lane_full_check(pair)
        buckets = self._queues.buckets.get(pair, {})
        # Opportunistic work only takes free cells: a bucket asking for more than are free is not looked at
        # (unless its head is a gang about to age: it must be looked at to start holding back backfill).
        free = self._state.tree.sku_totals[sku].free if lane is None and sku is not None else None
        # Entries (queue position, tie-break, bucket key, record): a bucket's next job (record None), a
        # job holding reservations (bucket key None), or a gang of a bucket left early that may age (both).
        heap: list[tuple] = []
        count = itertools.count()
        next_due = self._queues.next_due
        for bucket_key, members in buckets.items():
            head = members[0]
            if bucket_key[0] == "never" or (only is not None and bucket_key not in only):
                continue  # they only need a reason, given once
            if free is not None and self._bucket_cells(pair, bucket_key, head) > free and (
                    head.blocking or head.gang_deadline > lane_pass.now):
                gang = next_due(pair, bucket_key, None) if only is None else None
                if gang is not None:
                    heap.append((gang.key, next(count), bucket_key, gang))
                continue
            heap.append((head.key, next(count), bucket_key, None))
        for record in self._holding_reservations(pair) if only is None else ():
            heap.append((record.key, next(count), None, record))
        heapq.heapify(heap)
        cursor: dict[tuple, int] = {}
        while heap:
            _, _, bucket_key, record = heapq.heappop(heap)
            members = None
            if record is None:
                members = buckets.get(bucket_key)
                index = cursor.get(bucket_key, 0)
                if not members or index >= len(members):
                    continue
                record = members[index]
            elif record.seen_epoch == epoch or not (record.due or bucket_key is None):
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
            goes_on = self._visit(record, sku, lane_pass, decisions)
            if record.id in lane_pass.blocking_ids and not (record.blocking and record.waiting):
                # An aged gang placed (or gone) in this pass no longer holds anyone back.
                lane_pass.blocking_ids.discard(record.id)
                blockers.remove(record)
                if lane_pass.cut_off_by is None:
                    held_back_after = min((b.key for b in blockers if sku in b.skus_set),
                                          default=None) if vc_lane else None
            elif record.blocking and record.waiting and sku in record.skus_set and vc_lane:
                held_back_after = record.key if held_back_after is None else min(held_back_after, record.key)
            if members is not None and goes_on:
                if index < len(members) and members[index] is record:
                    index += 1  # still queued (waiting for its victims): the next one may fit elsewhere
                cursor[bucket_key] = index
                if index < len(members):
                    heapq.heappush(heap, (members[index].key, next(count), bucket_key, None))
            elif bucket_key is not None and only is None and not (record.blocking and record.waiting) and (
                    record.behind is None or record.behind not in lane_pass.blocking_ids):
                # The bucket is left here (or this gang did not age): the later jobs of the bucket would
                # not fit, but a gang among them old enough to hold back backfill must still be looked
                # at where it stands in the queue, or the jobs behind it would go ahead of it. (Not
                # when this one waits behind an aged gang: so does the rest of its bucket.)
                gang = next_due(pair, bucket_key, record.key)
                if gang is not None:
                    heapq.heappush(heap, (gang.key, next(count), bucket_key, gang))
        if only is None:
            self._note_unseen(pair, lane_pass, decisions)

    def _visit(self, record: JobRecord, sku: str | None, lane_pass: _LanePass, decisions: list[Decision]) -> bool:
        """Look at one job in a pass; False when the jobs behind it in its bucket cannot fit in this pass."""
        epoch = self._state.epoch
        if record.seen_epoch == epoch:
            # Already looked at from another sku list in this pass and still queued: it did not fit there.
            return bool(record.victims)
        record.seen_epoch = epoch
        self._queues.looked_at(record)
        if record.preempting or not record.waiting or self._jobs.get(record.id) is not record:
            return True  # a preempted job is queued again by its Release
        if record.never is not None:
            if record.reason_key is None:
                self._set_reason(record, reasons.never(record.never), decisions)
            return True
        now = lane_pass.now
        if not self._may_fit_now(record):
            # Nothing it may use was freed since it last failed: it keeps its reason.
            self._age(record, now, lane_pass)
            return False
        blockers = lane_pass.blockers
        if blockers and not record.victims and not record.reserved:
            if record.behind in lane_pass.blocking_ids:
                return False  # still behind the same gang
            blocker = self._blocked_by(record, blockers)
            if blocker is not None:
                self._note_behind(record, blocker, decisions)
                return False
        shape = record.shape
        if shape is not None and not record.victims and not record.reserved and any(
                record.skus_set <= skus and record.priority <= priority and _dominates(shape, failed)
                for skus, failed, priority in lane_pass.failed_shapes):
            # Cells only get scarcer during a pass: a job at least as large as one that failed fails too
            # (in its VC: it may still fall back, as the plain scan that tries it would find).
            self._note_fallback(record, self._state.vcs[record.vc], record.pending_groups[0].tasks)
            self._fail(record, record.pending_groups[0], record.pending_groups[0].tasks, decisions)
            self._age(record, now, lane_pass)
            return False
        self._try_place(record, decisions)
        failed = record.waiting and record.failed_epoch == epoch and not record.victims
        if shape is not None and failed and not self._kept_unheld(record) and (
                not self._falling_back or self._fallback_kind(record) == self._fallback):
            # (A job kept to cells no VC holds failing says nothing of one that may use a VC's idle cells,
            # a larger one included: a task of a whole node is no large borrower; nor a guaranteed job that
            # may not fall back, or only to cells no VC holds, of one that may.)
            lane_pass.failed_shapes.append((record.skus_set, shape, record.priority))
        self._age(record, now, lane_pass)
        return not failed

    def _note_behind(self, record: JobRecord, blocker: JobRecord, decisions: list[Decision]) -> None:
        if record.behind != blocker.id:
            record.behind = blocker.id
            self._set_reason(record, reasons.behind_gang(
                blocker.id, None if blocker.opportunistic else blocker.vc, blocker.queued_at,
                blocker.blocking, self._clock), decisions)

    def _holding_reservations(self, pair: tuple[str | None, str | None]) -> list[JobRecord]:
        """Queued jobs of the list whose victims are gone, to take their reserved cells (few).

        Those still waiting for a victim's Release have nothing to do until it comes.
        """
        lane, sku = pair
        lane_of = self._queues.lane_of
        return [record for record in self._reserving if not record.victims and record.waiting
                and lane_of(record) == lane and (sku in record.skus_set or (sku is None and not record.skus))]

    def _bucket_cells(self, pair: tuple[str | None, str | None], bucket_key: tuple, head: JobRecord) -> int:
        """Leaf cells of the pair's sku one placement of a bucket's jobs takes (0 when unknown)."""
        if bucket_key[0] != "same":
            return 0  # a job of its own (no single shape): not cached, its key is never seen again
        cells = self._bucket_demand.get((pair, bucket_key))
        if cells is None:
            cells = 0
            if head.shape is not None and head.spec.gangAllocation and pair[1] is not None:
                cells = self._cells_for(head.pending_groups[0].tasks, pair[1])
            elif head.shape is not None and pair[1] is not None:
                cells = self._cells_for(head.pending_groups[0].tasks[:1], pair[1])
            self._bucket_demand[(pair, bucket_key)] = cells
        return cells

    def _bucket_of(self, record: JobRecord) -> tuple:
        """Jobs of one bucket ask for the same thing: one fits only where the one before it fits."""
        if record.never is not None:
            return ("never",)
        if record.shape is None or not self._bucketed:
            return ("one", record.seq, record.id)
        return ("same", record.vc if record.opportunistic else None, record.shape, tuple(sorted(record.skus_set)),
                self._over_budget(record) if record.opportunistic else self._fallback_kind(record))

    def _lane_full_check(self, pair: tuple[str | None, str | None]) -> Callable[[JobRecord], bool] | None:
        """A test telling, before a job is tried, that no job from it on in the list can be placed now.

        Opportunistic list: no free cell of the sku anywhere. A VC's list (a VC without pinned
        cells): its guaranteed work holds its whole quota of the sku, and the job (like every
        job after it, the list being in priority order) has no lower-priority guaranteed work
        of the VC to preempt. None: no such shortcut for this list.
        """
        lane, sku = pair
        if sku is None:
            return None
        state = self._state
        if lane is None:
            totals = state.tree.sku_totals[sku]
            return lambda record: totals.free == 0 and not record.reserved and not record.victims
        vc = state.vcs.get(lane)
        if vc is None or vc.pinned or sku not in vc.sku_virtual:
            return None
        if any(record.vc == lane for record in self._reserving):
            return None  # a job of the VC waits to take its reserved cells: it must be reached
        holding = self._holding.get(lane, {})
        lowest: list[float] = []  # the lowest priority of the VC's guaranteed work holding cells, once needed

        def full(record: JobRecord) -> bool:
            if record.reserved or record.victims or vc.sku_virtual[sku] > vc.held.get(sku, 0):
                return False
            if not lowest:
                # Placing jobs of this list adds holders no lower than the jobs still to come: computed once.
                lowest.append(min((job.priority for job in holding if not job.opportunistic), default=float("inf")))
            return lowest[0] >= record.priority

        return full

    def _note_unseen(self, pair: tuple[str | None, str | None], lane_pass: _LanePass,
                     decisions: list[Decision]) -> None:
        """Jobs of the list no pass has looked at yet, not reached in this one, get their reason.

        They were not reached because nothing they may use is left, an aged gang holds them
        back, or a job of their bucket ahead of them did not fit: each would not fit now.
        """
        epoch = self._state.epoch
        blockers = lane_pass.blockers
        for record in list(self._queues.fresh.get(pair, ())):
            if record.seen_epoch == epoch:
                continue
            record.seen_epoch = epoch
            self._queues.looked_at(record)
            if record.preempting or not record.waiting or self._jobs.get(record.id) is not record:
                continue
            if record.never is not None:
                if record.reason_key is None:
                    self._set_reason(record, reasons.never(record.never), decisions)
                continue
            blocker = self._blocked_by(record, blockers) if blockers else None
            if blocker is not None:
                self._note_behind(record, blocker, decisions)
                continue
            group = record.pending_groups[0]
            self._fail(record, group, [t for t in group.tasks if (t.role, t.index) not in record.placed], decisions)
            self._age(record, lane_pass.now, lane_pass)

    def _age(self, record: JobRecord, now: float, lane_pass: _LanePass) -> None:
        """A gang that waited long enough for cells stops the backfill behind it."""
        if record.blocking == 0 and now >= record.gang_deadline and record.failed_epoch >= 0 \
                and record.waiting and record.reason_key is not None and record.reason_key[0] in ("vc", "idle"):
            record.blocking = record.reason_key[-1]
            self._blocking.setdefault(self._queues.lane_of(record), {})[record] = None
            self._queues.not_due(record)
        if record.blocking and record.waiting and record.id not in lane_pass.blocking_ids:
            lane_pass.blockers.append(record)
            lane_pass.blocking_ids.add(record.id)

    def _may_age(self, record: JobRecord) -> bool:
        """Whether a gang past its deadline may come to hold back backfill (see _age): not one that can
        never fit, nor one over its preemption budget (its reason is no wait for room)."""
        return record.never is None and not self._over_budget(record)

    def _stop_blocking(self, record: JobRecord) -> None:
        """The jobs held back behind this gang are looked at again."""
        if not record.blocking:
            return
        record.blocking = 0
        lane = self._queues.lane_of(record)
        self._blocking.get(lane, {}).pop(record, None)
        for other in self._queues.lanes.get(lane, ()):
            if other.behind == record.id:
                other.behind = None
                other.failed_epoch = -1
                self._queues.look_again(other)

    @staticmethod
    def _shape(record: JobRecord) -> tuple | None:
        if len(record.groups) != 1:
            return None
        tasks = record.groups[0].tasks
        first = tasks[0]
        if any((t.gpu, t.cpu, t.memoryMB) != (first.gpu, first.cpu, first.memoryMB) for t in tasks):
            return None
        at_once = len(tasks) if record.spec.gangAllocation else 1
        return (first.gpu, first.cpu, first.memoryMB, at_once, record.spec.pinnedCellId)

    def _may_fit_now(self, record: JobRecord) -> bool:
        """False when nothing the job may use was freed since it last failed to fit (it would fail again)."""
        failed = record.failed_epoch
        if failed < 0 or record.victims or record.reserved:
            return True
        if self._falling_back and failed == self._failed_before_fallback and self._fallback_kind(record):
            return True  # it found no room in its VC in this pass: now it may fall back
        state = self._state
        if record.opportunistic:
            return any(state.freed_anywhere.get(sku, -1) >= failed for sku in record.skus)
        in_vc = state.freed_in_vc
        vc = state.vcs[record.vc]
        fallback = self._fallback_kind(record)
        outside = state.freed_anywhere if fallback == "idle" else state.freed_unbound if fallback else None
        return any(in_vc.get((record.vc, sku), -1) >= failed
                   or (state.freed_unbound.get(sku, -1) >= failed and vc.may_bind(sku))
                   or (outside is not None and outside.get(sku, -1) >= failed)
                   for sku in record.skus)

    def _set_reason(self, record: JobRecord, reason: reasons.Reason, decisions: list[Decision]) -> None:
        key, text = reason
        record.reason_text = text
        if key[0] != "behind":
            record.behind = None
        if key != record.reason_key:
            record.reason_key = key
            decisions.append(self._wait(record))

    def _wait(self, record: JobRecord) -> Wait:
        """The Wait to give now; it also announces the wait of an attempt not yet placed that has
        waited long enough and was not announced (else _announcements_due does, when it has)."""
        reason = record.reason_text(self._queues.position(record))
        first = (not record.wait_given and not record.sent
                 and self._clock() - record.queued_at >= self._announce_after)
        record.wait_given = record.wait_given or first
        record.reason_given = reason
        record.reason_given_at = self._clock()
        return Wait(job=record.id, attempt=record.attempt, vc=record.vc, reason=reason, first=first)

    def _announcements_due(self) -> list[Decision]:
        """Announce the attempts, queued long enough ago, that still wait for their first cells
        with a reason given and not yet announced. One queued without a reason given yet is dropped
        here: its first Wait, later than this, announces it (see _wait)."""
        due = self._clock() - self._announce_after
        announcements: list[Decision] = []
        while self._unannounced and self._unannounced[0][0] <= due:
            _, job, attempt = self._unannounced.popleft()
            record = self._jobs.get(job)
            if (record is None or record.attempt != attempt or record.wait_given or record.sent
                    or not record.waiting or record.reason_given_at == float("-inf")):
                continue
            record.wait_given = True
            announcements.append(self._announce(record))
        return announcements

    @staticmethod
    def _announce(record: JobRecord) -> Announce:
        return Announce(job=record.id, attempt=record.attempt, vc=record.vc, reason=record.reason_given)

    def _refreshed_reasons(self, older_than: float) -> list[Decision]:
        waits: list[Decision] = []
        given_before = self._clock() - older_than
        for record in self._jobs.values():
            if record.sent or not record.waiting or record.reason_text is None or record.reason_given_at > given_before:
                continue
            if record.reason_text(self._queues.position(record)) != record.reason_given:
                waits.append(self._wait(record))
        return waits

    def _again(self) -> list[Decision]:
        """The decisions the shell could not carry out, as they stand now (see NotSent)."""
        decisions: list[Decision] = []
        for (_, job), decision in self._not_sent.items():
            record = self._jobs.get(job)
            if record is None or record.attempt != decision.attempt:
                continue  # released meanwhile: nothing left to say
            match decision:
                case Place() if record.sent:
                    decisions.append(Place(job=job, attempt=record.attempt, vc=record.vc,
                                           tasks=list(record.sent.values()), partial=bool(record.pending_groups)))
                case Preempt() if record.preempting:
                    decisions.append(decision)
                case Wait() if not record.sent and record.reason_text is not None:
                    record.wait_given = record.wait_given and not decision.first
                    decisions.append(self._wait(record))
                case Announce() if not record.sent and record.waiting:
                    decisions.append(self._announce(record))
        self._not_sent.clear()
        return decisions

    def _try_place(self, record: JobRecord, decisions: list[Decision]) -> None:
        if record.victims:
            self._set_reason(record, reasons.for_victims(record), decisions)
            return
        placements: list[TaskPlacement] = []
        if record.reserved:
            placements.extend(self._take_reservations(record))
        vc = self._state.vcs[record.vc]
        for group in list(record.pending_groups):
            skus = candidate_skus(self._state, record, vc, group)
            pending = [task for task in group.tasks if (task.role, task.index) not in record.placed]
            chunks = [pending] if record.spec.gangAllocation else [[task] for task in pending]
            failed = None
            for tasks in chunks:
                outcome = self._place_tasks(record, vc, tasks, skus, decisions)
                if outcome is None:
                    failed = tasks
                    break
                if outcome == "preempting":
                    break
                placements.extend(outcome)
            if all((task.role, task.index) in record.placed for task in group.tasks):
                record.pending_groups.remove(group)
            if record.victims:
                self._set_reason(record, reasons.for_victims(record), decisions)
                break
            if failed is not None:
                self._fail(record, group, failed, decisions)
                break
        if placements:
            if record.placed_at is None:
                record.placed_at = self._clock()
            self._note_holding(record)
            record.sent.update(((p.role, p.index), p) for p in placements)
            decisions.append(Place(job=record.id, attempt=record.attempt, vc=record.vc, tasks=placements,
                                   partial=bool(record.pending_groups)))
        if not record.pending_groups:
            record.reason_text = None
            record.reason_key = None
            self._stop_blocking(record)
            self._dequeue(record)
        self._settle(record, reasons.BORROWED.format(vc=record.vc) if record.borrowed and placements else None)

    @staticmethod
    def _settle(record: JobRecord, why: str | None) -> None:
        """Move a waiting or placed attempt to the state its cells, reservations and victims make it."""
        state = waiting_state(record)
        if state is record.state:
            return
        if why is None:
            match state:
                case AttemptState.PREEMPTING:
                    why = "preempting " + ", ".join(sorted(record.victims)) if record.victims else "reserved cells"
                case AttemptState.PLACED:
                    why = "every task placed"
                case AttemptState.PARTLY_PLACED:
                    why = "some tasks placed, more to place"
                case _:
                    why = "reserved cells lost"
        move(record, state, why)

    def _fail(self, record: JobRecord, group: GroupDemand, tasks: list[TaskDemand], decisions: list[Decision]) -> None:
        record.failed_epoch = self._state.epoch
        vc = self._state.vcs[record.vc]
        skus = candidate_skus(self._state, record, vc, group)
        cells = self._cells_for(tasks, skus[0])
        if self._over_budget(record):
            key = ("unheld", tuple(skus), cells)
            if key != record.reason_key or record.reason_text is None:
                self._set_reason(record, reasons.unheld_only(cells, skus, record.preemptions, self._idle_counts(skus)),
                                 decisions)
            return
        key = ("idle", tuple(skus), cells) if record.opportunistic else ("vc", vc.name, tuple(skus), cells)
        if key != record.reason_key or record.reason_text is None:
            if record.opportunistic and self._large_borrower(skus[0], max(self._cells_for([t], skus[0]) for t in tasks)):
                reason = reasons.unheld_large(cells, skus, self._idle_counts(skus))
            else:
                reason = reasons.waiting_for_room(self._state, record, vc, skus, cells,
                                                  lambda: self._reserved_now(skus))
            self._set_reason(record, reason, decisions)

    def _over_budget(self, record: JobRecord) -> bool:
        """An opportunistic job preempted often enough to be kept off cells a VC's quota holds."""
        return record.opportunistic and record.preemptions >= self._preemption_budget

    def _kept_unheld(self, record: JobRecord) -> bool:
        """An opportunistic job kept to cells no VC holds on some sku it may use (over its budget, or a
        large borrower there): its failing tells nothing of jobs that may use a VC's idle cells."""
        if not record.opportunistic or not record.pending_groups:
            return False
        if self._over_budget(record):
            return True
        tasks = record.pending_groups[0].tasks
        return any(self._large_borrower(sku, max(self._cells_for([task], sku) for task in tasks))
                   for sku in record.skus)

    def _large_borrower(self, sku: str, largest_task: int) -> bool:
        """Opportunistic work with a task of half a node or more, not a whole one: only on cells no VC holds.

        Such a borrower can only take the holes of VC cells, which their VC takes back as soon
        as its guaranteed work grows (compaction); on the Philly replay at 8x, 4-GPU borrowers
        that had run for days in such holes were a third of the work thrown away. On cells no
        VC holds it is taken back only when a VC must bind a cell and no idle one is left.
        """
        node = self._state.tree.sku_max_node_leaves.get(sku, 0)
        return self._large_unheld and node > largest_task and largest_task * 2 >= node

    def _idle_counts(self, skus: list[str]) -> Callable[[], tuple[int, int, int]]:
        tree = self._state.tree

        def counts() -> tuple[int, int, int]:
            unheld = sum(self._unheld_idle(sku) for sku in skus)
            idle = sum(tree.sku_totals[sku].free for sku in skus if sku in tree.sku_totals)
            return unheld, idle, self._reserved_now(skus)

        return counts

    def _reserved_now(self, skus: list[str]) -> int:
        """Idle cells no VC holds that the adaptive reserve kept from opportunistic work in the last pass."""
        return sum(min(self._reserve_now.get(sku, 0), self._unheld_idle(sku)) for sku in skus)

    def _unheld_idle(self, sku: str) -> int:
        """Idle leaf cells of the sku that no VC holds."""
        return sum(chain.unbound_free for chain in self._state.tree.sku_chains.get(sku, ()))

    @staticmethod
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

    def _cells_for(self, tasks: list[TaskDemand], sku: str) -> int:
        sku_type = self.config.skuTypes[sku]
        return sum(leaf_cells_for(task, sku_type) for task in tasks)

    # --- what can never fit ------------------------------------------------------------------

    # --- placing ----------------------------------------------------------------------------

    def _place_tasks(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand], skus: list[str],
                     decisions: list[Decision]) -> list[TaskPlacement] | str | None:
        """Place these tasks together: their placements, "preempting", or None (they wait)."""
        if record.opportunistic:
            modes = (_FREE,)
        elif self._falling_back:
            modes = ()  # it found no room in its VC earlier in this pass (nor would the rest of its bucket)
        elif self._compact:
            modes = (_FREE_BOUND, _OPPO_BOUND, _FREE, _TAKE_OPPO, _VICTIMS)
        else:
            modes = (_FREE, _TAKE_OPPO, _VICTIMS)
        max_node = self._state.tree.sku_max_node_leaves
        if len(skus) > 1:
            # Any sku will do: the one with the most free cells first (shortest wait, spreads the load).
            if record.opportunistic:
                totals = self._state.tree.sku_totals
                skus = sorted(skus, key=lambda sku: -totals[sku].free)
            else:
                skus = sorted(skus, key=lambda sku: vc.held.get(sku, 0) - vc.sku_virtual.get(sku, 0))
        shapes = []
        for sku in skus:
            sku_type = self.config.skuTypes[sku]
            cells = [leaf_cells_for(task, sku_type) for task in tasks]
            order = sorted(range(len(tasks)), key=lambda i: -cells[i])
            sizes = [cells[i] for i in order]
            if sizes[0] <= max_node.get(sku, 0):
                shapes.append((sku, order, sizes, sum(sizes), self._quota_free(record, vc, sku)))
        for mode in modes:
            for sku, order, sizes, total, quota_free in shapes:
                if record.opportunistic:
                    plan = plan_opportunistic(self._state, sku, sizes, View(),
                                              unheld_only=self._over_budget(record) or self._large_borrower(sku, sizes[0]),
                                              reserve=self._reserve_for(sku))
                elif mode == _VICTIMS:
                    plan = plan_with_victims(self._state, record, vc, sku, sizes, self._holding.get(vc.name, ()),
                                             quota_free)
                    if plan is not None:  # lower-priority jobs lazily downgraded are opportunistic work now
                        for job in self._holding.get(vc.name, ()):
                            if job.opportunistic:
                                self._note_opportunistic(job)
                elif quota_free < total:
                    continue  # the VC's quota is used up: only preemption inside it can help
                elif mode == _TAKE_OPPO or mode == _OPPO_BOUND:
                    if self._state.tree.sku_totals[sku].oppo == 0:
                        continue  # no opportunistic work to take: the same as the first try
                    plan = self._plan_taking_youngest(record, vc, sku, sizes, bind=mode == _TAKE_OPPO)
                    if mode == _OPPO_BOUND and plan is not None and self._costly_compaction(record, vc, sku, plan):
                        continue  # bind a free cell, or take younger borrowers where binding may (_TAKE_OPPO)
                else:
                    plan = plan_guaranteed(self._state, record, vc, sku, sizes, View(), bind=mode == _FREE)
                if plan is None:
                    continue
                ordered_tasks = [tasks[i] for i in order]
                return self._commit(record, vc, ordered_tasks, plan, sku, decisions)
        fallback = self._fallback_kind(record)
        if not self._falling_back:
            self._note_fallback(record, vc, tasks)
        elif fallback is not None and not record.placed and not record.reserved:
            # Shape fallback: the VC's unused quota holds the job in count, but every cell the VC holds
            # has some of its work on it and it may bind no more, so no mode above found room. Rather
            # than wait for one of its own jobs to end, it runs now on idle cells, as borrowed work:
            # opportunistic while it runs (preemptible, not counted in the quota); a preemption
            # queues it again as guaranteed (its spec's class).
            for sku, order, sizes, total, quota_free in shapes:
                if quota_free < total:
                    continue  # over its quota: not a shape problem
                plan = plan_opportunistic(self._state, sku, sizes, View(), unheld_only=fallback == "unheld")
                if plan is None:
                    continue
                self._stop_blocking(record)  # while its VC's lane still holds it
                self._dequeue(record)  # it leaves its VC's lane; every task is placed below
                record.opportunistic = True
                record.borrowed = True
                return self._commit(record, vc, [tasks[i] for i in order], plan, sku, decisions)
        return None

    def _note_fallback(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand]) -> bool:
        """A job that found no room in its VC in the first walk of a pass: whether it may fall back in
        the second (its bucket is then walked again, see _fallback_pass). Only when its VC's unused
        quota holds it in count: beyond its quota it is not a matter of shape."""
        if self._fallback_kind(record) is None or record.placed or record.reserved or record.victims:
            return False
        if not any(self._quota_free(record, vc, sku) >= self._cells_for(tasks, sku) for sku in record.skus):
            return False
        self._fallback_buckets.update(dict.fromkeys(((record.vc, sku), record.bucket) for sku in record.skus))
        return True

    def _fallback_kind(self, record: JobRecord) -> str | None:
        """Where this guaranteed job may run as borrowed work when its VC's cells have no room for its
        shape (see _place_tasks): None (nowhere), "idle" or "unheld". Known at submission (the bucket
        key holds it): a job placed all at once (one group, gang or a single task), not pinned, not
        restored; one preempted as often as an opportunistic job's budget allows goes only to cells
        no VC holds."""
        if self._fallback is None or record.opportunistic or record.restored or record.spec.pinnedCellId is not None:
            return None
        if len(record.groups) != 1 or not (record.spec.gangAllocation or len(record.groups[0].tasks) == 1):
            return None
        return "unheld" if record.preemptions >= self._preemption_budget else self._fallback

    @staticmethod
    def _age_key(record: JobRecord) -> tuple[float, int]:
        return (record.placed_at if record.placed_at is not None else float("-inf"), record.seq)

    def _note_opportunistic(self, record: JobRecord) -> None:
        by_age = self._oppo_by_age
        if record in by_age:
            return
        if by_age and self._oppo_sorted:
            last = next(reversed(by_age))
            if self._age_key(record) < self._age_key(last):
                self._oppo_sorted = False  # a restored or downgraded job: sorted when next needed
        by_age[record] = None

    def _youngest_opportunistic(self):
        """Opportunistic attempts holding cells, youngest first."""
        if not self._oppo_sorted:
            self._oppo_by_age = dict.fromkeys(sorted(self._oppo_by_age, key=self._age_key))
            self._oppo_sorted = True
        return reversed(self._oppo_by_age)

    def _plan_taking_youngest(self, record: JobRecord, vc: VcRecord, sku: str, sizes: list[int], *,
                              bind: bool = True) -> Plan | None:
        """Free cells plus those of the fewest most recently started opportunistic jobs that make the job fit.

        Opportunistic work restarts from scratch when preempted, so taking the youngest
        jobs throws away the least GPU time. A longer prefix of the youngest-first list
        only adds usable leaves, so the shortest prefix that fits is found by doubling,
        then bisection: O(log n) searches for n running opportunistic jobs.
        """
        state = self._state
        # A tried plan binds cells and gives them back, which reorders the buddy free lists; they are put
        # back in order after each try, so every try (and the final plan) starts from the same state.
        # Without binding, no free list is touched: nothing to put back.
        chains = state.tree.sku_chains.get(sku, ()) if bind else ()
        order = [(chain, {name: list(cells) for name, cells in chain.free.items()}) for chain in chains]

        def put_back() -> None:
            for chain, lists in order:
                chain.free = {name: dict.fromkeys(cells) for name, cells in lists.items()}

        # Whether it fits at all with every opportunistic job gone (counters only, no list to build).
        plan = plan_guaranteed(state, record, vc, sku, sizes, View(take_oppo=True), bind=bind)
        if plan is None:
            return None
        plan.abandon()
        put_back()
        name = vc.name

        def usable(job: JobRecord) -> bool:
            # Only leaves bound to no VC or to this one can become the job's.
            return any(leaf.sku == sku and ((bind and leaf.unit is None) or (leaf.unit is not None and leaf.unit.vc == name))
                       for leaf in job.leaves())

        candidates = (job for job in self._youngest_opportunistic()
                      if job.opportunistic and not job.preempting and sku in job.held_skus and usable(job))
        running: list[JobRecord] = []

        def take(count: int) -> int:
            """Make the youngest-first list at least `count` long if there are so many; its length."""
            while len(running) < count:
                job = next(candidates, None)
                if job is None:
                    break
                running.append(job)
            return len(running)

        def plan_with(count: int) -> Plan | None:
            extra = [leaf for job in running[:count] for leaf in job.leaves() if leaf.sku == sku]
            return plan_guaranteed(state, record, vc, sku, sizes, View(extra_leaves=extra), bind=bind)

        def fits(count: int) -> bool:
            plan = plan_with(count)
            if plan is not None:
                plan.abandon()
            put_back()
            return plan is not None

        # The shortest prefix that fits: doubling, then bisection; the list is only read as far as needed.
        failed, enough = 0, take(1)
        while True:
            if enough == 0:
                return None
            if fits(enough):
                break
            longer = take(enough * 2)
            if longer == enough:
                return None  # even with every usable opportunistic job gone it does not fit
            failed, enough = enough, longer
        while enough - failed > 1:
            middle = (failed + enough) // 2
            if fits(middle):
                enough = middle
            else:
                failed = middle
        return plan_with(enough)

    def _costly_compaction(self, record: JobRecord, vc: VcRecord, sku: str, plan: Plan) -> bool:
        """Whether compaction's victims threw away more GPU time than the limit while the VC may still bind.

        Compaction takes the youngest borrowers in the VC's own cells, but those may be all old:
        a 4-GPU borrower whose unheld node the VC bound later can sit in its hole for days and
        then be killed for a 1-GPU job (Philly 8x: most of the work lost was of this kind, with a
        borrower on cells no VC holds started minutes before). Giving way, the job binds a free
        cell or takes the youngest borrowers of the VC's cells and cells no VC holds together.
        """
        if self._compaction_limit is None or not vc.may_bind(sku):
            return False
        now = self._clock()
        victims = {leaf.job for leaves in plan.leaves for leaf in leaves if leaf.job not in (None, record)}
        return sum(_cell_hours_run(job, now) for job in victims) > self._compaction_limit

    def _reserve_for(self, sku: str) -> int:
        """Idle cells no VC holds that opportunistic work leaves alone now (the adaptive reserve).

        Under overload every cell no VC holds runs borrowers, so a VC binding a cell kills one or
        binds it with borrowers that stay in its holes until its work grows. Kept idle, the
        reserve lets it bind without either. It grows with the borrowers that a take-back killed
        after long runs and drains as those kills age out of the window, so it costs nothing
        where take-backs are cheap. It holds only in a sustained overload, while the opportunistic
        job first in the queue has waited `reserve_after_waiting_s`: a short burst (Philly 5x: the
        first one never waits 6 h) also has costly kills, but there idle cells left to borrowers
        cost less delay than the reserve saves work (5x: 18 s average delay with the gate, 25-94 s
        without, for every size tried).
        """
        if self._adaptive is None:
            return 0
        window, _, most = self._adaptive
        kills = self._costly_kills.get(sku)
        if not kills:
            return 0
        now = self._clock()
        while kills and kills[0][0] < now - window:
            kills.popleft()
        reserve = min(most, sum(k[1] for k in kills))
        if reserve and self._reserve_after is not None:
            lane = self._queues.lanes.get(None)
            if not lane or now - lane[0].queued_at < self._reserve_after:
                reserve = 0
        self._reserve_now[sku] = reserve
        return reserve

    def _note_kills(self, record: JobRecord, victims, sku: str) -> None:
        """Remember the borrowers a guaranteed job kills after a long run (they size the reserve)."""
        if self._adaptive is None or record.opportunistic:
            return
        now = self._clock()
        for job in victims:
            if not job.opportunistic:
                continue
            if _cell_hours_run(job, now) >= self._adaptive[1]:
                leaves = sum(len(cells) for cells in job.placed.values())
                self._costly_kills.setdefault(sku, collections.deque()).append((now, leaves))

    @staticmethod
    def _quota_free(record: JobRecord, vc: VcRecord, sku: str) -> int:
        """Leaf cells of the VC's quota (or pinned cell) its guaranteed work does not hold."""
        if record.opportunistic:
            return 0
        if record.spec.pinnedCellId is not None:
            pinned = vc.pinned.get(record.spec.pinnedCellId)
            return pinned.leaf_count - pinned.held if pinned is not None else 0
        return vc.sku_virtual.get(sku, 0) - vc.held.get(sku, 0)

    def _commit(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand], plan: Plan, sku: str,
                decisions: list[Decision]) -> list[TaskPlacement] | str:
        state = self._state
        for quota, cell in plan.new_units:
            state.bind(vc, quota, cell, taken=True)
        victims: dict[JobRecord, None] = {}
        for leaves in plan.leaves:
            for leaf in leaves:
                if leaf.job is not None and leaf.job is not record:
                    victims[leaf.job] = None
        if not victims:
            placements = []
            for task, leaves in zip(tasks, plan.leaves):
                for leaf in leaves:
                    state.set_leaf(leaf, job=record, reserved_for=None)
                record.placed[(task.role, task.index)] = leaves
                placements.append(self._placement(task, leaves, sku))
            self._unbind_unused(plan)
            return placements
        for leaves in plan.leaves:
            for leaf in leaves:
                state.set_leaf(leaf, job=leaf.job, reserved_for=record)
        self._unbind_unused(plan)
        group = next(g for g in record.groups if any(t in g.tasks for t in tasks))
        record.reserved.append((group, tasks, plan.leaves))
        self._reserving[record] = None
        self._note_kills(record, victims, sku)
        for victim in sorted(victims, key=lambda j: j.seq):
            self._preempt(victim, record, decisions)
        return "preempting"

    def _unbind_unused(self, plan: Plan) -> None:
        """VC cells bound while searching that the final placement does not use go back at once."""
        state = self._state
        for _, cell in plan.new_units:
            state.unbind_if_idle(cell)
            if cell.vc is not None and cell.free + cell.oppo > 0:
                # The VC keeps a new cell with room left in it: for its other jobs that is as if cells were
                # freed in the VC. A job that failed before, when the VC may still bind, cannot now (if this
                # was its last cell to bind) and is tried again only for cells freed since it failed.
                state.freed_in_vc[(cell.vc, cell.sku)] = state.epoch

    def _placement(self, task: TaskDemand, leaves: list[Cell], sku: str) -> TaskPlacement:
        node = leaves[0].node
        gpus = sorted(gpu for leaf in leaves for gpu in leaf.gpus) if task.gpu > 0 else []
        return TaskPlacement(role=task.role, index=task.index, node=node.name, hostIp=node.host_ip, gpus=gpus,
                             leafCells=[leaf.address for leaf in leaves], skuType=sku)

    def _take_reservations(self, record: JobRecord) -> list[TaskPlacement]:
        """The victims are gone: run on the reserved cells if they are still good, else plan again."""
        state = self._state
        usable = all(leaf.job is None and leaf.reserved_for is record and leaf.node.healthy
                     for _, _, plan in record.reserved for leaves in plan for leaf in leaves)
        if not usable:
            self._drop_reservations(record)
            return []
        placements = []
        for group, tasks, plan in record.reserved:
            for task, leaves in zip(tasks, plan):
                for leaf in leaves:
                    state.set_leaf(leaf, job=record, reserved_for=None)
                record.placed[(task.role, task.index)] = leaves
                placements.append(self._placement(task, leaves, leaves[0].sku))
            if group in record.pending_groups and all((t.role, t.index) in record.placed for t in group.tasks):
                record.pending_groups.remove(group)
        record.reserved = []
        self._reserving.pop(record, None)
        return placements

    # --- preemption ---------------------------------------------------------------------------

    def _preempt(self, victim: JobRecord, by: JobRecord, decisions: list[Decision]) -> None:
        if victim.borrowed:
            why = (f"job preempted on borrowed cells: VC {by.vc} needs them for guaranteed job {by.id}; "
                   f"it waits again as a guaranteed job of VC {victim.vc}")
        elif victim.opportunistic:
            why = f"opportunistic job preempted: VC {by.vc} needs these cells for guaranteed job {by.id}"
        else:
            why = f"preempted in VC {victim.vc} by job {by.id} of higher priority ({by.priority} > {victim.priority})"
        state = PREEMPTED_FROM.get(victim.state, AttemptState.BEING_PREEMPTED)
        self._state.refresh_job_leaves(victim, lambda: move(victim, state, f"preempted by {by.id}"))
        self._dequeue(victim)
        by.victims.add(victim.id)
        self._preemptor_of[victim.id] = by
        decisions.append(Preempt(job=victim.id, attempt=victim.attempt, vc=victim.vc, by=by.id, reason=why))



def _cell_hours_run(job: JobRecord, now: float) -> float:
    """The work a preemption of `job` would throw away: hours run x leaf cells held (GPU-hours for GPU skus).

    A restored attempt's start is unknown (`placed_at` is -inf): it counts as infinitely costly.
    """
    return (now - job.placed_at) * sum(len(leaves) for leaves in job.placed.values()) / 3600


def _dominates(shape: tuple, failed: tuple) -> bool:
    """Whether a job of `shape` needs at least what a job of shape `failed` needed (same pinning)."""
    return (shape[4] == failed[4] and shape[0] >= failed[0] and shape[1] >= failed[1] and shape[2] >= failed[2]
            and shape[3] >= failed[3])
