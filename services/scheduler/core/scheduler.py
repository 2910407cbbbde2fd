"""The HiveD-style cell scheduler: events in, decisions out, nothing else.

Contract for callers:
- `handle(*events)` applies the events in order, then runs one scheduling pass
  (unless every event was a Restore) and returns the decisions of the whole call.
- Restore events come first, before any other event, one per running attempt.
- Same events and same clock readings give the same decisions: nothing here
  reads the wall clock, uses randomness or depends on hash order.

Policy:
- Queue order is priority (higher first), then arrival. Every waiting job is tried
  in that order at each pass, so a gang that does not fit does not block smaller
  jobs behind it.
- Anti-starvation: a gang (an affinity group of two or more tasks placed together)
  that has waited `gang_priority_after_s` seconds (default 600) stops the backfill
  behind it: later jobs of its VC (or, for an opportunistic gang, later
  opportunistic jobs) of the same or lower priority that compete for its sku wait
  until it is placed, so the cells that free up go to it.
- Guaranteed jobs (priority >= 0) use only their VC's cells: cells bound to the VC
  (lazily, by buddy allocation) up to its quota, or its pinned cells for jobs
  naming a pinnedCellId. Opportunistic jobs (priority -1) use idle cells anywhere.
- Preemption, tried only when a job cannot be placed on free cells: first
  opportunistic work on the cells the job needs (any VC), then guaranteed jobs of
  the same VC with a lower priority. A lower-priority job with lazy preemption is
  first downgraded to opportunistic (it keeps running) and killed only if the
  preemptor still cannot be placed without its cells. The preemptor's cells are
  reserved for it until the victims' Release arrives.
"""

from __future__ import annotations

from typing import Callable

from libs.common.messages import TaskPlacement
from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core import reasons
from services.scheduler.core.cells import Cell
from services.scheduler.core.decisions import Decision, Place, Preempt, Wait
from services.scheduler.core.demand import NO_FIT, GroupDemand, TaskDemand, leaf_cells_for
from services.scheduler.core.events import Cancel, NodeHealth, Release, Restore, SchedulerEvent, Submit, Tick
from services.scheduler.core.invariants import check_invariants
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.planner import Plan, plan_guaranteed, plan_opportunistic
from services.scheduler.core.search import View
from services.scheduler.core.state import ClusterState, VcRecord
from services.scheduler.core.status import VcSkuStatus, VcStatus

GANG_PRIORITY_AFTER_S = 600.0

_FREE, _TAKE_OPPO, _VICTIMS = "free", "oppo", "victims"


