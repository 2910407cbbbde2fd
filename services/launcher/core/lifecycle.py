"""The launcher core: job and task lifecycle, pure and deterministic.

`LauncherCore.handle(*events)` applies events (see `events.py`) to the job
records and returns the actions (see `actions.py`) the shell must carry out.
Nothing here does I/O or reads the time except through the injected clock.

Contracts:
- Every handler is idempotent: an event delivered again changes nothing and
  returns no action (the record says it was done). Only a task no record knows
  is answered each time it is reported (killed if running, forgotten if exited).
- Every change is saved with its publications (`JobRecord.outbox`); `recover()`
  publishes the outbox again, so a crash between saving and publishing loses
  no event.
- `handle` is all-or-nothing: if it raises, no record has changed. And if
  the shell cannot carry out what a `handle()` returned (NATS trouble),
  `undo_last()` puts the records back as they were before it, so its events,
  handed again, are applied afresh and their effects ordered again.
- `handle(*events)` is one transaction for a whole batch: one `SaveJob` per
  job it changed, however many of its events touched that job.
- An event the core cannot use *yet* (a placement, stop or preemption for a job
  whose submission it has not seen) raises `Transient`; a placement naming tasks
  the job does not have raises `BadInput`; `IllegalTransition` is a bug.
- An attempt ends in two steps: the outcome is decided (`AttemptRecord.ending`),
  remaining tasks are killed, and only once none is live is the outcome applied
  (job state, `JobReleased`, next attempt). So the scheduler never gets cells
  back while a process of the attempt may still use them.
- A retry or a preemption, once the attempt's tasks are gone, releases its cells
  with `requeue` and opens the next attempt in WAITING. With ALWAYS_BACKOFF_RETRY the new
  attempt carries `backoffUntil`: a placement that arrives earlier is recorded
  but its tasks start only when `BackoffElapsed` comes (or the clock has passed).
- Start-up: `load()` every record, then `recover()` with the task keys the
  backend still knows, then consume events.
"""

from __future__ import annotations

from collections.abc import Callable

from libs.common import exitspecs as exits, messages
from libs.common.errors import BadInput, Transient
from libs.common.ids import EventId, JobId, NodeName, UserName, VcName
from libs.common.messages import JobState, TaskPlacement, TaskState
from libs.common.records import (
    AttemptEnding,
    AttemptRecord,
    EndOutcome,
    JobRecord,
    TaskAttemptSummary,
    TaskRecord,
    Transition,
)
from services.launcher.core import announcements
from services.launcher.core.actions import (
    Action,
    ForgetTask,
    KillTask,
    Publish,
    SaveJob,
    StartTask,
    StartTimer,
)
from services.launcher.core.compaction import compact_older, trim_task_attempts
from services.launcher.core.env import peers_env
from services.launcher.core.events import (
    Archived,
    BackoffElapsed,
    DeadLettered,
    LauncherEvent,
    LogsPruned,
    Placed,
    PortsBusy,
    PreemptRequested,
    StopRequested,
    Submitted,
    Verdict,
)
from services.launcher.core.invariants import check_invariants
from services.launcher.core.launch import build_launch, peers_of
from services.launcher.core.policy import (
    Completion,
    TaskRetry,
    attempt_completion,
    backoff_seconds,
    job_retry,
    task_retry,
)
from services.launcher.core.ports import BUSY_PORT_SECONDS, PortBook
from services.launcher.core.recordops import (
    exit_recorded,
    find_task,
    new_attempt,
    replace,
    task_key,
    with_task,
    with_tasks,
)
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning
from services.launcher.core.transitions import move_attempt, move_task, transition

ACTIVE_STATES = (JobState.WAITING, JobState.RUNNING)
# The cause of a change no event brought (recovery, a timer, ports found busy).
NO_CAUSE = EventId("")
ATTEMPT_STATE_AFTER = {
    EndOutcome.SUCCEEDED: JobState.SUCCEEDED,
    EndOutcome.FAILED: JobState.FAILED,
    EndOutcome.RETRY: JobState.FAILED,
    EndOutcome.STOPPED: JobState.STOPPED,
    EndOutcome.PREEMPTED: JobState.STOPPED,
}


def _replayed(record: JobRecord, finished_since: float | None) -> bool:
    """Whether `recover` publishes the record's outbox again."""
    if finished_since is None or not record.state.is_final:
        return True
    return max((event.at for event in record.outbox), default=0.0) >= finished_since


def describe_exit(code: int | None, spec: messages.ExitSpec | None) -> str:
    phrase = f" ({spec.phrase})" if spec is not None and spec.phrase else ""
    return f"exit code {code}{phrase}"


