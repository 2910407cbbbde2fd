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


class _Blocker:
    __slots__ = ("job", "vc", "skus", "priority", "cells")

    def __init__(self, job: JobRecord, vc: str | None, skus: list[str], cells: int):
        self.job = job
        self.vc = vc
        self.skus = set(skus)
        self.priority = job.priority
        self.cells = cells


class SchedulerCore:
    def __init__(self, config: ClusterConfig, *, clock: Callable[[], float],
                 gang_priority_after_s: float = GANG_PRIORITY_AFTER_S):
        self.config = config
        self._clock = clock
        self._gang_after = gang_priority_after_s
        self._state = ClusterState(config)
        self._jobs: dict[str, JobRecord] = {}  # every attempt that waits or holds cells
        self._queue: list[JobRecord] = []  # attempts with tasks still to place, in queue order
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
                    pass
                case _:
                    raise TypeError(f"not a scheduler event: {event!r}")
            self._started = True
            run_pass = True
        if run_pass:
            decisions.extend(self._schedule())
        return decisions

    def waiting_reason(self, job: str) -> str | None:
        record = self._jobs.get(job)
        if record is None or not record.waiting:
            return None
        return record.reason

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
        check_invariants(self._state, self._jobs, self._queue)

    # --- events ------------------------------------------------------------------------------

    def _new_record(self, job: str, attempt: int, spec, *, seq: int | None = None) -> JobRecord:
        if seq is None:
            seq = self._next_seq
            self._next_seq += 1
        return JobRecord(job, attempt, spec, seq=seq, now=self._clock())

    def _enqueue(self, record: JobRecord) -> None:
        key = record.key
        queue = self._queue
        low, high = 0, len(queue)
        while low < high:
            middle = (low + high) // 2
            if queue[middle].key < key:
                low = middle + 1
            else:
                high = middle
        queue.insert(low, record)

    def _dequeue(self, record: JobRecord) -> None:
        try:
            self._queue.remove(record)
        except ValueError:
            pass

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
        node.healthy = event.healthy
        node.reason = event.reason
        from services.scheduler.core.cells import refresh_leaf

        for cell in node.cells:
            for leaf in cell.leaves:
                refresh_leaf(leaf)
            self._state.affected_skus.add(cell.sku)

    def _drop(self, record: JobRecord) -> None:
        """Forget an attempt: free its cells and reservations, leave the queue."""
        state = self._state
        units = []
        for leaves in record.placed.values():
            for leaf in leaves:
                state.set_leaf(leaf, job=None, reserved_for=leaf.reserved_for)
                units.append(leaf.unit)
        record.placed = {}
        self._drop_reservations(record)
        for unit in dict.fromkeys(units):
            state.unbind_if_idle(unit)
        self._dequeue(record)
        if self._jobs.get(record.id) is record:
            del self._jobs[record.id]
        preemptor = self._preemptor_of.pop(record.id, None)
        if preemptor is not None:
            preemptor.victims.discard(record.id)
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
        if record.pending_groups:
            self._enqueue(record)
        if not record.placed and not record.pending_groups:
            del self._jobs[event.job]

    # --- scheduling pass --------------------------------------------------------------------

    def _schedule(self) -> list[Decision]:
        decisions: list[Decision] = []
        now = self._clock()
        ahead: dict[str | None, int] = {}
        blockers: list[_Blocker] = []
        for record in list(self._queue):
            if not record.waiting or self._jobs.get(record.id) is not record:
                continue
            if record.preempting:
                continue  # it is being killed; its Release requeues it
            lane = None if record.opportunistic else record.vc
            position = ahead.get(lane, 0)
            ahead[lane] = position + 1
            self._try_place(record, now, position, blockers, decisions)
        self._state.affected_skus.clear()
        return decisions

    def _set_reason(self, record: JobRecord, reason: tuple[tuple, str], decisions: list[Decision]) -> None:
        key, text = reason
        record.reason = text
        if key != record.reason_key:
            record.reason_key = key
            decisions.append(Wait(job=record.id, attempt=record.attempt, vc=record.vc, reason=text))

    def _try_place(self, record: JobRecord, now: float, position: int, blockers: list[_Blocker],
                   decisions: list[Decision]) -> None:
        if record.victims:
            self._set_reason(record, reasons.for_victims(sorted(record.victims)), decisions)
            return
        placements: list[TaskPlacement] = []
        if record.reserved:
            placements.extend(self._take_reservations(record))
        impossible = self._never_fits(record)
        if impossible is not None:
            self._set_reason(record, reasons.never(impossible), decisions)
            return
        vc = self._state.vcs[record.vc]
        for group in list(record.pending_groups):
            skus = self._candidate_skus(record, vc, group)
            blocker = self._blocked_by(record, skus, blockers)
            if blocker is not None:
                self._set_reason(record, reasons.behind_gang(
                    blocker.job.id, blocker.vc, now - blocker.job.queued_at, blocker.cells), decisions)
                break
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
                self._set_reason(record, reasons.for_victims(sorted(record.victims)), decisions)
                break
            if failed is not None:
                cells = self._cells_for(failed, skus[0]) if skus else 0
                self._set_reason(record, self._capacity_reason(record, vc, skus, cells, position), decisions)
                if len(failed) > 1 and now - record.queued_at >= self._gang_after:
                    blockers.append(_Blocker(record, None if record.opportunistic else record.vc, skus, cells))
                break
        if placements:
            record.ever_placed = True
            decisions.append(Place(job=record.id, attempt=record.attempt, vc=record.vc, tasks=placements,
                                   partial=bool(record.pending_groups)))
        if not record.pending_groups:
            record.reason = None
            record.reason_key = None
            self._dequeue(record)

    def _blocked_by(self, record: JobRecord, skus: list[str], blockers: list[_Blocker]) -> _Blocker | None:
        lane = None if record.opportunistic else record.vc
        for blocker in blockers:
            if blocker.vc == lane and blocker.priority >= record.priority and blocker.skus.intersection(skus):
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
                and group.sku not in vc.sku_guaranteed:
            have = ", ".join(vc.skus) or "no cells"
            return f"no sku {group.sku} in VC {vc.name} (it has {have}); submit as opportunistic to use idle cells"
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
            capacity, where = vc.sku_guaranteed.get(sku, 0), f"VC {vc.name} is guaranteed"
        if needed > capacity:
            return f"needs {needed} {sku} cells at once but {where} only {capacity}"
        return None

    def _capacity_reason(self, record: JobRecord, vc: VcRecord, skus: list[str], cells: int,
                         position: int) -> tuple[tuple, str]:
        tree = self._state.tree
        unhealthy = sum(cell.leaf_count for node in tree.nodes.values() if not node.healthy
                        for cell in node.cells if cell.sku in skus)
        if record.opportunistic:
            idle = sum(top.free for sku in skus for chain in tree.sku_chains.get(sku, ()) for top in chain.tops)
            total = sum(tree.sku_leaves.get(sku, 0) for sku in skus)
            hint = f"{unhealthy} of them on unhealthy nodes" if unhealthy else ""
            if idle >= cells and not hint:
                hint = "enough cells are idle but not on few enough nodes (each task needs its cells on one node)"
            return reasons.idle_anywhere(cells, skus, idle, total, position, hint)
        guaranteed = sum(vc.sku_guaranteed.get(sku, 0) for sku in skus)
        held = sum(unit.held for sku in skus for unit in vc.units.get(sku, ()))
        held += sum(cell.held for cell in vc.pinned.values() if cell.sku in skus)
        free = guaranteed - held
        hint = f"{unhealthy} {sku_list(skus)} cells of the cluster are on unhealthy nodes" if unhealthy else ""
        if free >= cells and not hint:
            hint = "enough cells are free but not on few enough nodes (each task needs its cells on one node)"
        return reasons.in_vc(vc.name, cells, skus, free, guaranteed, position, hint)

    # --- placing ----------------------------------------------------------------------------

    def _place_tasks(self, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand], skus: list[str],
                     decisions: list[Decision]) -> list[TaskPlacement] | str | None:
        """Place these tasks together: their placements, "preempting", or None (they wait)."""
        modes = (_FREE,) if record.opportunistic else (_FREE, _TAKE_OPPO, _VICTIMS)
        max_node = self._state.tree.sku_max_node_leaves
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
            return placements
        for leaves in plan.leaves:
            for leaf in leaves:
                state.set_leaf(leaf, job=leaf.job, reserved_for=record)
        group = next(g for g in record.groups if any(t in g.tasks for t in tasks))
        record.reserved.append((group, tasks, plan.leaves))
        for victim in sorted(victims, key=lambda j: j.seq):
            self._preempt(victim, record, decisions)
        return "preempting"

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
        lower = [job for job in self._jobs.values()
                 if job.vc == vc.name and not job.opportunistic and not job.preempting and job.placed
                 and job.priority < record.priority and any(leaf.sku == sku for leaf in job.leaves())]
        if not lower:
            return None
        lower.sort(key=lambda j: (j.priority, -j.seq))
        state = self._state
        lazy = [job for job in lower if job.lazy]
        downgraded: list[JobRecord] = []
        for job in lazy:
            state.refresh_job_leaves(job, lambda job=job: setattr(job, "opportunistic", True))
            downgraded.append(job)
            excluded = [leaf for j in downgraded for leaf in j.leaves()]
            plan = plan_guaranteed(state, record, vc, sku, sizes, View(take_oppo=True, excluded=excluded))
            if plan is not None:
                return plan  # the downgraded jobs keep running as opportunistic work
        for job in reversed(downgraded):
            self._upgrade(job)
        view = View(take_oppo=True)
        for job in lower:
            for leaf in job.leaves():
                view.add_extra(leaf)
            plan = plan_guaranteed(state, record, vc, sku, sizes, view)
            if plan is not None:
                return plan
        return None

    def _upgrade(self, job: JobRecord) -> None:
        """Undo a tentative downgrade: re-bind the VC cells its leaves lie in."""
        state = self._state
        vc = state.vcs[job.vc]
        for leaf in job.leaves():
            if leaf.unit is not None:
                continue
            for quota in vc.sku_quotas.get(leaf.sku, ()):
                cell = next((c for c in leaf.ancestors if c.type == quota.type and c.chain == quota.chain.name), None)
                if cell is not None and quota.unbound > 0 and state.bindable_cell_for(cell):
                    state.bind(vc, quota, cell)
                    break
            else:
                raise AssertionError(f"cannot re-bind the cells of {job} after a tentative downgrade")
        state.refresh_job_leaves(job, lambda: setattr(job, "opportunistic", False))


def sku_list(skus: list[str]) -> str:
    return reasons.sku_words(skus)
