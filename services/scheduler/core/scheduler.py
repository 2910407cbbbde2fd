"""The HiveD-style cell scheduler: events in, decisions out, nothing else.

Contract for callers:
- `handle(*events)` applies the events in order, then runs one scheduling pass
  (unless every event was a Restore) and returns the decisions of the whole call.
- Restore events come first, before any other event, one per running attempt.
- Same events and same clock readings give the same decisions: nothing here
  reads the wall clock, uses randomness or depends on hash order.

Where things are (the rules themselves: policy.py):
- this module: the events (submit, release, cancel, node health, restore), the core's
  books (attempts, who holds cells of each VC, reservations, aged gangs), and carrying
  out a placement: `_try_place` asks placing.py for a plan and commits it (`Placed`), or
  reserves its cells and preempts the victims (`Reserved`);
- passes.py: the walk of one scheduling pass, an object per pass;
- placing.py: the placement modes (`PlacementMode`), one planner each;
- rules.py: small rules about one attempt; borrowers.py: opportunistic work by age and
  the adaptive reserve; waits.py: reasons, Wait and Announce;
- queues.py, fairness.py: queue order; state.py, cells.py, planner.py, search.py,
  preemption.py: the cells and how tasks fit them; jobs.py, lifecycle.py: the attempts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from libs.common.messages import TaskPlacement
from libs.common.protocol.model import JobSpec
from libs.common.schedule import ScheduleEntry
from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core import reasons
from services.scheduler.core.borrowers import Borrowers, IdleReserve
from services.scheduler.core.cells import Cell
from services.scheduler.core.decisions import Decision, Place, Preempt
from services.scheduler.core.demand import TaskDemand
from services.scheduler.core.eligibility import candidate_skus, never_fits
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
from services.scheduler.core.fairness import FairShare
from services.scheduler.core.invariants import check_invariants
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.lifecycle import (
    CANCELLED_FROM,
    PREEMPTED_FROM,
    AttemptState,
    move,
    waiting_state,
)
from services.scheduler.core.passes import SchedulingPass
from services.scheduler.core.placing import Choice, Outcome, Placed, PlacementMode, PlanContext, Reserved, choose
from services.scheduler.core.policy import SchedulingPolicy
from services.scheduler.core.queues import Pair, Queues
from services.scheduler.core.rules import bucket_of, cells_for, fallback_kind, quota_free, shape_of
from services.scheduler.core.state import ClusterState, Quota, VcRecord
from services.scheduler.core.status import VcStatus, vc_status
from services.scheduler.core.waits import Waits

DEFAULT_POLICY = SchedulingPolicy()


class SchedulerCore:
    def __init__(self, config: ClusterConfig, *, clock: Callable[[], float],
                 policy: SchedulingPolicy = DEFAULT_POLICY):
        self.config = config
        self.policy = policy = policy.for_cluster(len(config.virtualClusters))
        self._clock = clock
        self._state = ClusterState(config, bind_anywhere=policy.bind_anywhere)
        self._jobs: dict[str, JobRecord] = {}  # every attempt that waits or holds cells
        self._queues = Queues(list(self._state.vcs))  # attempts with tasks still to place
        # Within a priority of a VC's lane, the user holding the smallest share of the VC first (fairness.py);
        # None: arrival order.
        self._fair = FairShare({name: dict(vc.sku_guaranteed) for name, vc in self._state.vcs.items()},
                               self._fair_demand, self._queues.retag) if policy.fair_share else None
        self._sku_lanes: dict[str, list[str]] = {}  # sku -> VCs that have cells of it
        for name, vc in self._state.vcs.items():
            for sku in vc.skus:
                self._sku_lanes.setdefault(sku, []).append(name)
        self._holding: dict[str, dict[JobRecord, None]] = {}  # VC -> attempts holding cells of it
        self._borrowers = Borrowers()  # opportunistic attempts holding cells, by age
        self._reserve = IdleReserve(policy.adaptive_reserve, policy.reserve_after_waiting_s, clock=clock,
                                    tree=self._state.tree, first_waiting=self._first_opportunistic_queued_at)
        self._planning = PlanContext(self._state, policy, clock, self._holding, self._borrowers, self._reserve)
        self._waits = Waits(policy, clock=clock, state=self._state, queues=self._queues, jobs=self._jobs,
                            reserve=self._reserve)
        self._preemptor_of: dict[str, JobRecord] = {}  # victim job id -> the job waiting for its cells
        self._reserving: dict[JobRecord, None] = {}  # attempts holding reservations (waiting for victims)
        self._blocking: dict[str | None, dict[JobRecord, None]] = {}  # lane -> its aged gangs (see passes._age)
        # ((lane, sku), bucket) -> leaf cells it takes (SchedulingPass._bucket_cells)
        self._bucket_demand: dict[tuple[Pair, tuple[object, ...]], int] = {}
        # (VC list, bucket) -> None: buckets whose job found no room in its VC in this pass but may fall back.
        self._fallback_buckets: dict[tuple[Pair, tuple[object, ...]], None] = {}
        self._next_seq = 0
        self._started = False
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
                    self._waits.not_sent[(type(decision).__name__, decision.job)] = decision
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
            decisions.extend(self._waits.again())
            decisions.extend(self._waits.announcements_due())
        if refresh is not None:
            decisions.extend(self._waits.refreshed_reasons(refresh.older_than))
        return decisions

    def waiting_reason(self, job: str) -> str | None:
        record = self._jobs.get(job)
        if record is None or not record.waiting or record.queue.reason_text is None:
            return None
        return record.queue.reason_text(self._queues.position(record))

    def entry(self, job: str) -> ScheduleEntry | None:
        """What is recorded about the job's current attempt (pai_schedule); None: nothing."""
        record = self._jobs.get(job)
        if record is None:
            return None
        placed = bool(record.told.sent)
        return ScheduleEntry(
            job=record.id,
            attempt=record.attempt,
            vc=record.vc,
            placed=placed,
            reason="" if placed else (self.waiting_reason(job) or "queued"),
            tasks=list(record.told.sent.values()),
            updatedAt=self._clock(),
            spec=record.spec,
            queuedAt=record.submitted_at,
            borrowed=record.borrowed,
            releasedTasks=sorted(record.released_tasks),
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
                if record.queue.fair != expected.get(record, 0):
                    raise AssertionError(f"{record} has fair tag {record.queue.fair}, its user's share says "
                                         f"{expected.get(record, 0)}")
            # Tags left 0 for users alone in their priority order the queue as their shares would.
            shares = self._fair.expected_tags(queued, self._jobs.values(), alone_too=True)
            for lane, queue in self._queues.lanes.items():
                by_share = sorted(queue, key=lambda record: (-record.priority, shares.get(record, 0), record.queue.order))
                if by_share != queue:
                    raise AssertionError(f"lane {lane!r} is in the order {queue}, its users' shares say {by_share}")

    # --- events ------------------------------------------------------------------------------

    def _new_record(self, job: str, attempt: int, spec: JobSpec, *, seq: int | None = None,
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
        if any(group.gang and len(group.tasks) > 1 for group in record.groups):
            record.queue.gang_deadline = record.queued_at + self.policy.gang_priority_after_s
        record.shape = shape_of(record)
        self._waits.queued(record)
        return record

    def _enqueue(self, record: JobRecord) -> None:
        record.queue.bucket = bucket_of(self.policy, record)
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
        fair = self._fair
        if vc is None or record.never is not None or fair is None:
            return {}
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

    def _first_opportunistic_queued_at(self) -> float | None:
        lane = self._queues.lanes.get(None)
        return lane[0].queued_at if lane else None

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
        if event.tasks and not event.requeue:
            self._release_tasks(record, event.tasks)
            return
        cancelled = record.cancelled
        preempted = record.preempting
        self._drop(record, "released, requeued" if event.requeue and not cancelled else "released")
        if event.requeue and not cancelled:
            again = self._new_record(record.id, record.attempt + 1, record.spec, seq=record.seq,
                                     submitted_at=record.submitted_at)
            again.preemptions = record.preemptions + (1 if preempted else 0)
            if self.policy.requeue_at_back and preempted and again.opportunistic:
                # Opportunistic jobs wait when no idle cell is left (Philly 5x: 98% of their queueing
                # delay accrues while no GPU is idle); the cells that free up then go to them one at a time, in
                # queue order. At its first arrival's place a preempted job, which has run already, went
                # before every job that arrived while it ran and has never run. At the back it waits as a
                # new arrival would (FIFO from its preemption: no starvation). The place lives in the
                # core's memory only, as the preemption count does. Figures: the cluster README.
                again.queue.order = self._next_seq
                self._next_seq += 1
            self._jobs[record.id] = again
            self._enqueue(again)

    def _release_tasks(self, record: JobRecord, tasks: list[tuple[str, int]]) -> None:
        """Some tasks ended for good while the attempt goes on (gangReleaseEnable: false): their cells
        are free now and they are never placed again in this attempt. The last cells an attempt holds
        go with its own Release (an attempt placed holds cells until then; lifecycle.py)."""
        state = self._state
        units = []
        for role, index in tasks:
            task = (role, index)
            leaves = record.placed.get(task)
            if leaves is None or record.preempting or (len(record.placed) == 1 and not record.pending_groups):
                continue  # not held (a redelivery), on its way to a preemptor, or the attempt's last cells
            for leaf in leaves:
                state.set_leaf(leaf, job=None, reserved_for=leaf.reserved_for)
                units.append(leaf.unit)
            del record.placed[task]
            record.told.sent.pop(task, None)
            record.released_tasks.add(task)
        if not units:
            return
        record.held_skus = frozenset(leaves[0].sku for leaves in record.placed.values() if leaves)
        if self._fair is not None:
            self._fair.holding(record)  # its user's share shrank
        for unit in dict.fromkeys(units):
            state.unbind_if_idle(unit)

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
            self._borrowers.note(record)
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
        self._borrowers.forget(record)
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

    def _stop_blocking(self, record: JobRecord) -> None:
        """The jobs held back behind this gang are looked at again."""
        if not record.queue.blocking:
            return
        record.queue.blocking = 0
        lane = self._queues.lane_of(record)
        self._blocking.get(lane, {}).pop(record, None)
        for other in self._queues.lanes.get(lane, ()):
            if other.queue.behind == record.id:
                other.queue.behind = None
                other.queue.failed_epoch = -1
                self._queues.look_again(other)

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
        self.restore_warnings.extend(restore_attempt(self._state, record, event.tasks, borrowed=event.borrowed,
                                                     released=event.released))
        record.told.sent = {(t.role, t.index): t for t in event.tasks if (t.role, t.index) in record.placed}
        if record.placed:
            self._note_holding(record)
        if record.pending_groups:
            self._enqueue(record)
        if not record.placed and not record.pending_groups:
            move(record, AttemptState.RELEASED, "restored with nothing left to run")
            del self._jobs[event.job]
        else:
            _settle(record, "restored")

    # --- the scheduling pass, and placing one job --------------------------------------------

    def _schedule(self) -> list[Decision]:
        if self._fair is not None:
            self._fair.refresh()  # what the events changed: the pass walks current fair tags
        decisions = SchedulingPass(self).run()
        if self._fair is not None:
            self._fair.refresh()  # what the pass changed: positions and reasons read until the next one
        return decisions

    def _cells_for(self, tasks: list[TaskDemand], sku: str) -> int:
        return cells_for(self.config, tasks, sku)

    def _try_place(self, record: JobRecord, decisions: list[Decision], *, falling_back: bool = False) -> None:
        """Place what the job still waits for, group by group, as far as its planners find room."""
        if record.victims:
            self._waits.set_reason(record, reasons.for_victims(record), decisions)
            return
        placements: list[TaskPlacement] = []
        if record.reserved:
            placements.extend(self._take_reservations(record))
        vc = self._state.vcs[record.vc]
        for group in list(record.pending_groups):
            skus = candidate_skus(self._state, record, vc, group)
            pending = [task for task in group.tasks
                       if (task.role, task.index) not in record.placed and (task.role, task.index) not in record.released_tasks]
            chunks = [pending] if group.gang else [[task] for task in pending]
            failed = None
            for tasks in chunks:
                outcome = self._place_tasks(record, vc, tasks, skus, decisions, falling_back=falling_back)
                if outcome is None:
                    failed = tasks
                    break
                if isinstance(outcome, Reserved):
                    break
                placements.extend(outcome.tasks)
            if all((task.role, task.index) in record.placed or (task.role, task.index) in record.released_tasks
                   for task in group.tasks):
                record.pending_groups.remove(group)
            if record.victims:
                self._waits.set_reason(record, reasons.for_victims(record), decisions)
                break
            if failed is not None:
                self._waits.fail(record, group, failed, decisions)
                break
        if placements:
            if record.placed_at is None:
                record.placed_at = self._clock()
            self._note_holding(record)
            record.told.sent.update(((p.role, p.index), p) for p in placements)
            decisions.append(Place(job=record.id, attempt=record.attempt, vc=record.vc, tasks=placements,
                                   partial=bool(record.pending_groups)))
        if not record.pending_groups:
            record.queue.reason_text = None
            record.queue.reason_key = None
            self._stop_blocking(record)
            self._dequeue(record)
        _settle(record, reasons.BORROWED.format(vc=record.vc) if record.borrowed and placements else None)

    def _place_tasks(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand], skus: list[str],
                     decisions: list[Decision], *, falling_back: bool) -> Outcome:
        """Place these tasks together: Placed, Reserved (victims stop first), or None (they wait)."""
        choice = choose(self._planning, record, vc, tasks, skus, falling_back=falling_back)
        if choice is None:
            if not falling_back:
                self._note_fallback(record, vc, tasks)
            return None
        if choice.mode is PlacementMode.BORROW:
            self._stop_blocking(record)  # while its VC's lane still holds it
            self._dequeue(record)  # it leaves its VC's lane; every task is placed below
            record.opportunistic = True
            record.borrowed = True
        return self._commit(record, vc, choice, decisions)

    def _note_fallback(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand]) -> bool:
        """A job that found no room in its VC in the first walk of a pass: whether it may fall back in
        the second (its bucket is then walked again, see SchedulingPass._fallback_walk). Only when its
        VC's unused quota holds it in count: beyond its quota it is not a matter of shape."""
        if fallback_kind(self.policy, record) is None or record.placed or record.reserved or record.victims:
            return False
        if not any(quota_free(record, vc, sku, tasks[0].pin) >= self._cells_for(tasks, sku) for sku in record.skus):
            return False
        self._fallback_buckets.update(dict.fromkeys(((record.vc, sku), record.queue.bucket) for sku in record.skus))
        return True

    def _commit(self, record: JobRecord, vc: VcRecord, choice: Choice, decisions: list[Decision]) -> Placed | Reserved:
        state, plan, tasks = self._state, choice.plan, choice.tasks
        for quota, cell in plan.new_units:
            state.bind(vc, quota, cell, taken=True)
        victims: dict[JobRecord, None] = {}
        for leaves in plan.leaves:
            for leaf in leaves:
                if leaf.job is not None and leaf.job is not record:
                    victims[leaf.job] = None
        if not victims:
            placements = []
            for task, leaves in zip(tasks, plan.leaves, strict=False):
                for leaf in leaves:
                    state.set_leaf(leaf, job=record, reserved_for=None)
                record.placed[(task.role, task.index)] = leaves
                placements.append(_placement(task, leaves, choice.sku))
            self._unbind_unused(plan.new_units)
            return Placed(placements)
        for leaves in plan.leaves:
            for leaf in leaves:
                state.set_leaf(leaf, job=leaf.job, reserved_for=record)
        self._unbind_unused(plan.new_units)
        group = next(g for g in record.groups if any(t in g.tasks for t in tasks))
        record.reserved.append((group, tasks, plan.leaves))
        self._reserving[record] = None
        if not record.opportunistic:
            self._reserve.note_kills(victims, choice.sku)
        ordered = sorted(victims, key=lambda j: j.seq)
        for victim in ordered:
            self._preempt(victim, record, decisions)
        return Reserved(tuple(victim.id for victim in ordered))

    def _unbind_unused(self, new_units: Sequence[tuple[Quota, Cell]]) -> None:
        """VC cells bound while searching that the final placement does not use go back at once."""
        state = self._state
        for _, cell in new_units:
            state.unbind_if_idle(cell)
            if cell.vc is not None and cell.free + cell.oppo > 0:
                # The VC keeps a new cell with room left in it: for its other jobs that is as if cells were
                # freed in the VC. A job that failed before, when the VC may still bind, cannot now (if this
                # was its last cell to bind) and is tried again only for cells freed since it failed.
                state.note_room_in_unit(cell)

    def _take_reservations(self, record: JobRecord) -> list[TaskPlacement]:
        """The victims are gone: run on the reserved cells if they are still good, else plan again."""
        state = self._state
        usable = all(leaf.job is None and leaf.reserved_for is record and leaf.node is not None and leaf.node.healthy
                     for _, _, plan in record.reserved for leaves in plan for leaf in leaves)
        if not usable:
            self._drop_reservations(record)
            return []
        placements = []
        for group, tasks, plan in record.reserved:
            for task, leaves in zip(tasks, plan, strict=False):
                for leaf in leaves:
                    state.set_leaf(leaf, job=record, reserved_for=None)
                record.placed[(task.role, task.index)] = leaves
                placements.append(_placement(task, leaves, leaves[0].sku))
            if group in record.pending_groups and all((t.role, t.index) in record.placed for t in group.tasks):
                record.pending_groups.remove(group)
        record.reserved = []
        self._reserving.pop(record, None)
        return placements

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


def _placement(task: TaskDemand, leaves: list[Cell], sku: str) -> TaskPlacement:
    node = leaves[0].node
    assert node is not None, f"{leaves[0].address} is no leaf"
    gpus = sorted(gpu for leaf in leaves for gpu in leaf.gpus) if task.gpu > 0 else []
    return TaskPlacement(role=task.role, index=task.index, node=node.name, hostIp=node.host_ip, gpus=gpus,
                         leafCells=[leaf.address for leaf in leaves], skuType=sku)
