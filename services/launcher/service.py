"""launcher's shell: bus events and backend events in, core actions carried out.

Events come in batches: every bus event waiting (`consume_batches`), and every
backend event already reported, go through one `core.handle(*events)`, which
returns one `SaveJob` per job it changed however many events touched it. And
transactions are group-committed (`_commit_forever`): whatever is handed to the
shell while one transaction's effects are in flight -- the next bus batch, the
backend's reports, a timer -- goes into the next transaction together. Each
transaction costs two NATS round trips however little it carries, so under
load (tasks of other jobs under way) the backend's reports wait a moment for
company (`COMMIT_DELAY_SECONDS`; a bus batch takes them along at once), and a
task's running report waits for its end (`RUNNING_LINGER_SECONDS`,
core/held.py); an idle launcher applies each report at once.

Order of effects for one `handle()` (the core's contract): every `SaveJob` is
written to KV first (all at once, `kv_write_many`), then tasks are started or
killed while the events are published (all at once, `publish_many`; they are
in the saved records' outboxes already); a bus batch returns, and is acked,
only once all of that is done. A crash in between is healed at
start-up: records are loaded, the backend re-adopts its tasks, `core.recover`
publishes the outboxes again, starts what was ordered but never started and
reports what died meanwhile, so no task attempt starts twice. An effect that
fails (NATS trouble) undoes the transaction in the core (`undo_last`) before
the error goes on, so the events, handed again, order their effects again.

Transactions do not overlap: the next one is decided only once the previous
one's publications are stored. Deciding it earlier would let a job's next
record (whose outbox holds only that transaction's events) be stored before
the previous events are, and a crash then would lose them.

Kills run in the background: a stop waits out the grace period, and the
launcher must go on handling other jobs meanwhile; the backend's TaskFinished
reports the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator

import msgspec
import nats.errors

from libs.common import exitspecs as exits, ids, job_secrets, service
from libs.common.bus import BATCH_MAX, get_json, get_many, load_all, read_pages
from libs.common.config import Config, load_config
from libs.common.errors import NotFound, PaiError, Transient
from libs.common.jetstream_limits import marker_seconds
from libs.common.logs import LOG_SUBJECT, LogReply, LogRequest
from libs.common.messages import (
    EventDeadLettered,
    JobArchived,
    JobDeleted,
    JobPlaced,
    JobSubmitted,
    NodeCondition,
    NodeStatus,
    PreemptRequested,
    StopRequested,
    TaskState,
    TaskVerdict,
    TerminalOpenReply,
)
from libs.common.nodes import NodeHealthRecord
from libs.common.protocol.masking import scrub_bytes, scrub_text
from libs.common.protocol.render import render_secrets
from libs.common.records import JobRecord, TaskRecord, decode_job_record, encode_job_record
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.launcher import metrics
from services.launcher.backends.base import Backend
from services.launcher.core import (
    Archived,
    BackoffElapsed,
    ForgetTask,
    KillTask,
    LauncherCore,
    LogsPruned,
    PortsBusy,
    Publish,
    SaveJob,
    StartTask,
    StartTimer,
    from_message,
)
from services.launcher.core.finished import (
    FinishedJob,
    finished_job,
    held_whole,
    replay_since,
    sheddable,
    summary_of,
)
from services.launcher.core.held import HeldRunning, job_of
from services.launcher.core.retention import due_for_pruning, record_may_go, task_keys
from services.launcher.core.tasks import TaskFinished, TaskKey
from services.launcher.log_snapshots import LogSnapshots, chunk_of
from services.launcher.tensorboard_relay import serve as serve_tensorboard
from services.launcher.terminals import Located, TerminalSessions

log = logging.getLogger("pai.launcher")

# What goes wrong talking to NATS; anything else is a bug.
NATS_TROUBLE = (Transient, nats.errors.Error, asyncio.TimeoutError, OSError)

# How long a task seen running waits for its end before it is applied, under load (pump_backend).
# A burst's trivial tasks took ~0.1 s (median) and up to ~0.5 s from their running
# report to their end on two busy cores: at 0.05 s, half of them had their record
# written twice.
# The record's launch times are the backend's (TaskRunning.at), so only the
# moment RUNNING shows moves, and only under load.
RUNNING_LINGER_SECONDS = 0.5
# How long the backend's other reports may wait for company, under load (_commit_forever).
COMMIT_DELAY_SECONDS = 0.01
# A finished job's record is held whole this long after it finished (late events,
# a first look at its logs), then as a `FinishedJob` (core/finished.py): memory
# and restart time follow live work, not history. Below the event stream's
# duplicate window, so the outboxes a restart publishes again are deduplicated.
KEEP_FINISHED_SECONDS = 300.0
# How long before the newest event of any record a restart still publishes a
# finished job's outbox again (core/finished.py, replay_since).
REPLAY_MARGIN_SECONDS = 30.0

CONSUMED_KINDS = [
    Kind.JOB_SUBMITTED, Kind.JOB_PLACED, Kind.JOB_PREEMPT, Kind.JOB_STOP_REQUESTED, Kind.TASK_VERDICT,
    Kind.EVENT_DEAD_LETTERED, Kind.NODE_STATUS, Kind.JOB_DELETED, Kind.JOB_ARCHIVED,
]
CONSUMED_TYPES = (JobSubmitted, JobPlaced, PreemptRequested, StopRequested, TaskVerdict, EventDeadLettered, NodeStatus,
                  JobDeleted, JobArchived)


def make_backend(config: Config) -> Backend:
    if config.backend == "kubernetes":
        from services.launcher.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_config_sync(config.kube_api_url or None, config.kube_namespace,
                                                  host_network=config.kube_host_network,
                                                  job_host_network=config.kube_job_host_network,
                                                  run_as=(config.kube_task_uid, config.kube_task_gid),
                                                  ssh_image=config.kube_ssh_image)
    from services.launcher.backends.local import LocalBackend

    return LocalBackend(
        config.data_path / "launcher",
        log_cap_bytes=config.task_log_cap_bytes,
        grace_seconds=config.grace_seconds,
        task_user=config.task_user,  # as root: never root, a uid per job (local_users)
        pids_max=config.task_pids_max,
        work_dir_mb=config.task_work_dir_mb,
        container_engine=config.container_engine,
    )


class _Turn:
    """One caller's events queued for the next transaction. `waited`: the caller
    awaits `done` (a bus batch, a timer); the backend pump does not."""

    __slots__ = ("done", "due", "events", "waited")

    def __init__(self, events: list, done: asyncio.Future, *, waited: bool, due: float = 0.0):
        self.events = events
        self.done = done
        self.waited = waited
        self.due = due  # (monotonic) it need not go before this, unless with a waited turn


class LauncherShell:
    def __init__(self, ctx: ServiceContext, core: LauncherCore, backend: Backend):
        self.ctx = ctx
        self.core = core
        self.backend = backend
        self.lock = asyncio.Lock()
        # Events waiting for the next transaction, and the task that runs the
        # transactions (group commit: `_commit_forever`).
        self._waiting: list[_Turn] = []
        self._wake = asyncio.Event()
        self._committer: asyncio.Task | None = None
        # Task attempts this shell started whose end it has not seen yet (pump_backend).
        self._started: set[TaskKey] = set()
        # Task-running reports held a moment for their task's end (pump_backend).
        self._held = HeldRunning(RUNNING_LINGER_SECONDS)
        self._held_timer: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        # job -> its opened secrets; only jobs whose commands reference one
        # are ever looked up (the others cost nothing).
        self._secrets: dict[str, dict] = {}
        # Finished jobs whose records the core no longer holds (core/finished.py):
        # read again from the bucket when one is needed whole.
        self._finished: dict[str, FinishedJob] = {}

    async def restore(self) -> None:
        """Live jobs (and those finished moments ago) from pai_job_status, read in
        pages (`bus.read_pages`); older finished ones as `FinishedJob`s. A finished
        job is read whole again where the backend still knows a task of it, or
        where its outbox may not have been published (core/finished.py)."""
        kv = await self.ctx.bus.kv(Bucket.JOB_STATUS)
        now = time.time()
        whole: dict[str, JobRecord] = {}
        summaries = {}
        newest_at = 0.0
        async for page in read_pages(kv):
            for entry in page:
                whole.pop(entry.key, None)
                summaries.pop(entry.key, None)
                if entry.value is None:
                    continue
                summary = summary_of(entry.value)
                newest_at = max(newest_at, summary.newest_event_at)
                if summary.state.is_final:
                    summaries[entry.key] = summary
                else:
                    whole[entry.key] = decode_job_record(entry.value)
        since = replay_since(newest_at, REPLAY_MARGIN_SECONDS)
        again = [key for key, summary in summaries.items()
                 if held_whole(summary, now=now, keep_seconds=KEEP_FINISHED_SECONDS, replay_since=since)]
        whole.update(await get_many(kv, again, JobRecord))
        self._finished = {s.job: finished_job(s) for key, s in summaries.items() if key not in whole}
        del summaries
        for record in whole.values():
            self.core.load(record)
        known = await self.backend.recover()
        await self._read_whole(key.job for key in known)
        async with self.lock:
            await self._execute(self.core.recover(set(known), replay_finished_since=since))
            self._shed_finished()
        log.info("restored %d jobs (%d finished ones held compactly); backend knows %d tasks",
                 len(whole), len(self._finished), len(known))
        await self._end_tasks_on_nodes_lost_meanwhile()

    async def _read_whole(self, jobs) -> None:
        """Finished jobs held compactly that are needed whole (an event about one,
        a task of one the backend knows): their records read again into the core."""
        wanted = sorted({job for job in jobs if job in self._finished and self.core.job(job) is None})
        if not wanted:
            return
        kv = await self.ctx.bus.kv(Bucket.JOB_STATUS)
        found = await get_many(kv, [ids.job_key(job) for job in wanted], JobRecord)
        for record in found.values():
            self.core.load(record)
        for job in wanted:
            self._finished.pop(job, None)  # (a record gone from the bucket: deleted)

    def _shed_finished(self) -> None:
        """Finished jobs past KEEP_FINISHED_SECONDS leave the core for `FinishedJob`s (the lock held)."""
        now = time.time()
        for job in self.core.job_ids():
            record = self.core.job(job)
            if record is not None and sheddable(record, now=now, keep_seconds=KEEP_FINISHED_SECONDS):
                self._finished[job] = finished_job(record)
                self.core.forget(job)
                self._secrets.pop(job, None)

    async def _record(self, job: str) -> JobRecord | None:
        """A job's record, whole: the core's, or read again for a finished job it no longer holds."""
        record = self.core.job(job)
        if record is None and job in self._finished:
            found = await get_json(await self.ctx.bus.kv(Bucket.JOB_STATUS), ids.job_key(job), JobRecord)
            record = found[0] if found is not None else None
        return record

    async def _end_tasks_on_nodes_lost_meanwhile(self) -> None:
        """Tasks on a node the monitor holds lost are ended again at start: the
        kills ordered by its NodeStatus run after the event is acked, so a crash
        in between would leave them running where no one is watching."""
        health = await load_all(await self.ctx.bus.kv(Bucket.NODE_HEALTH), NodeHealthRecord, skip_undecodable=True)
        for record in health.values():
            if not record.healthy and NodeCondition.LOST in record.conditions:
                await self._end_tasks_on_lost_node(record.node, record.reason)

    async def handle_bus(self, messages: list) -> None:
        """A batch of bus events, in stream order: the core's in one `handle()`.

        A node status is no core event; the core events before it are applied
        first, so it ends every task placed on a lost node up to that point."""
        pending: list = []
        for message in messages:
            if isinstance(message, JobDeleted):
                await self._apply(*pending)
                pending = []
                await self._delete_job(message)
                continue
            if isinstance(message, JobArchived):
                await self._apply(*pending)
                pending = []
                await self._archive_job(message)
                continue
            if isinstance(message, NodeStatus):
                await self._apply(*pending)
                pending = []
                if message.lost:
                    await self._end_tasks_on_lost_node(message.node, message.reason)
                continue
            event = from_message(message)
            if event is not None:
                pending.append(event)
        await self._apply(*pending)

    async def _delete_job(self, event: JobDeleted) -> None:
        """A finished job deleted: its task files and logs, then its record (pai_job_status).
        Idempotent: a redelivery, or one after a crash midway, finds what is left and removes it."""
        record = await self._record(event.job)
        if record is None:
            return
        if not record.state.is_final:  # rest deletes only finished jobs; a job never leaves a final state
            log.warning("%s deleted while %s: kept", event.job, record.state.value, extra={"job": event.job})
            return
        if abs(record.createdTime - event.submittedAt) > 1e-3:
            return  # a later job of the same name
        prune = getattr(self.backend, "prune", None)
        if prune is not None:  # the local backend's files; Kubernetes keeps none of its own
            for key in task_keys(record):
                await prune(key)
            release = getattr(self.backend, "release_job", None)
            if release is not None:
                release(event.job)
        await self._forget_status(event.job)
        self.core.forget(event.job)
        self._finished.pop(event.job, None)
        log.info("deleted %s (by %s): its record, task files and logs", event.job, event.by, extra={"job": event.job})

    async def _archive_job(self, event: JobArchived) -> None:
        """The history holds a finished job: its record is marked archived, and leaves
        pai_job_status now if nothing of it is left on disk, else when retention removes
        its task files and logs (`prune_once`): until then its logs stay readable.
        Idempotent."""
        record = await self._record(event.job)
        if record is None or not record.state.is_final or abs(record.createdTime - event.submittedAt) > 1e-3:
            return  # gone already, or a later job of the same name
        if record.archivedAt is None:
            await self._apply(Archived(job=event.job, at=time.time()))
            record = msgspec.structs.replace(record, archivedAt=time.time())
        await self._drop_if_done(record)

    async def _forget_status(self, job: str) -> None:
        """The job's record leaves pai_job_status, its purge marker expiring after a while
        (jetstream_limits.marker_seconds): nothing of the job stays in the bucket."""
        await self.ctx.bus.kv_write_many(Bucket.JOB_STATUS, {ids.job_key(job): None},
                                         gone_after=marker_seconds(self.ctx.config))

    async def _drop_if_done(self, record: JobRecord) -> None:
        """An archived job's record leaves the bucket once nothing on disk needs it."""
        if not record_may_go(record, keeps_files=getattr(self.backend, "prune", None) is not None):
            return
        await self._forget_status(record.job)
        self.core.forget(record.job)
        self._finished.pop(record.job, None)
        log.info("%s is in the history: its record left pai_job_status", record.job, extra={"job": record.job})

    async def pump_backend(self) -> None:
        """Backend events, every one already reported at once through the core.

        Under load (more than one report came together, or tasks of other jobs
        are under way), a task seen running is held a moment for its end
        (core/held.py): a task that ends at once then costs one write of its
        record instead of two. A lone task on an idle launcher is reported
        RUNNING at once, as the idle start latency wants."""
        async for batch in backend_batches(self.backend, BATCH_MAX):
            events = [await self._scrubbed_exit(e) if isinstance(e, TaskFinished) else e for e in batch]
            for event in events:
                if isinstance(event, TaskFinished):
                    self._started.discard(event.key)
            under_load = len(events) > 1 or self._busy_with_others(events)
            now = time.monotonic()
            self._report(self._held.take(events, now=now, hold=under_load), due=now + COMMIT_DELAY_SECONDS if under_load else 0.0)
            if len(self._held) and (self._held_timer is None or self._held_timer.done()):
                self._held_timer = asyncio.ensure_future(self._release_held())
                self._held_timer.add_done_callback(self._background_done)

    def _report(self, events: list, *, due: float = 0.0) -> None:
        """Backend reports into the next transaction. Not waited for: reports
        that come meanwhile join the same transaction, with whatever bus batch
        is waiting too. Under load they may wait until `due` for company."""
        if events:
            self._enqueue(events, waited=False, due=due)

    async def _release_held(self) -> None:
        """Reports held for their task's end go on when their moment has passed."""
        while (at := self._held.next_due()) is not None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            now = time.monotonic()
            self._report(self._held.due(now), due=now + COMMIT_DELAY_SECONDS)

    async def _end_tasks_on_lost_node(self, node: str, reason: str) -> None:
        """The monitor lost `node`: end the tasks placed there. They end like
        any task the launcher did not ask to stop, with platform reason NodeLost,
        so the runtime's PodNodeLost rule retries the job (without counting it)
        and the scheduler, which avoids the unhealthy node, places it elsewhere.
        On the local backend those tasks are real processes of this machine
        (a cluster file's nodes all map onto it), so they are really stopped."""
        async with self.lock:
            keys = live_tasks_on(self.core, node)
        if keys:
            log.warning("node %s is lost (%s): ending %d task(s) there", node, reason, len(keys))
        for key in keys:
            self._in_background(
                self.backend.kill(key, grace_seconds=self.ctx.config.grace_seconds, reason=exits.NODE_LOST_PLATFORM_REASON)
            )

    # -- secrets: opened here alone, filled in at start, scrubbed from what is shown --

    async def _job_uses_secrets(self, job: str) -> bool:
        record = await self._record(job)
        return record is not None and any(job_secrets.needs_secrets(role.commands) for role in record.spec.taskRoles)

    async def _job_secrets(self, job: str) -> dict:
        opened = self._secrets.get(job)
        if opened is None:
            kv = await self.ctx.bus.kv(Bucket.SECRETS)
            opened = self._secrets[job] = await job_secrets.fetch(kv, self.ctx.config.secrets_private_key_file, ids.job_key(job))
        return opened

    async def _secret_values(self, job: str) -> list[str] | None:
        """What to scrub from a job's output: [] for a job without secrets,
        None when its secrets cannot be opened (then nothing of its output is shown)."""
        if not await self._job_uses_secrets(job):
            return []
        try:
            return job_secrets.values_of(await self._job_secrets(job))
        except job_secrets.SecretsUnavailable as exc:
            log.error("cannot scrub the output of %s: %s", job, exc.message)
            return None

    async def _start(self, launch) -> None:
        auth = launch.dockerImageAuth
        if auth and job_secrets.needs_secrets(list(auth.values())):
            # The registry password's references filled in for the pull; the launch
            # travels no further than the backend, which writes no credentials down.
            try:
                secrets = await self._job_secrets(launch.key.job)
            except job_secrets.SecretsUnavailable as exc:
                log.error("pulling the image of %s without its registry secrets: %s", launch.key.slug, exc.message)
            else:
                rendered = {key: render_secrets(value, secrets) for key, value in auth.items()}
                launch = msgspec.structs.replace(launch, dockerImageAuth=rendered)
        if not job_secrets.needs_secrets(launch.commands):
            await self.backend.start(launch)
            return
        try:
            secrets = await self._job_secrets(launch.key.job)
        except job_secrets.SecretsUnavailable as exc:
            # Started without them, its references left as they are: the task
            # fails visibly (and the reason is in the launcher's log) rather
            # than the launcher stalling every other job.
            log.error("starting %s without its secrets: %s", launch.key.slug, exc.message)
            await self.backend.start(launch)
            return
        rendered = [render_secrets(line, secrets) for line in launch.commands]
        await self.backend.start(launch, secret_commands=rendered)

    async def _scrubbed_exit(self, event: TaskFinished) -> TaskFinished:
        values = await self._secret_values(event.key.job)
        if values == []:
            return event
        if values is None:
            return msgspec.structs.replace(
                event, userLogTail="", platformMessage="(hidden: the job's secrets could not be opened to scrub it)")
        return msgspec.structs.replace(
            event,
            userLogTail=scrub_text(event.userLogTail, values),
            platformMessage=scrub_text(event.platformMessage, values),
        )

    async def _apply(self, *events) -> None:
        """Apply `events` in a transaction of the core; return once their effects
        are carried out (raise what went wrong)."""
        if not events:
            return
        turn = self._enqueue(list(events), waited=True)
        try:
            await asyncio.shield(turn.done)
        except asyncio.CancelledError:
            if not turn.done.done() and turn in self._waiting:
                self._waiting.remove(turn)  # not taken yet: never applied
            else:  # its outcome, whatever it is, is no one's any more
                turn.done.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise

    def _busy_with_others(self, batch: list) -> bool:
        """Whether tasks of jobs other than `batch`'s are under way (started, not seen ending)."""
        jobs = {job_of(event) for event in batch}
        return any(key.job not in jobs for key in self._started)

    def _enqueue(self, events: list, *, waited: bool, due: float = 0.0) -> _Turn:
        """Queue `events` for the next transaction (group commit, `_commit_forever`)."""
        turn = _Turn(events, asyncio.get_running_loop().create_future(), waited=waited, due=due)
        self._waiting.append(turn)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.ensure_future(self._commit_forever())
            self._committer.add_done_callback(self._background_done)  # a bug in it stops the service
        self._wake.set()
        return turn

    async def _commit_forever(self) -> None:
        """Group commit: whatever was queued while a transaction's effects were in
        flight (a bus batch, the backend's reports, a timer) goes into the next
        transaction, all at once and in the order it came: one record write per
        job and one round of publications for all of it, instead of one per
        caller. Transactions run one after another, so per job effects keep
        their order. A caller's events are acked (bus) or forgotten only once
        their transaction's effects are durable, as before."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                if not any(turn.waited for turn in self._waiting):
                    # Only the backend's reports, under load: they wait a moment
                    # for company (more reports, a bus batch) -- each transaction
                    # costs two round trips to NATS however little it carries.
                    wait = min(turn.due for turn in self._waiting) - time.monotonic()
                    if wait > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), wait)
                        self._wake.clear()
                        continue
                turns, self._waiting = self._waiting, []
                try:
                    async with self.lock:
                        await self._commit(turns)
                except BaseException:
                    for turn in turns:  # (the shell is closing) no caller waits forever
                        if turn.waited and not turn.done.done():
                            turn.done.cancel()
                    raise

    async def _commit(self, turns: list[_Turn]) -> None:
        """One transaction for `turns` (the lock held); each turn ends with its outcome."""
        events = [event for turn in turns for event in turn.events]
        try:
            await self._read_whole(job_of(event) for event in events)
            actions = self.core.handle(*events)
        except Exception as exc:  # noqa: BLE001 -- handed on to its caller, never swallowed
            if len(turns) == 1:
                self._finish(turns[0], exc)
                return
            # Some turn's events are refused (say, a placement whose submission
            # has not been seen yet): the core rolled all of it back; each turn
            # is applied alone, so only the refused one fails, as ungrouped.
            for turn in turns:
                await self._commit([turn])
            return
        metrics.BATCH_EVENTS.observe(len(events))
        metrics.GROUPED_CALLERS.observe(len(turns))
        try:
            await self._execute(actions)
        except BaseException as exc:
            # Handed again (the bus, or the next incarnation's recovery), the
            # events must order their effects again, not find them done.
            self.core.undo_last()
            if isinstance(exc, asyncio.CancelledError) or all(not t.waited for t in turns):
                for turn in turns:
                    self._finish(turn, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            # Callers waiting get the failure (the bus hands their events again);
            # the backend's reports, which no one waits for, go again next.
            for turn in turns:
                if turn.waited:
                    self._finish(turn, exc)
            self._waiting[:0] = [t for t in turns if not t.waited]
            self._wake.set()
            return
        for turn in turns:
            self._finish(turn, None)

    def _finish(self, turn: _Turn, error: BaseException | None) -> None:
        if turn.waited:
            if turn.done.done():
                pass
            elif error is None:
                turn.done.set_result(None)
            elif isinstance(error, asyncio.CancelledError):
                turn.done.cancel()
            else:
                turn.done.set_exception(error)
        elif error is not None and not isinstance(error, asyncio.CancelledError):
            # The backend's reports could not be applied: as when its pump
            # failed, the service stops, and the next incarnation's recovery
            # learns from the backend what it reported.
            log.error("applying the backend's reports failed", exc_info=error)
            self.ctx.failed = error
            self.ctx.stopping.set()

    async def _execute(self, actions) -> None:
        """Records first (all written before anything else), then tasks and events."""
        if not actions:
            return
        records = {
            ids.job_key(action.record.job): encode_job_record(action.record)
            for action in actions
            if isinstance(action, SaveJob)
        }
        if records:
            await self.ctx.bus.kv_write_many(Bucket.JOB_STATUS, records)
        # The publications go out while the tasks are started: both only
        # after the records are stored, and both done before this returns.
        publications = [action.event for action in actions if isinstance(action, Publish)]
        publishing = asyncio.ensure_future(self.ctx.bus.publish_many(publications)) if publications else None
        held = self._held_for_busy_ports(actions)
        try:
            for action in actions:
                match action:
                    case SaveJob() | Publish():
                        pass
                    case StartTask(launch=launch) if launch.key in held:
                        pass  # its ports are in use: started once the core gave it others
                    case StartTask(launch=launch):
                        metrics.TASKS_STARTED.inc()
                        await self._start(launch)
                        self._started.add(launch.key)
                    case KillTask(key=key, reason=reason, grace_seconds=grace):
                        self._in_background(self.backend.kill(key, grace_seconds=grace, reason=reason))
                    case StartTimer(job=job, attempt=attempt, at=at):
                        self._in_background(self._timer(job, attempt, at))
                    case ForgetTask(key=key):
                        self._started.discard(key)
                        await self.backend.forget(key)
        except BaseException:
            if publishing is not None:
                publishing.cancel()  # (their ids dedupe whatever went out, when handed again)
                publishing.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise
        if publishing is not None:
            await publishing

    def _held_for_busy_ports(self, actions) -> set[TaskKey]:
        """Starts not to carry out: a port of the launch is in use on its node
        (the backend tries them, `ports_in_use`; core/ports.py). Every start of
        that attempt in `actions` is held back, and the ports found busy go to
        the core (PortsBusy, next transaction), which starts them with others."""
        in_use = getattr(self.backend, "ports_in_use", None)
        if in_use is None:
            return set()
        with_ports = [a.launch for a in actions if isinstance(a, StartTask) and a.launch.ports]
        busy: dict[tuple[str, int], dict[str, set[int]]] = {}
        for launch in with_ports:
            found = in_use(launch)
            if found:
                attempt = (launch.key.job, launch.key.attempt)
                busy.setdefault(attempt, {}).setdefault(launch.placement.node, set()).update(found)
        held: set[TaskKey] = set()
        for (job, attempt), ports in busy.items():
            keys = [
                a.launch.key for a in actions
                if isinstance(a, StartTask) and (a.launch.key.job, a.launch.key.attempt) == (job, attempt)
            ]
            held.update(keys)
            log.warning("ports %s of %s attempt %d are in use on the node: giving its tasks others",
                        {node: sorted(p) for node, p in ports.items()}, job, attempt, extra={"job": job})
            self._report([PortsBusy(job=job, attempt=attempt, tasks=keys, busy={n: sorted(p) for n, p in ports.items()})])
        return held

    async def _timer(self, job: str, attempt: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        await self._apply(BackoffElapsed(job=job, attempt=attempt))

    def _in_background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background launcher work failed", exc_info=task.exception())
            self.ctx.failed = task.exception()
            self.ctx.stopping.set()

    # -- retention: finished jobs' files removed past their age (core/retention.py) --

    async def prune_forever(self) -> None:
        while not self.ctx.stopping.is_set():
            try:
                await self.prune_once()
            except NATS_TROUBLE as exc:  # its record is written at the next sweep
                log.warning("retention sweep: NATS trouble (%r); trying again at the next sweep", exc)
            async with self.lock:
                self._shed_finished()
            await asyncio.sleep(min(self.ctx.config.retention_sweep_seconds, KEEP_FINISHED_SECONDS))

    async def prune_once(self) -> list[str]:
        """Remove the files of every finished job past the retention age; the jobs pruned."""
        prune = getattr(self.backend, "prune", None)
        if prune is None:  # a backend that keeps no files of its own (Kubernetes: the pods)
            return []
        now, retention = time.time(), self.ctx.config.retention_finished_seconds
        records = [r for r in (self.core.job(j) for j in self.core.job_ids()) if r is not None]
        due = due_for_pruning(records, now=now, retention_seconds=retention)
        held = [job for job, finished in self._finished.items() if finished.logsPrunedAt is None
                and retention > 0 and now - finished.completedTime >= retention]
        if held:
            kv = await self.ctx.bus.kv(Bucket.JOB_STATUS)
            due += [r for r in (await get_many(kv, [ids.job_key(job) for job in held], JobRecord)).values()
                    if due_for_pruning([r], now=now, retention_seconds=retention)]
        for record in due:
            for key in task_keys(record):
                await prune(key)
            release_job = getattr(self.backend, "release_job", None)
            if release_job is not None:  # the job's uid may go to another job (local backend)
                release_job(record.job)
            await self._apply(LogsPruned(job=record.job, at=time.time()))
            log.info("removed the task files and logs of %s (finished %.0fs ago)", record.job,
                     time.time() - (record.completedTime or 0.0), extra={"job": record.job})
            await self._drop_if_done(msgspec.structs.replace(record, logsPrunedAt=time.time()))
        # Archived records whose logs went before a crash kept them from going with them.
        left = [job for job, finished in self._finished.items()
                if finished.archivedAt is not None and finished.logsPrunedAt is not None]
        for job in left:
            record = await self._record(job)
            if record is not None:
                await self._drop_if_done(record)
        return [record.job for record in due]

    async def serve_logs(self) -> None:
        snapshots = LogSnapshots()  # a long log's chunks are cut from one read (services/launcher/log_snapshots.py)

        async def answer(msg) -> None:
            try:
                req = msgspec.json.decode(msg.data, type=LogRequest)
                data = snapshots.usable(req, time.monotonic())
                if data is None:
                    data = await self._read_log(req)
                    snapshots.keep(req, data, time.monotonic())
                reply = LogReply(found=True, data=chunk_of(data, req), size=len(data))
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                reply = LogReply(found=False, error=f"bad log request: {exc}")
            except PaiError as exc:
                reply = LogReply(found=False, error=exc.message)
            await msg.respond(msgspec.json.encode(reply))

        await self.ctx.bus.nc.subscribe(LOG_SUBJECT, queue="launcher", cb=answer)

    async def _read_log(self, req: LogRequest) -> bytes:
        record = await self._record(req.job)
        if record is None:
            raise NotFound(f"no job {req.job}")
        if record.logsPrunedAt is not None:
            raise NotFound(
                f"the logs of {req.job} were removed {record.logsPrunedAt - (record.completedTime or 0.0):.0f}s "
                f"after it finished: finished jobs' logs are kept {self.ctx.config.retention_finished_seconds:g}s "
                "(retention_finished_seconds)"
            )
        attempt = record.attempt_record(req.attempt)
        # A compacted older attempt knows its other tasks by their brief alone.
        task = (attempt.task(req.role, req.index) or attempt.brief(req.role, req.index)) if attempt else None
        started = task is not None and (task.startRequested if isinstance(task, TaskRecord) else task.started)
        if task is None or not started:
            raise NotFound(f"task {req.role}[{req.index}] of {req.job} attempt {req.attempt} has not started")
        key = TaskKey(job=req.job, attempt=req.attempt, role=req.role, index=req.index,
                      taskAttempt=task.taskAttempt if req.taskAttempt is None else req.taskAttempt)
        values = await self._secret_values(req.job)
        if values is None:
            raise NotFound(f"the log of {req.job} cannot be shown: its secrets cannot be opened to scrub it")
        # Scrubbed whole, then cut: a tail must not begin inside a secret.
        margin = max((len(v.encode()) for v in values), default=0)
        tail = req.tailBytes + margin if req.tailBytes is not None and values else req.tailBytes
        data = await self.backend.read_log(key, tail_bytes=tail)
        if values:
            data = _without_secret_start(scrub_bytes(data, values), values)
            if req.tailBytes is not None:
                data = data[-req.tailBytes :] if req.tailBytes else b""
        return data  # the caller cuts the chunk asked for (offset, length)

    def locate_task(self, job: str, role: str, index: int) -> Located | TerminalOpenReply:
        """The running task a browser terminal asks for (services/launcher/terminals.py), or
        why there is none: 404 no such task, 409 not running."""
        record = self.core.job(job)
        if record is None or not record.attempts:
            return TerminalOpenReply(ok=False, status=409, error=f"{job} has no running task")
        attempt = record.current
        task = attempt.task(role, index)
        if task is None:
            return TerminalOpenReply(ok=False, status=404, error=f"{job} has no task {role}[{index}]")
        if record.state.is_final or task.state != TaskState.RUNNING or not task.live or task.killReason is not None:
            return TerminalOpenReply(ok=False, status=409, error=(
                f"task {role}[{index}] of {job} is {task.state.value if task.killReason is None else 'being stopped'}, "
                "not running: a terminal opens only in a running task"))
        key = TaskKey(job=job, attempt=attempt.attempt, role=role, index=index, taskAttempt=task.taskAttempt)
        return Located(key, record.vc)

    async def close(self) -> None:
        for task in (self._committer, self._held_timer):
            if task is not None:
                task.cancel()
        for task in list(self._background):
            task.cancel()
        await self.backend.close()


def live_tasks_on(core: LauncherCore, node: str) -> list[TaskKey]:
    """Task attempts of active jobs placed on `node` that may still run and that the
    launcher has not already ordered killed."""
    keys: list[TaskKey] = []
    for job in core.job_ids():
        record = core.job(job)
        if record is None or record.state.is_final or not record.attempts:
            continue
        attempt = record.current
        for task in attempt.tasks:
            if task.node == node and task.live and task.killReason is None:
                keys.append(TaskKey(job=job, attempt=attempt.attempt, role=task.role, index=task.index,
                                    taskAttempt=task.taskAttempt))
    return keys


def backend_batches(backend: Backend, most: int) -> AsyncIterator[list]:
    """The backend's reports in lists of at most `most`: its own `event_batches` where
    it has one (the local backend's, without a queue and a reader task between), else
    `event_batches` over its `events()`."""
    own = getattr(backend, "event_batches", None)
    return own(most) if own is not None else event_batches(backend.events(), most)


async def event_batches(events: AsyncIterator, most: int) -> AsyncIterator[list]:
    """`events` in lists: the next one (waited for), with every one already there
    behind it, up to `most`. A reader moves them across while a batch is
    handled, so whatever arrived meanwhile makes the next batch."""
    waiting: asyncio.Queue = asyncio.Queue()
    ended = object()

    async def read() -> None:
        try:
            async for event in events:
                waiting.put_nowait(event)
        finally:
            waiting.put_nowait(ended)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            batch = [await waiting.get()]
            while len(batch) < most and not waiting.empty():
                batch.append(waiting.get_nowait())
            done = batch[-1] is ended
            if done:
                batch.pop()
            if batch:
                yield batch
            if done:
                reader.result()  # a reader that failed fails the pump
                return
    finally:
        reader.cancel()


def _without_secret_start(data: bytes, values: list[str]) -> bytes:
    """`data` less a trailing beginning of a secret: a task still printing one
    (or a log read mid-write) must not show its first characters; the whole
    secret is masked once it is there (follow mode reads on from here)."""
    cut = 0
    for value in values:
        raw = value.encode()
        for length in range(min(len(raw) - 1, len(data)), cut, -1):
            if data.endswith(raw[:length]):
                cut = length
                break
    return data[: len(data) - cut] if cut else data


async def body(ctx: ServiceContext) -> None:
    core = LauncherCore(time.time, kill_grace_seconds=ctx.config.grace_seconds)
    backend = make_backend(ctx.config)
    shell = LauncherShell(ctx, core, backend)
    terminals: TerminalSessions | None = None
    try:
        await shell.restore()
        # The restored records (every job the launcher still holds) are long-lived:
        # keep the collector's full collections from walking them again and again.
        # A record replaced later is still freed, by its reference count.
        gc.freeze()
        ctx.spawn(shell.pump_backend(), "backend-events")
        ctx.spawn(shell.prune_forever(), "retention")
        await shell.serve_logs()
        await serve_tensorboard(ctx.bus, core)  # a job's TensorBoard for rest (services/launcher/tensorboard_relay.py)
        terminals = TerminalSessions(
            ctx.bus, getattr(backend, "open_terminal", None), shell.locate_task,
            idle_seconds=ctx.config.terminal_idle_seconds, most=ctx.config.terminal_sessions_max)
        await terminals.serve()
        ctx.set_ready()
        await ctx.bus.consume_batches(
            Durable.LAUNCHER, CONSUMED_KINDS, CONSUMED_TYPES, shell.handle_bus, stopping=ctx.stopping, ordered=True
        )
    finally:
        if terminals is not None:
            await terminals.close()
        await shell.close()


def main() -> None:
    service.run("launcher", load_config(), body, single_active=True)