class LauncherCore:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        port_range: tuple[int, int] = (20000, 30000),
        backoff_base_seconds: float = 10.0,
        backoff_max_seconds: float = 600.0,
        kill_grace_seconds: float = 30.0,
    ):
        self._clock = clock
        self._ports = PortBook(port_range)
        self._backoff_base = backoff_base_seconds
        self._backoff_max = backoff_max_seconds
        self._grace = kill_grace_seconds
        self._jobs: dict[JobId, JobRecord] = {}
        # Per handle() call: records as they were before it, and actions so far.
        self._before: dict[JobId, JobRecord | None] = {}
        self._actions: list[Action] = []
        # The records as they were before the last successful transaction (undo_last).
        self._undo: dict[JobId, JobRecord | None] = {}

    # --- public API -----------------------------------------------------------

    def handle(self, *events: LauncherEvent) -> list[Action]:
        def dispatch_all() -> None:
            for event in events:
                self._dispatch(event)

        return self._transaction(dispatch_all)

    def undo_last(self) -> None:
        """Put back every record the last `handle()` changed, as it was before it.

        For the shell when an effect of that call failed (a KV write or a
        publish gave up): the events are handed again, and without this the
        core would answer them as already applied, with no action, leaving
        the bucket behind the core. Effects already carried out are repeated
        harmlessly: writes are whole records, publications dedupe by id, a
        task key is started once by the backend."""
        self._restore(self._undo)
        self._undo = {}

    def load(self, record: JobRecord) -> None:
        """Restore a job from its stored record (after a restart, before `recover`)."""
        self._jobs[record.job] = record
        self._ports.update(record)

    def forget(self, job_id: JobId) -> None:
        """A finished job deleted (JobDeleted): its record is gone from the bucket and from here."""
        if self._jobs.pop(job_id, None) is not None:
            self._ports.remove(job_id)

    def job(self, job_id: JobId) -> JobRecord | None:
        return self._jobs.get(job_id)

    def job_ids(self) -> list[JobId]:
        return sorted(self._jobs)

    def recover(self, known: set[TaskKey], *, replay_finished_since: float | None = None) -> list[Action]:
        """Reconcile the records with the task keys the backend still knows, after a restart.

        - the publications of each job's last change are published again (the
          launcher may have stopped between saving a record and publishing);
          a finished job's only when its newest is at or after
          `replay_finished_since` (when given): only the last transaction before
          a crash can be unpublished, so an older finished job's state changes are
          not announced again;
        - a live task the backend does not know: recorded RUNNING (or killed) -> reported
          lost (exit code -1001, platform reason "Lost"); ordered to start but never
          started -> started now, once;
        - a task the backend knows whose exit is recorded -> forgotten;
        - a task the launcher ordered killed -> the kill is ordered again;
        - a task the backend knows but no record mentions -> killed;
        - a pending backoff -> its timer is started again.
        """
        replays: list[Action] = [
            Publish(event=event)
            for job in sorted(self._jobs)
            if _replayed(self._jobs[job], replay_finished_since)
            for event in self._jobs[job].outbox
        ]
        actions = self._transaction(lambda: self._recover(known))
        saves = [a for a in actions if isinstance(a, SaveJob)]
        return saves + replays + [a for a in actions if not isinstance(a, SaveJob)]

    def validate_state(self) -> None:
        """Raise `InvariantViolation` if the records break an invariant of the lifecycle."""
        check_invariants(self._jobs.values(), port_range=(self._ports.low, self._ports.high))

    # --- plumbing ---------------------------------------------------------------

    def _transaction(self, work: Callable[[], object]) -> list[Action]:
        self._before, self._actions = {}, []
        try:
            work()
        except BaseException:
            self._restore(self._before)
            raise
        finally:
            before, actions = self._before, self._actions
            self._before, self._actions = {}, []
        self._undo = before
        return self._saves(before, actions) + actions

    def _restore(self, before: dict[JobId, JobRecord | None]) -> None:
        for job, record in before.items():
            if record is None:
                self._jobs.pop(job, None)
                self._ports.remove(job)
            else:
                self._jobs[job] = record
                self._ports.update(record)

    def _saves(self, before: dict[JobId, JobRecord | None], actions: list[Action]) -> list[Action]:
        """One SaveJob per changed job, carrying this call's publications as its outbox."""
        outboxes: dict[JobId, list[messages.AnyEvent]] = {}
        for action in actions:
            if isinstance(action, Publish):
                outboxes.setdefault(action.event.job, []).append(action.event)  # type: ignore[arg-type]
        saves: list[Action] = []
        for job in [*before, *(j for j in outboxes if j not in before)]:
            record = self._jobs[job]
            old = before.setdefault(job, record)  # (undo_last puts its outbox back too)
            outbox = outboxes.get(job, [])
            if (record is old or record == old) and not outbox:
                continue
            record = replace(record, outbox=outbox)
            self._jobs[job] = record
            saves.append(SaveJob(record=record))
        return saves

    def _put(self, record: JobRecord) -> JobRecord:
        if record.job not in self._before:
            self._before[record.job] = self._jobs.get(record.job)
        self._jobs[record.job] = record
        self._ports.update(record)
        return record

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _publish(self, event: messages.Event) -> None:
        self._emit(Publish(event=event))

    def _now(self) -> float:
        return self._clock()

    def _known_job(self, job: JobId, what: str) -> JobRecord:
        record = self._jobs.get(job)
        if record is None:
            # Submission and this event travel on different subjects; the
            # submission may simply not have been applied yet.
            raise Transient(f"{what} for job {job}, whose submission the launcher has not seen yet", delay=1.0)
        return record

    def _dispatch(self, event: LauncherEvent) -> None:
        match event:
            case Submitted():
                self._on_submitted(event)
            case Placed():
                self._on_placed(event)
            case TaskRunning():
                self._on_task_running(event)
            case TaskFinished():
                self._on_task_finished(event)
            case Verdict():
                self._on_verdict(event)
            case StopRequested():
                self._on_stop(event)
            case PreemptRequested():
                self._on_preempt(event)
            case BackoffElapsed():
                self._on_backoff_elapsed(event)
            case DeadLettered():
                self._on_dead_lettered(event)
            case LogsPruned(job=job, at=at):
                record = self._jobs.get(job)
                if record is not None and record.state.is_final and record.logsPrunedAt is None:
                    self._put(replace(record, logsPrunedAt=at))
            case Archived(job=job, at=at):
                record = self._jobs.get(job)
                if record is not None and record.state.is_final and record.archivedAt is None:
                    self._put(replace(record, archivedAt=at))
            case PortsBusy():
                self._on_ports_busy(event)
            case _:
                raise TypeError(f"not a launcher event: {event!r}")

    def _move(self, record: JobRecord, to: JobState, *, why: str, cause: EventId, at: float | None = None) -> JobRecord:
        """Change the job's state through the transition table and announce it, at `at`
        (now by default): a final state's time is the record's completedTime, the same
        number in the record, its transition and the event (the job list compares them)."""
        now = self._now() if at is None else at
        previous = record.state
        record = self._put(transition(record, to, at=now, why=why))
        self._publish(announcements.state_changed(record, previous=previous, at=now, cause=cause))
        return record

    # --- submission and placement -------------------------------------------------

    def _on_submitted(self, event: Submitted) -> None:
        if event.job in self._jobs:
            return
        spec = event.spec
        at = event.at or self._now()
        record = JobRecord(
            job=event.job,
            name=spec.name,
            user=UserName(spec.user),
            vc=VcName(spec.virtualCluster),
            spec=spec,
            createdTime=at,
            attempts=[new_attempt(spec, 1, at)],
            history=[Transition(at=at, to=JobState.WAITING, why="submitted", attempt=1)],
        )
        self._put(record)
        self._publish(announcements.state_changed(record, previous=None, at=at, cause=event.id))

    def _on_placed(self, event: Placed) -> None:
        record = self._known_job(event.job, "a placement")
        attempt = record.current
        if (
            event.attempt != record.attempt
            or record.state not in ACTIVE_STATES
            or attempt.ending is not None
            or attempt.ended
        ):
            self._late_placement(record, event)
            return
        self._check_placement(record, event.tasks)
        new = self._new_placements(attempt, event.tasks)
        if not new:
            return
        self._place(record, new, cause=event.id)

    def _check_placement(self, record: JobRecord, placements: list[TaskPlacement]) -> None:
        unknown = [f"{p.role}[{p.index}]" for p in placements if record.current.task(p.role, p.index) is None]
        if unknown:
            raise BadInput(f"placement of job {record.job} names tasks it does not have: {', '.join(unknown)}")

    def _new_placements(self, attempt: AttemptRecord, placements: list[TaskPlacement]) -> list[TaskPlacement]:
        """Placements of tasks not placed yet, one per task, in the job's task order."""
        order = {(t.role, t.index): i for i, t in enumerate(attempt.tasks)}
        chosen: dict[tuple[str, int], TaskPlacement] = {}
        for placement in placements:
            slot = (placement.role, placement.index)
            task = attempt.task(*slot)
            if task is not None and not task.placed and slot not in chosen:
                chosen[slot] = placement  # the first placement of a task wins
        return sorted(chosen.values(), key=lambda p: order[(p.role, p.index)])

    def _place(self, record: JobRecord, placements: list[TaskPlacement], *, cause: EventId) -> None:
        taken_now: dict[str, set[int]] = {}
        exhausted: TaskPlacement | None = None
        placed: list[TaskRecord] = []
        for placement in placements:
            role = record.spec.role(placement.role)
            ports = self._ports.allocate(
                placement.node, role.resources.ports, taken_now.get(placement.node, ()), now=self._now()
            )
            if ports is None:
                exhausted = exhausted or placement
                ports = {}
            for values in ports.values():
                taken_now.setdefault(placement.node, set()).update(values)
            task = record.current.task(placement.role, placement.index)
            assert task is not None
            placed.append(
                replace(
                    task,
                    node=placement.node,
                    hostIp=placement.hostIp,
                    gpus=list(placement.gpus),
                    leafCells=list(placement.leafCells),
                    skuType=placement.skuType,
                    ports=ports,
                )
            )
        record = self._put(with_tasks(record, record.attempt, placed))
        if exhausted is not None:
            self._fail_attempt(
                record,
                exit_code=exits.PORTS_EXHAUSTED_EXIT_CODE,
                spec=exits.PORTS_EXHAUSTED,
                diagnostics=[f"no free port on node {exhausted.node} in [{self._ports.low}, {self._ports.high})"],
                trigger=(exhausted.role, exhausted.index),
                cause=cause,
            )
            return
        self._start_ready(record, cause=cause)

    def _late_placement(self, record: JobRecord, event: Placed) -> None:
        """A placement the job cannot use: make sure the scheduler gets those cells back."""
        target = record.attempt_record(event.attempt)
        if target is not None and target.released:
            return  # our release of that attempt follows the placement and frees all of it
        if target is not None and not target.ended:
            # The attempt is ending; record where its tasks were placed so that
            # its release, once the live tasks are gone, covers these cells.
            changed = record
            for placement in self._new_placements(target, event.tasks):
                task = target.task(placement.role, placement.index)
                assert task is not None
                changed = with_task(
                    changed, target.attempt, replace(task, node=placement.node, hostIp=placement.hostIp)
                )
            if changed is not record:
                self._put(changed)
            return
        if target is not None:
            # Ended without ever being placed (stopped while waiting): release it now.
            self._put(
                replace(record, attempts=[replace(a, released=True) if a is target else a for a in record.attempts])
            )
            self._publish_release(
                record,
                event.attempt,
                requeue=False,
                event_id=announcements.released_id(record.job, event.attempt),
                cause=event.id,
            )
            return
        # An attempt this job never had: answer with an id of its own so it is not
        # mistaken for (and deduplicated against) a real release of that number.
        late_id = announcements.late_released_id(record.job, event.attempt, event.id or self._placement_digest(event))
        current = record.current
        if late_id in current.lateReleases:
            return
        current = replace(current, lateReleases=[*current.lateReleases, late_id])
        self._put(replace(record, attempts=[*record.attempts[:-1], current]))
        self._publish_release(record, event.attempt, requeue=False, event_id=late_id, cause=event.id)

    @staticmethod
    def _placement_digest(event: Placed) -> str:
        return "+".join(sorted(f"{p.role}.{p.index}@{p.node}" for p in event.tasks))

    def _publish_release(self, record: JobRecord, attempt: int, *, requeue: bool, event_id: EventId, cause: EventId) -> None:
        self._publish(
            announcements.released(
                record, attempt=attempt, requeue=requeue, event_id=event_id, at=self._now(), cause=cause
            )
        )

    # --- starting tasks -------------------------------------------------------------

    def _start_ready(self, record: JobRecord, *, cause: EventId) -> JobRecord:
        """Order the start of every task that may start now."""
        attempt = record.current
        if record.state not in ACTIVE_STATES or attempt.ending is not None or attempt.ended:
            return record
        if attempt.backoffUntil is not None:
            if self._now() < attempt.backoffUntil:
                return record
            attempt = replace(attempt, backoffUntil=None)
            record = self._put(replace(record, attempts=[*record.attempts[:-1], attempt]))
        if record.spec.gangAllocation and not all(t.placed for t in attempt.tasks):
            return record
        ready = [
            replace(t, startRequested=True)
            for t in attempt.tasks
            if t.placed and not t.startRequested and t.state == TaskState.WAITING and t.killReason is None
        ]
        if not ready:
            return record
        record = self._put(with_tasks(record, attempt.attempt, ready))
        peers = peers_of(record.current)
        shared = peers_env(spec=record.spec, job=record.job, peers=peers)
        for task in ready:
            self._emit(StartTask(launch=build_launch(record, record.current, task, peers=peers, shared_env=shared)))
        return record

    def _on_ports_busy(self, event: PortsBusy) -> None:
        """The shell held back the starts of `event.tasks`: ports they were given
        are in use on their node (ports.py). Those ports are skipped from now on,
        the held tasks that had one get others, and every held task is started
        again with its peers' ports as they are now. Applied twice, the second
        finds nothing busy left to replace and starts what was held once more
        (a key starts once: harmless)."""
        now = self._now()
        for node, busy_ports in event.busy.items():
            self._ports.mark_busy(node, busy_ports, until=now + BUSY_PORT_SECONDS)
        record = self._jobs.get(event.job)
        if record is None or record.attempt != event.attempt:
            return
        attempt = record.current
        if record.state not in ACTIVE_STATES or attempt.ending is not None or attempt.ended:
            return
        keys = set(event.tasks)
        held = [
            task
            for task in attempt.tasks
            if task_key(record, attempt, task) in keys
            and task.startRequested and task.state == TaskState.WAITING and not task.exited and task.node is not None
        ]
        taken_now: dict[str, set[int]] = {}
        repicked: list[TaskRecord] = []
        for task in held:
            assert task.node is not None
            busy = set(event.busy.get(task.node, ()))
            if not any(port in busy for ports in task.ports.values() for port in ports):
                continue
            ports = self._ports.allocate(
                task.node, record.spec.role(task.role).resources.ports, taken_now.get(task.node, ()), now=now
            )
            if ports is None:
                # The held tasks never reached the backend: not started, so the
                # attempt ends without waiting for their exits.
                record = self._put(
                    with_tasks(record, attempt.attempt, [replace(t, startRequested=False) for t in held])
                )
                self._fail_attempt(
                    record,
                    exit_code=exits.PORTS_EXHAUSTED_EXIT_CODE,
                    spec=exits.PORTS_EXHAUSTED,
                    diagnostics=[
                        f"no free port on node {task.node} in [{self._ports.low}, {self._ports.high}): "
                        f"ports {sorted(busy)} are in use by something else"
                    ],
                    trigger=(task.role, task.index),
                    cause=NO_CAUSE,
                )
                return
            taken_now.setdefault(task.node, set()).update(p for values in ports.values() for p in values)
            repicked.append(replace(task, ports=ports))
        if repicked:
            record = self._put(with_tasks(record, attempt.attempt, repicked))
        peers = peers_of(record.current)
        shared = peers_env(spec=record.spec, job=record.job, peers=peers)
        starting = {(task.role, task.index) for task in held}
        for task in record.current.tasks:
            if (task.role, task.index) in starting:
                self._emit(StartTask(launch=build_launch(record, record.current, task, peers=peers, shared_env=shared)))

    # --- what the backend saw -----------------------------------------------------------

    def _on_task_running(self, event: TaskRunning) -> None:
        record = self._jobs.get(event.key.job)
        found = find_task(record, event.key) if record is not None else None
        if record is None or found is None:
            if record is None or not exit_recorded(record, event.key):
                # Nothing the launcher ordered: do not let it hold resources.
                self._emit(KillTask(key=event.key, reason="not known to the launcher", grace_seconds=self._grace))
            return
        attempt, task = found
        if task.state != TaskState.WAITING or task.exited or not task.startRequested:
            return
        now = self._now()
        seen = event.at if event.at is not None and event.at <= now else now
        running = move_task(
            record, task, TaskState.RUNNING, why="running", launchedTime=seen, runtimeDetail=event.detail,
            runtimeMode=event.runtimeMode,
        )
        record = self._put(with_task(record, attempt.attempt, running))
        started = announcements.task_started(record, event.key, node=event.node or task.node or NodeName(""), at=now)
        self._publish(started)
        self._maybe_running(record, cause=started.id, launched=seen)

    def _on_task_finished(self, event: TaskFinished) -> None:
        key = event.key
        record = self._jobs.get(key.job)
        found = find_task(record, key) if record is not None else None
        if record is None or found is None:
            if record is None or not exit_recorded(record, key):
                self._emit(ForgetTask(key=key))  # nothing of ours to record
            return
        attempt, task = found
        if task.exited or not task.startRequested:
            return
        now = self._now()
        task = replace(
            task,
            exitCode=event.exitCode,
            completedTime=now,
            launchedTime=task.launchedTime if task.launchedTime is not None else now,
            logPath=event.logPath,
            platformReason=event.platformReason,
        )
        if task.killReason is not None and event.exitCode != 0:
            task = move_task(record, task, TaskState.STOPPED, why="killed", exitSpec=self._kill_spec(attempt))
        elif event.exitCode == 0:
            task = move_task(record, task, TaskState.SUCCEEDED, why="exit code 0", exitSpec=exits.SUCCEEDED)
        else:
            task = move_task(record, task, TaskState.FAILED, why="non-zero exit", verdictPending=True)
        record = self._put(with_task(record, attempt.attempt, task))
        exited = announcements.task_exited(record, event, at=now)
        self._publish(exited)
        self._emit(ForgetTask(key=key))
        record = self._maybe_running(record, cause=exited.id, launched=task.launchedTime)
        if task.killReason is None and task.state == TaskState.SUCCEEDED:
            record = self._settle(record, task, cause=exited.id)
        self._maybe_finalize(record, cause=exited.id)

    @staticmethod
    def _kill_spec(attempt: AttemptRecord) -> messages.ExitSpec:
        ending = attempt.ending
        if ending is not None and ending.outcome in (EndOutcome.STOPPED, EndOutcome.PREEMPTED) and ending.exitSpec:
            return ending.exitSpec
        return exits.ATTEMPT_COMPLETION

    def _on_verdict(self, event: Verdict) -> None:
        record = self._jobs.get(event.key.job)
        found = find_task(record, event.key) if record is not None else None
        if record is None or found is None:
            return
        attempt, task = found
        if not task.verdictPending:
            return
        task = replace(task, exitSpec=event.spec, diagnostics=list(event.diagnostics), verdictPending=False)
        record = self._put(with_task(record, attempt.attempt, task))
        if attempt.attempt != record.attempt:
            return
        role = record.spec.role(task.role)
        retry = TaskRetry.NONE
        if record.state in ACTIVE_STATES and record.current.ending is None:
            retry = task_retry(
                event.spec.reaction,
                gang_allocation=record.spec.gangAllocation,
                retries=task.retries,
                task_retry_count=role.taskRetryCount,
                node_lost=task.platformReason == exits.NODE_LOST_PLATFORM_REASON,
            )
        match retry:
            case TaskRetry.IN_PLACE:
                self._retry_task(record, task, cause=event.id)
            case TaskRetry.NEW_PLACEMENT:
                why = (
                    f"task {task.role}[{task.index}] ended because its node {task.node or '?'} was lost: "
                    "the job goes back to the scheduler for a placement on healthy nodes"
                )
                self._fail_attempt(
                    record,
                    exit_code=task.exitCode,
                    spec=task.exitSpec,
                    diagnostics=[*task.diagnostics, why],
                    trigger=(task.role, task.index),
                    cause=event.id,
                )
            case TaskRetry.NONE:
                self._settle(record, task, cause=event.id)

    def _retry_task(self, record: JobRecord, task: TaskRecord, *, cause: EventId) -> None:
        summary = TaskAttemptSummary(
            taskAttempt=task.taskAttempt,
            state=task.state,
            node=task.node,
            launchedTime=task.launchedTime,
            completedTime=task.completedTime,
            exitCode=task.exitCode,
            exitSpec=task.exitSpec,
            diagnostics=task.diagnostics,
            logPath=task.logPath,
        )
        retried = move_task(
            record,
            task,
            TaskState.WAITING,
            why="task retry",
            taskAttempt=task.taskAttempt + 1,
            launchedTime=None,
            completedTime=None,
            exitCode=None,
            exitSpec=None,
            diagnostics=[],
            platformReason="",
            logPath="",
            retries=task.retries + 1,
            taskAttempts=trim_task_attempts(replace(task, taskAttempts=[*task.taskAttempts, summary])).taskAttempts,
            startRequested=False,
            killReason=None,
            verdictPending=False,
        )
        record = self._put(with_task(record, record.attempt, retried))
        self._start_ready(record, cause=cause)

    def _maybe_running(self, record: JobRecord, *, cause: EventId, launched: float | None = None) -> JobRecord:
        """WAITING -> RUNNING once the whole gang (or, without gang, any task) has
        started; `launched`: when the task that completes it was seen running."""
        attempt = record.current
        if record.state != JobState.WAITING or attempt.ending is not None or attempt.ended:
            return record

        def started(task: TaskRecord) -> bool:
            return task.state != TaskState.WAITING or bool(task.taskAttempts)

        check = all if record.spec.gangAllocation else any
        if not attempt.tasks or not check(started(t) for t in attempt.tasks):
            return record
        launched = self._now() if launched is None else launched
        attempt = move_attempt(record, attempt, JobState.RUNNING, why="started", launchedTime=launched)
        record = replace(record, launchedTime=launched, attempts=[*record.attempts[:-1], attempt])
        why = "all tasks started" if record.spec.gangAllocation else "first task started"
        return self._move(record, JobState.RUNNING, why=why, cause=cause)

    # --- deciding the end of an attempt ------------------------------------------------------

    def _settle(self, record: JobRecord, task: TaskRecord, *, cause: EventId) -> JobRecord:
        """A task attempt is settled: check the completion policy."""
        attempt = record.current
        if record.state not in ACTIVE_STATES or attempt.ending is not None or attempt.ended:
            return record
        if not record.spec.role(task.role).gangReleaseEnable:
            # HiveD's release per pod: this task has ended for good (no retry in this attempt) and
            # its process is gone, so its cells go back now; the rest go with the attempt's release.
            self._publish(announcements.task_released(record, attempt=attempt.attempt, role=task.role,
                                                      index=task.index, at=self._now(), cause=cause))
        result = attempt_completion(record.spec, attempt.tasks, task)
        if result is None:
            return record
        trigger = (task.role, task.index)
        if result.completion == Completion.SUCCEEDED:
            ending = AttemptEnding(
                outcome=EndOutcome.SUCCEEDED,
                decidedTime=self._now(),
                reason="succeeded",
                exitCode=exits.SUCCEEDED_EXIT_CODE,
                exitSpec=exits.SUCCEEDED,
                diagnostics=[result.why],
                triggerTaskRoleName=trigger[0],
                triggerTaskIndex=trigger[1],
                cause=cause,
            )
            return self._begin_ending(record, ending, cause=cause)
        return self._fail_attempt(
            record,
            exit_code=task.exitCode,
            spec=task.exitSpec,
            diagnostics=[*task.diagnostics, result.why],
            trigger=trigger,
            cause=cause,
        )

    def _fail_attempt(
        self,
        record: JobRecord,
        *,
        exit_code: int | None,
        spec: messages.ExitSpec | None,
        diagnostics: list[str],
        trigger: tuple[str, int],
        cause: EventId,
    ) -> JobRecord:
        """The attempt failed: fail the job, or retry it as its exit spec's reaction says."""
        reaction = spec.reaction if spec is not None else messages.Reaction.RETRY_TO_MAX
        decision = job_retry(
            reaction,
            retries=record.retries,
            job_retry_count=record.spec.jobRetryCount,
            platform_retries=record.platformRetries,
        )
        if decision.exhausted and spec is not None:
            spec = exits.platform_retries_exhausted(spec, retries=record.platformRetries)
        exit_text = describe_exit(exit_code, spec)
        backoff: float | None = None
        if not decision.retry:
            outcome, reason = EndOutcome.FAILED, f"failed: {exit_text}"
        elif decision.backoff:
            backoff = backoff_seconds(record.backoffRetries, base=self._backoff_base, maximum=self._backoff_max)
            outcome, reason = EndOutcome.RETRY, f"retry after {backoff:g}s backoff: {exit_text}"
        elif decision.counted:
            budget = f"{record.retries + 1}/{record.spec.jobRetryCount}"
            outcome, reason = EndOutcome.RETRY, f"retry {budget} after {exit_text}"
        else:
            outcome, reason = EndOutcome.RETRY, f"retry after {exit_text}, not counted ({reaction})"
        ending = AttemptEnding(
            outcome=outcome,
            decidedTime=self._now(),
            reason=reason,
            exitCode=exit_code,
            exitSpec=spec,
            diagnostics=diagnostics,
            triggerTaskRoleName=trigger[0],
            triggerTaskIndex=trigger[1],
            retryCounted=decision.counted,
            platformRetry=decision.retry and not decision.counted,
            backoffSeconds=backoff,
            cause=cause,
        )
        return self._begin_ending(record, ending, cause=cause)

    def _begin_ending(self, record: JobRecord, ending: AttemptEnding, *, cause: EventId) -> JobRecord:
        """Record the decided outcome, kill what still runs, and finish if nothing does."""
        attempt = replace(record.current, ending=ending)
        kill_reason = self._kill_reason(ending)
        kills: list[TaskKey] = []
        for task in attempt.tasks:
            if task.live and task.killReason is None:
                kills.append(task_key(record, attempt, task))
        tasks = [replace(t, killReason=kill_reason) if t.live and t.killReason is None else t for t in attempt.tasks]
        attempt = replace(attempt, tasks=tasks)
        record = self._put(replace(record, attempts=[*record.attempts[:-1], attempt]))
        for key in kills:
            self._emit(KillTask(key=key, reason=kill_reason, grace_seconds=self._grace))
        if ending.outcome == EndOutcome.STOPPED and any(t.live for t in attempt.tasks):
            record = self._move(record, JobState.STOPPING, why=ending.reason, cause=cause)
        return self._maybe_finalize(record, cause=cause)

    @staticmethod
    def _kill_reason(ending: AttemptEnding) -> str:
        if ending.outcome in (EndOutcome.STOPPED, EndOutcome.PREEMPTED):
            return ending.reason
        return f"attempt completing ({ending.reason})"

    def _maybe_finalize(self, record: JobRecord, *, cause: EventId) -> JobRecord:
        """Apply the decided outcome once no task of the attempt is live."""
        attempt = record.current
        ending = attempt.ending
        if ending is None or attempt.ended or any(t.live for t in attempt.tasks):
            return record
        now = self._now()
        # Tasks that never started end as STOPPED, without an exit code.
        tasks = [
            move_task(record, t, TaskState.STOPPED, why="attempt ended")
            if t.state in (TaskState.WAITING, TaskState.RUNNING)
            else t
            for t in attempt.tasks
        ]
        placed = any(t.placed for t in tasks)
        follows = ending.outcome in (EndOutcome.RETRY, EndOutcome.PREEMPTED)
        release = follows or placed
        attempt = move_attempt(
            record,
            attempt,
            ATTEMPT_STATE_AFTER[ending.outcome],
            why=ending.reason,
            tasks=tasks,
            completedTime=now,
            exitCode=ending.exitCode,
            exitSpec=ending.exitSpec,
            endReason=ending.reason,
            preemptedBy=ending.preemptedBy,
            isRetryCounted=ending.retryCounted,
            released=attempt.released or release,
        )
        record = replace(
            record,
            attempts=[*record.attempts[:-1], attempt],
            appExitCode=ending.exitCode,
            appExitSpec=ending.exitSpec,
            appExitDiagnostics=list(ending.diagnostics),
            appExitTriggerTaskRoleName=ending.triggerTaskRoleName,
            appExitTriggerTaskIndex=ending.triggerTaskIndex,
        )
        if release:
            self._publish_release(
                record,
                attempt.attempt,
                requeue=follows,
                event_id=announcements.released_id(record.job, attempt.attempt),
                cause=cause,
            )
        if not follows:
            record = replace(record, completedTime=now)
            return self._move(record, ATTEMPT_STATE_AFTER[ending.outcome], why=ending.reason, cause=cause, at=now)
        following = new_attempt(record.spec, attempt.attempt + 1, now)
        if ending.backoffSeconds is not None:
            following = replace(following, backoffUntil=now + ending.backoffSeconds)
            self._emit(StartTimer(job=record.job, attempt=following.attempt, at=now + ending.backoffSeconds))
        record = replace(
            record,
            attempt=following.attempt,
            # Only the latest attempt keeps every task in full (compaction.py).
            attempts=compact_older([*record.attempts, following]),
            retries=record.retries + (1 if ending.retryCounted else 0),
            backoffRetries=record.backoffRetries + (1 if ending.backoffSeconds is not None else 0),
            platformRetries=record.platformRetries + (1 if ending.platformRetry else 0),
            launchedTime=None,
        )
        return self._move(record, JobState.WAITING, why=ending.reason, cause=cause)

    # --- requests from users and the scheduler -------------------------------------------

    def _on_stop(self, event: StopRequested) -> None:
        record = self._known_job(event.job, "a stop request")
        if record.state not in ACTIVE_STATES:
            return  # already stopping or final
        ending = record.current.ending
        if ending is not None and ending.outcome in (EndOutcome.SUCCEEDED, EndOutcome.FAILED):
            # The job is completing anyway; its outcome stands, the request is noted.
            if record.stopRequestedBy is None:
                self._put(replace(record, stopRequestedBy=event.by))
            return
        record = self._put(replace(record, stopRequestedBy=event.by))
        reason = f"stopped by {event.by}" if event.by else "stopped"
        self._begin_ending(
            record,
            AttemptEnding(
                outcome=EndOutcome.STOPPED,
                decidedTime=self._now(),
                reason=reason,
                exitCode=exits.STOP_EXIT_CODE,
                exitSpec=exits.stopped(event.by),
                diagnostics=[reason],
                cause=event.id,
            ),
            cause=event.id,
        )

    def _on_preempt(self, event: PreemptRequested) -> None:
        record = self._known_job(event.job, "a preemption")
        if event.attempt != record.attempt or record.state not in ACTIVE_STATES:
            return  # that attempt is gone, or its release is on its way
        if record.current.ending is not None:
            return  # already ending: its release follows
        reason = f"preempted by {event.by}"
        spec = exits.preempted(event.by, event.reason)
        self._begin_ending(
            record,
            AttemptEnding(
                outcome=EndOutcome.PREEMPTED,
                decidedTime=self._now(),
                reason=reason,
                exitCode=exits.PREEMPTED_EXIT_CODE,
                exitSpec=spec,
                diagnostics=[spec.reason],
                preemptedBy=event.by,
                cause=event.id,
            ),
            cause=event.id,
        )

    def _on_dead_lettered(self, event: DeadLettered) -> None:
        """End the job FAILED (killing what runs): the platform cannot carry it on.

        A job the launcher never recorded (its own submission was the event it
        gave up on) has no record to fail; the monitor's alert names it.
        """
        record = self._jobs.get(event.job)
        if record is None or record.state not in ACTIVE_STATES:
            return
        ending = record.current.ending
        if ending is not None and ending.outcome != EndOutcome.RETRY:
            return  # already ending as it should
        spec = exits.dead_lettered(event.consumer, event.eventKind, event.reason)
        self._begin_ending(
            record,
            AttemptEnding(
                outcome=EndOutcome.FAILED,
                decidedTime=self._now(),
                reason=f"failed: {spec.reason}",
                exitCode=spec.code,
                exitSpec=spec,
                diagnostics=[event.reason],
                cause=event.id,
            ),
            cause=event.id,
        )

    def _on_backoff_elapsed(self, event: BackoffElapsed) -> None:
        record = self._jobs.get(event.job)
        if record is None or event.attempt != record.attempt or record.current.backoffUntil is None:
            return
        attempt = replace(record.current, backoffUntil=None)
        record = self._put(replace(record, attempts=[*record.attempts[:-1], attempt]))
        self._start_ready(record, cause=NO_CAUSE)

    # --- recovery ------------------------------------------------------------------------

    def _recover(self, known: set[TaskKey]) -> None:
        recorded: set[TaskKey] = set()
        for job in sorted(self._jobs):
            record = self._jobs[job]
            for attempt in record.attempts:
                for task in attempt.tasks:
                    recorded.update(
                        TaskKey(
                            job=job,
                            attempt=attempt.attempt,
                            role=task.role,
                            index=task.index,
                            taskAttempt=s.taskAttempt,
                        )
                        for s in task.taskAttempts
                    )
                    if task.startRequested:
                        recorded.add(task_key(record, attempt, task))
                for brief in attempt.taskBriefs:  # a compacted attempt: all its task attempts
                    recorded.update(
                        TaskKey(job=job, attempt=attempt.attempt, role=brief.role, index=brief.index, taskAttempt=n)
                        for n in range(brief.taskAttempt + 1)
                    )
            self._recover_job(record, known)
        for key in sorted(known - recorded):
            self._emit(KillTask(key=key, reason="not known to the launcher", grace_seconds=self._grace))

    def _recover_job(self, record: JobRecord, known: set[TaskKey]) -> None:
        for attempt in record.attempts:
            for task in attempt.tasks:
                for summary in task.taskAttempts:
                    old = TaskKey(
                        job=record.job,
                        attempt=attempt.attempt,
                        role=task.role,
                        index=task.index,
                        taskAttempt=summary.taskAttempt,
                    )
                    if old in known:
                        self._emit(ForgetTask(key=old))
                key = task_key(record, attempt, task)
                if task.exited and task.startRequested and key in known:
                    self._emit(ForgetTask(key=key))
        number = record.attempt
        for role, index in [(t.role, t.index) for t in record.current.tasks]:
            # Re-read: reporting one task lost may already have changed the record.
            current = self._jobs[record.job]
            if current.attempt != number:
                break
            attempt = current.current
            found = attempt.task(role, index)
            if found is None or not found.live:
                continue
            key = task_key(current, attempt, found)
            if key in known:
                if found.killReason is not None:
                    self._emit(KillTask(key=key, reason=found.killReason, grace_seconds=self._grace))
            elif found.state == TaskState.RUNNING or found.killReason is not None:
                self._dispatch(
                    TaskFinished(
                        key=key,
                        exitCode=exits.LOST_EXIT_CODE,
                        platformReason=exits.LOST_PLATFORM_REASON,
                        platformMessage="the backend no longer knows this task after a launcher restart",
                    )
                )
            else:
                # Ordered to start, but the backend never started it (the shell
                # stopped between saving the record and starting the task).
                self._emit(StartTask(launch=build_launch(current, attempt, found)))
        current = self._jobs[record.job]
        if current.current.backoffUntil is not None and current.state in ACTIVE_STATES:
            self._emit(StartTimer(job=current.job, attempt=current.attempt, at=current.current.backoffUntil))
        self._maybe_finalize(current, cause=NO_CAUSE)