class SchedulerCore:
    def __init__(self, config: ClusterConfig, *, clock: Callable[[], float],
                 gang_priority_after_s: float = GANG_PRIORITY_AFTER_S):
        self.config = config
        self._clock = clock
        self._gang_after = gang_priority_after_s
        self._state = ClusterState(config)
        self._jobs: dict[str, JobRecord] = {}  # every attempt that waits or holds cells
        # Attempts with tasks still to place, in queue order, per lane: a VC for
        # guaranteed jobs (VCs do not compete for quota), None for opportunistic ones.
        self._lanes: dict[str | None, list[JobRecord]] = {}
        self._dirty_lanes: set[str | None] = set()
        self._sku_lanes: dict[str, list[str]] = {}  # sku -> VCs that have cells of it
        for name, vc in self._state.vcs.items():
            for sku in vc.skus:
                self._sku_lanes.setdefault(sku, []).append(name)
        self._holding: dict[str, dict[JobRecord, None]] = {}  # VC -> attempts holding cells of it
        self._preemptor_of: dict[str, JobRecord] = {}  # victim job id -> the job waiting for its cells
        self._next_seq = 0
        self._started = False
        self.restore_warnings: list[str] = []

    # --- public API ----------------------------------------------------------------------

    def handle(self, *events: SchedulerEvent) -> list[Decision]:
        decisions: list[Decision] = []
        run_pass = False
        for event in events:
            match event:
                case Restore():
                    self._restore(event)
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
                    self._dirty_lanes.update(self._lanes)
                case _:
                    raise TypeError(f"not a scheduler event: {event!r}")
            self._started = True
            run_pass = True
        if run_pass:
            decisions.extend(self._schedule())
        return decisions

    def waiting_reason(self, job: str) -> str | None:
        record = self._jobs.get(job)
        if record is None or not record.waiting or record.reason_text is None:
            return None
        return record.reason_text(self._position(record))

    def _position(self, record: JobRecord) -> int:
        """Waiting jobs ahead of this one in its lane (its VC, or the opportunistic queue)."""
        ahead = 0
        for other in self._lanes.get(self._lane_of(record), ()):
            if other is record:
                break
            if not other.preempting:
                ahead += 1
        return ahead

    @staticmethod
    def _lane_of(record: JobRecord) -> str | None:
        return None if record.opportunistic else record.vc

    def node_names(self) -> list[str]:
        return list(self._state.tree.nodes)

    def vc_status(self) -> list[VcStatus]:
        tree = self._state.tree
        used: dict[tuple[str, str], int] = {}
        oppo: dict[tuple[str, str], int] = {}
        for job in self._jobs.values():
            for leaf in job.leaves():
                counts = oppo if job.opportunistic else used
                counts[(job.vc, leaf.sku)] = counts.get((job.vc, leaf.sku), 0) + 1
        unhealthy: dict[str, int] = {}
        for node in tree.nodes.values():
            if not node.healthy:
                for cell in node.cells:
                    unhealthy[cell.sku] = unhealthy.get(cell.sku, 0) + cell.leaf_count
        queued: dict[str, int] = {}
        running: dict[str, int] = {}
        for job in self._jobs.values():
            if job.waiting:
                queued[job.vc] = queued.get(job.vc, 0) + 1
            if job.holds_cells:
                running[job.vc] = running.get(job.vc, 0) + 1
        result = []
        for name, vc in self._state.vcs.items():
            skus = list(vc.sku_guaranteed) + sorted({sku for (v, sku) in oppo if v == name} - set(vc.sku_guaranteed))
            result.append(VcStatus(
                name=name,
                skus=[VcSkuStatus(sku=sku, guaranteed=vc.sku_guaranteed.get(sku, 0), used=used.get((name, sku), 0),
                                  opportunistic=oppo.get((name, sku), 0), total=tree.sku_leaves.get(sku, 0),
                                  unhealthy=unhealthy.get(sku, 0)) for sku in skus],
                queued=queued.get(name, 0),
                running=running.get(name, 0),
            ))
        return result

    def validate_state(self) -> None:
        check_invariants(self._state, self._jobs, self._lanes)

    # --- events ------------------------------------------------------------------------------

    def _new_record(self, job: str, attempt: int, spec, *, seq: int | None = None) -> JobRecord:
        if seq is None:
            seq = self._next_seq
            self._next_seq += 1
        record = JobRecord(job, attempt, spec, seq=seq, now=self._clock())
        record.never = self._never_fits(record)
        vc = self._state.vcs.get(record.vc)
        if vc is not None:
            record.skus = list(dict.fromkeys(
                sku for group in record.groups for sku in self._candidate_skus(record, vc, group)))
            record.skus_set = frozenset(record.skus)
        if record.spec.gangAllocation and any(len(group.tasks) > 1 for group in record.groups):
            record.gang_deadline = record.queued_at + self._gang_after
        record.shape = self._shape(record)
        return record

    def _enqueue(self, record: JobRecord) -> None:
        key = record.key
        lane = self._lane_of(record)
        queue = self._lanes.setdefault(lane, [])
        self._dirty_lanes.add(lane)
        low, high = 0, len(queue)
        while low < high:
            middle = (low + high) // 2
            if queue[middle].key < key:
                low = middle + 1
            else:
                high = middle
        queue.insert(low, record)

    def _dequeue(self, record: JobRecord) -> None:
        lane = self._lane_of(record)
        queue = self._lanes.get(lane)
        if queue is None:
            return
        try:
            queue.remove(record)
        except ValueError:
            return
        self._dirty_lanes.add(lane)

    def _submit(self, event: Submit) -> None:
        existing = self._jobs.get(event.job)
        if existing is not None:
            if existing.attempt >= event.attempt or existing.holds_cells or existing.victims:
                return  # a redelivery, or an attempt the launcher has not released yet
            self._drop(existing)
        record = self._new_record(event.job, event.attempt, event.spec)
        self._jobs[event.job] = record
        self._enqueue(record)

    def _release(self, event: Release) -> None:
        record = self._jobs.get(event.job)
        if record is None or record.attempt != event.attempt:
            return
        self._drop(record)
        if event.requeue and not record.cancelled:
            again = self._new_record(record.id, record.attempt + 1, record.spec, seq=record.seq)
            self._jobs[record.id] = again
            self._enqueue(again)

    def _cancel(self, event: Cancel) -> None:
        record = self._jobs.get(event.job)
        if record is None:
            return
        if record.holds_cells:
            record.cancelled = True  # the launcher stops it and sends Release
            self._drop_reservations(record)
            self._dequeue(record)
            return
        self._drop(record)

    def _node_health(self, event: NodeHealth) -> None:
        node = self._state.tree.nodes.get(event.node)
        if node is None or node.healthy == event.healthy:
            return
        self._state.set_node_health(node, event.healthy, event.reason)

    def _note_holding(self, record: JobRecord) -> None:
        self._holding.setdefault(record.vc, {})[record] = None
        record.held_skus = frozenset(leaves[0].sku for leaves in record.placed.values())

    def _drop(self, record: JobRecord) -> None:
        """Forget an attempt: free its cells and reservations, leave the queue."""
        state = self._state
        units = []
        for leaves in record.placed.values():
            for leaf in leaves:
                state.set_leaf(leaf, job=None, reserved_for=leaf.reserved_for)
                units.append(leaf.unit)
        record.placed = {}
        self._holding.get(record.vc, {}).pop(record, None)
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
            self._dirty_lanes.add(self._lane_of(preemptor))
        for victim in record.victims:
            self._preemptor_of.pop(victim, None)
        record.victims = set()

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
        for unit in dict.fromkeys(units):
            state.unbind_if_idle(unit)

    # --- restore ------------------------------------------------------------------------------

    def _restore(self, event: Restore) -> None:
        from services.scheduler.core.restore import restore_attempt

        if self._started:
            self.restore_warnings.append(f"{event.job}: Restore after other events; applied anyway")
        existing = self._jobs.get(event.job)
        if existing is not None:
            self._drop(existing)
        record = self._new_record(event.job, event.attempt, event.spec)
        record.restored = True
        self._jobs[event.job] = record
        self.restore_warnings.extend(restore_attempt(self._state, record, event.tasks))
        if record.placed:
            self._note_holding(record)
        if record.pending_groups:
            self._enqueue(record)
        if not record.placed and not record.pending_groups:
            del self._jobs[event.job]

    # --- scheduling pass --------------------------------------------------------------------

    def _schedule(self) -> list[Decision]:
        decisions: list[Decision] = []
        state = self._state
        dirty = self._dirty_lanes
        for kind, what in state.freed_since_pass:
            if kind == "vc":
                dirty.add(what)
            elif kind == "unbound":
                dirty.update(self._sku_lanes.get(what, ()))
            else:
                dirty.add(None)
        state.freed_since_pass.clear()
        self._dirty_lanes = set()
        state.epoch += 1
        # VCs in config order, then lanes of unknown VCs, opportunistic work last (lowest priority).
        order = [vc for vc in self._state.vcs if vc in dirty]
        order += sorted(lane for lane in dirty if lane is not None and lane not in self._state.vcs)
        if None in dirty:
            order.append(None)
        for lane in order:
            queue = self._lanes.get(lane)
            if queue:
                self._run_lane(queue, decisions)
        return decisions

    def _run_lane(self, queue: list[JobRecord], decisions: list[Decision]) -> None:
        now = self._clock()
        epoch = self._state.epoch
        position = 0
        blockers: list[JobRecord] = []
        failed_shapes: list[tuple[frozenset, tuple, int]] = []
        blocking_ids: set[str] = set()
        for record in list(queue):
            if record.preempting or not record.waiting or self._jobs.get(record.id) is not record:
                continue  # a preempted job is requeued by its Release
            position += 1
            if record.never is not None:
                if record.reason_key is None:
                    self._set_reason(record, reasons.never(record.never), position - 1, decisions)
                continue
            if not self._may_fit_now(record):
                # Nothing it may use was freed since it last failed: it keeps its reason.
                if self._age(record, now, blockers):
                    blocking_ids.add(record.id)
                continue
            if blockers:
                known = record.reason_key
                if known is not None and known[0] == "behind" and known[1] in blocking_ids:
                    continue  # still behind the same gang (same lane, so its priority is at least as high)
            blocker = self._blocked_by(record, blockers) if blockers else None
            if blocker is not None:
                if record.reason_key != ("behind", blocker.id):
                    self._set_reason(record, reasons.behind_gang(
                        blocker.id, None if blocker.opportunistic else blocker.vc, blocker.queued_at,
                        blocker.blocking, self._clock), position - 1, decisions)
                continue
            shape = record.shape
            if shape is not None and not record.victims and not record.reserved and any(
                    record.skus_set <= skus and record.priority <= priority and _dominates(shape, failed)
                    for skus, failed, priority in failed_shapes):
                # Cells only get scarcer during a pass: a job at least as large as one that failed fails too.
                self._fail(record, record.pending_groups[0], record.pending_groups[0].tasks, position - 1, decisions)
            else:
                self._try_place(record, position - 1, decisions)
                if shape is not None and record.waiting and record.failed_epoch == epoch and not record.victims:
                    failed_shapes.append((record.skus_set, shape, record.priority))
            if self._age(record, now, blockers):
                blocking_ids.add(record.id)

    def _age(self, record: JobRecord, now: float, blockers: list[JobRecord]) -> bool:
        """A gang that waited long enough for cells stops the backfill behind it; True if it does now."""
        if record.blocking == 0 and now >= record.gang_deadline and record.failed_epoch >= 0 \
                and record.waiting and record.reason_key is not None and record.reason_key[0] in ("vc", "idle"):
            record.blocking = record.reason_key[-1]
        if record.blocking and record.waiting:
            blockers.append(record)
            return True
        return False

    def _stop_blocking(self, record: JobRecord) -> None:
        """The jobs held back behind this gang are looked at again."""
        if not record.blocking:
            return
        record.blocking = 0
        lane = self._lane_of(record)
        for other in self._lanes.get(lane, ()):
            if other.reason_key == ("behind", record.id):
                other.failed_epoch = -1
        self._dirty_lanes.add(lane)

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
        state = self._state
        if record.opportunistic:
            return any(state.freed_anywhere.get(sku, -1) >= failed for sku in record.skus)
        in_vc = state.freed_in_vc
        return any(state.freed_unbound.get(sku, -1) >= failed or in_vc.get((record.vc, sku), -1) >= failed
                   for sku in record.skus)

    def _is_gang_failure(self, record: JobRecord) -> bool:
        if not record.spec.gangAllocation:
            return False
        return any(len(group.tasks) > 1 for group in record.pending_groups)

    def _set_reason(self, record: JobRecord, reason: reasons.Reason, position: int,
                    decisions: list[Decision]) -> None:
        key, text = reason
        record.reason_text = text
        if key != record.reason_key:
            record.reason_key = key
            decisions.append(Wait(job=record.id, attempt=record.attempt, vc=record.vc, reason=text(position)))

    def _try_place(self, record: JobRecord, position: int, decisions: list[Decision]) -> None:
        if record.victims:
            self._set_reason(record, reasons.for_victims(sorted(record.victims)), position, decisions)
            return
        placements: list[TaskPlacement] = []
        if record.reserved:
            placements.extend(self._take_reservations(record))
        vc = self._state.vcs[record.vc]
        for group in list(record.pending_groups):
            skus = self._candidate_skus(record, vc, group)
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
                self._set_reason(record, reasons.for_victims(sorted(record.victims)), position, decisions)
                break
            if failed is not None:
                self._fail(record, group, failed, position, decisions)
                break
        if placements:
            record.ever_placed = True
            self._note_holding(record)
            decisions.append(Place(job=record.id, attempt=record.attempt, vc=record.vc, tasks=placements,
                                   partial=bool(record.pending_groups)))
        if not record.pending_groups:
            record.reason_text = None
            record.reason_key = None
            self._stop_blocking(record)
            self._dequeue(record)

    def _fail(self, record: JobRecord, group: GroupDemand, tasks: list[TaskDemand], position: int,
              decisions: list[Decision]) -> None:
        record.failed_epoch = self._state.epoch
        vc = self._state.vcs[record.vc]
        skus = self._candidate_skus(record, vc, group)
        cells = self._cells_for(tasks, skus[0])
        key = ("idle", tuple(skus), cells) if record.opportunistic else ("vc", vc.name, tuple(skus), cells)
        if key != record.reason_key or record.reason_text is None:
            self._set_reason(record, self._capacity_reason(record, vc, skus, cells), position, decisions)

    def _blocked_by(self, record: JobRecord, blockers: list[JobRecord]) -> JobRecord | None:
        # Blockers come from the same lane and the lane is in priority order, so only skus matter.
        for blocker in blockers:
            if blocker.priority >= record.priority and not blocker.skus_set.isdisjoint(record.skus):
                return blocker
        return None

    def _candidate_skus(self, record: JobRecord, vc: VcRecord, group: GroupDemand) -> list[str]:
        if group.sku is not None:
            return [group.sku]
        if record.opportunistic:
            return list(self._state.tree.sku_chains)
        if record.spec.pinnedCellId is not None:
            pinned = vc.pinned.get(record.spec.pinnedCellId)
            return [pinned.sku] if pinned is not None else []
        return vc.skus

    def _cells_for(self, tasks: list[TaskDemand], sku: str) -> int:
        sku_type = self.config.skuTypes[sku]
        return sum(leaf_cells_for(task, sku_type) for task in tasks)

    # --- what can never fit ------------------------------------------------------------------

    def _never_fits(self, record: JobRecord) -> str | None:
        state = self._state
        vc = state.vcs.get(record.vc)
        if vc is None:
            known = ", ".join(sorted(state.vcs)) or "none"
            return f"VC {record.vc} does not exist (VCs: {known})"
        if not record.spec.taskRoles:
            return "the job has no task roles"
        pinned_id = record.spec.pinnedCellId
        if pinned_id is not None and not record.opportunistic and pinned_id not in vc.pinned:
            have = ", ".join(sorted(vc.pinned)) or "none"
            return f"pinned cell {pinned_id} is not pinned to VC {vc.name} (its pinned cells: {have})"
        for group in record.pending_groups:
            problem = self._group_never_fits(record, vc, group)
            if problem is not None:
                return problem
        return None

    def _group_never_fits(self, record: JobRecord, vc: VcRecord, group: GroupDemand) -> str | None:
        tree = self._state.tree
        if group.sku is not None and group.sku not in tree.sku_chains:
            return f"no sku {group.sku} in the cluster (skus: {', '.join(tree.sku_chains) or 'none'})"
        if group.sku is not None and not record.opportunistic and record.spec.pinnedCellId is None \
                and group.sku not in vc.sku_virtual:
            pins = [pin for pin, cell in vc.pinned.items() if cell.sku == group.sku]
            if pins:
                return (f"sku {group.sku} of VC {vc.name} is only in its pinned cells ({', '.join(pins)}); "
                        f"name one with pinnedCellId")
            have = ", ".join(vc.skus) or "no cells"
            return f"no sku {group.sku} in VC {vc.name} (it has {have}); submit as opportunistic to use idle cells"
        if group.sku is not None and record.spec.pinnedCellId is not None and not record.opportunistic:
            pinned = vc.pinned[record.spec.pinnedCellId]
            if pinned.sku != group.sku:
                return f"pinned cell {record.spec.pinnedCellId} has sku {pinned.sku}, not {group.sku}"
        skus = self._candidate_skus(record, vc, group)
        if not skus:
            return f"VC {vc.name} has no cells"
        problems = []
        for sku in skus:
            problem = self._sku_never_fits(record, vc, group, sku)
            if problem is None:
                return None
            problems.append(problem)
        return problems[0] if len(problems) == 1 else "; ".join(problems)

    def _sku_never_fits(self, record: JobRecord, vc: VcRecord, group: GroupDemand, sku: str) -> str | None:
        sku_type = self.config.skuTypes[sku]
        tree = self._state.tree
        sizes = []
        for task in group.tasks:
            size = leaf_cells_for(task, sku_type)
            if size == NO_FIT:
                return f"task role {task.role} asks for {task.gpu} GPUs but sku {sku} has none"
            if size > tree.sku_max_node_leaves.get(sku, 0):
                return (f"task {task.role}[{task.index}] needs {size} {sku} cells on one node but the largest "
                        f"{sku} node has {tree.sku_max_node_leaves.get(sku, 0)}")
            sizes.append(size)
        needed = sum(sizes) if record.spec.gangAllocation else max(sizes)
        if record.opportunistic:
            capacity, where = tree.sku_leaves.get(sku, 0), "the cluster has"
        elif record.spec.pinnedCellId is not None:
            capacity, where = vc.pinned[record.spec.pinnedCellId].leaf_count, f"pinned cell {record.spec.pinnedCellId} has"
        else:
            capacity, where = vc.sku_virtual.get(sku, 0), f"VC {vc.name} is guaranteed"
        if needed > capacity:
            return f"needs {needed} {sku} cells at once but {where} only {capacity}"
        return None

    def _capacity_reason(self, record: JobRecord, vc: VcRecord, skus: list[str], cells: int) -> reasons.Reason:
        state = self._state
        tree = state.tree

        def unhealthy() -> int:
            return sum(state.unhealthy_leaves.get(sku, 0) for sku in skus)

        if record.opportunistic:
            def idle_counts() -> tuple[int, int, str]:
                idle = sum(top.free for sku in skus for chain in tree.sku_chains.get(sku, ()) for top in chain.tops)
                total = sum(tree.sku_leaves.get(sku, 0) for sku in skus)
                bad = unhealthy()
                hint = f"{bad} of them on unhealthy nodes" if bad else ""
                if idle >= cells and not hint:
                    hint = "enough cells are idle but not on few enough nodes (each task needs its cells on one node)"
                return idle, total, hint

            return reasons.idle_anywhere(cells, skus, idle_counts)

        pinned = vc.pinned.get(record.spec.pinnedCellId) if record.spec.pinnedCellId is not None else None

        def vc_counts() -> tuple[int, int, str]:
            if pinned is not None:
                guaranteed, held = pinned.leaf_count, pinned.held
            else:
                guaranteed = sum(vc.sku_virtual.get(sku, 0) for sku in skus)
                held = sum(unit.held for sku in skus for unit in vc.units.get(sku, ()))
            free = guaranteed - held
            bad = unhealthy()
            hint = f"{bad} {reasons.sku_words(skus)} cells of the cluster are on unhealthy nodes" if bad else ""
            if free >= cells and not hint:
                hint = "enough cells are free but not on few enough nodes (each task needs its cells on one node)"
            return free, guaranteed, hint

        return reasons.in_vc(vc.name, cells, skus, vc_counts)

    # --- placing ----------------------------------------------------------------------------

    def _place_tasks(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand], skus: list[str],
                     decisions: list[Decision]) -> list[TaskPlacement] | str | None:
        """Place these tasks together: their placements, "preempting", or None (they wait)."""
        modes = (_FREE,) if record.opportunistic else (_FREE, _TAKE_OPPO, _VICTIMS)
        max_node = self._state.tree.sku_max_node_leaves
        if len(skus) > 1:
            # Any sku will do: the one with the most free cells first (shortest wait, spreads the load).
            if record.opportunistic:
                totals = self._state.tree.sku_totals
                skus = sorted(skus, key=lambda sku: -totals[sku].free)
            else:
                skus = sorted(skus, key=lambda sku: vc.held.get(sku, 0) - vc.sku_virtual.get(sku, 0))
        for mode in modes:
            for sku in skus:
                sku_type = self.config.skuTypes[sku]
                order = sorted(range(len(tasks)), key=lambda i: -leaf_cells_for(tasks[i], sku_type))
                sizes = [leaf_cells_for(tasks[i], sku_type) for i in order]
                if sizes[0] > max_node.get(sku, 0):
                    continue
                if mode == _VICTIMS:
                    plan = self._plan_with_victims(record, vc, sku, sizes, decisions)
                elif record.opportunistic:
                    plan = plan_opportunistic(self._state, sku, sizes, View())
                else:
                    plan = plan_guaranteed(self._state, record, vc, sku, sizes, View(take_oppo=mode == _TAKE_OPPO))
                if plan is None:
                    continue
                ordered_tasks = [tasks[i] for i in order]
                return self._commit(record, vc, ordered_tasks, plan, sku, decisions)
        return None

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
        for victim in sorted(victims, key=lambda j: j.seq):
            self._preempt(victim, record, decisions)
        return "preempting"

    def _unbind_unused(self, plan: Plan) -> None:
        """VC cells bound while searching that the final placement does not use go back at once."""
        for _, cell in plan.new_units:
            self._state.unbind_if_idle(cell)

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
        return placements

    # --- preemption ---------------------------------------------------------------------------

    def _preempt(self, victim: JobRecord, by: JobRecord, decisions: list[Decision]) -> None:
        if victim.opportunistic:
            why = f"opportunistic job preempted: VC {by.vc} needs these cells for guaranteed job {by.id}"
        else:
            why = f"preempted in VC {victim.vc} by job {by.id} of higher priority ({by.priority} > {victim.priority})"
        self._state.refresh_job_leaves(victim, lambda: setattr(victim, "preempting", True))
        self._dequeue(victim)
        by.victims.add(victim.id)
        self._preemptor_of[victim.id] = by
        decisions.append(Preempt(job=victim.id, attempt=victim.attempt, vc=victim.vc, by=by.id, reason=why))

    def _plan_with_victims(self, record: JobRecord, vc: VcRecord, sku: str, sizes: list[int],
                           decisions: list[Decision]) -> Plan | None:
        """Intra-VC preemption: lower-priority guaranteed jobs of the VC give way, lazily where they allow it."""
        lower = [job for job in self._holding.get(vc.name, ())
                 if job.priority < record.priority and sku in job.held_skus and not job.opportunistic
                 and not job.preempting and job.placed]
        if not lower:
            return None
        lower.sort(key=lambda j: (j.priority, -j.seq))
        state = self._state
        # A job still waiting for more tasks (incremental) is not downgraded: it would change queues.
        lazy = [job for job in lower if job.lazy and not job.waiting]
        downgraded: list[JobRecord] = []
        state.unbind_log = []
        try:
            for job in lazy:
                state.refresh_job_leaves(job, lambda job=job: setattr(job, "opportunistic", True))
                downgraded.append(job)
                excluded = [leaf for j in downgraded for leaf in j.leaves()]
                plan = plan_guaranteed(state, record, vc, sku, sizes, View(take_oppo=True, excluded=excluded))
                if plan is not None:
                    return plan  # the downgraded jobs keep running as opportunistic work
            # Downgrading is not enough: undo it exactly, then pick victims to kill.
            for vc_record, quota, cell in reversed(state.unbind_log):
                state.bind(vc_record, quota, cell)
            for job in reversed(downgraded):
                state.refresh_job_leaves(job, lambda job=job: setattr(job, "opportunistic", False))
        finally:
            state.unbind_log = None
        view = View(take_oppo=True)
        for job in lower:
            for leaf in job.leaves():
                view.add_extra(leaf)
            plan = plan_guaranteed(state, record, vc, sku, sizes, view)
            if plan is not None:
                return plan
        return None


def _dominates(shape: tuple, failed: tuple) -> bool:
    """Whether a job of `shape` needs at least what a job of shape `failed` needed (same pinning)."""
    return (shape[4] == failed[4] and shape[0] >= failed[0] and shape[1] >= failed[1] and shape[2] >= failed[2]
            and shape[3] >= failed[3])
