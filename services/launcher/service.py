"""launcher's shell: bus events and backend events in, core actions carried out.

Order of effects for one `handle()` (the core's contract): every `SaveJob` is
written to KV first, then tasks are started or killed and events published. A
crash in between is healed at start-up: records are loaded, the backend
re-adopts its tasks, and `core.recover` starts what was ordered but never
started and reports what died meanwhile, so no task attempt starts twice.

Kills run in the background: a stop waits out the grace period, and the
launcher must go on handling other jobs meanwhile; the backend's TaskFinished
reports the end.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from libs.common import ids, service
from libs.common.bus import load_all
from libs.common.config import Config, load_config
from libs.common.errors import NotFound, PaiError
from libs.common.logs import LOG_SUBJECT, LogReply, LogRequest, MAX_REPLY_BYTES
from libs.common.messages import JobPlaced, JobSubmitted, PreemptRequested, StopRequested, TaskVerdict
from libs.common.records import JobRecord, encode_job_record
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.launcher import metrics
from services.launcher.backends.base import Backend
from services.launcher.core.tasks import TaskKey
from services.launcher.core import (
    BackoffElapsed,
    ForgetTask,
    KillTask,
    LauncherCore,
    Publish,
    SaveJob,
    StartTask,
    StartTimer,
    from_message,
)

log = logging.getLogger("pai.launcher")

CONSUMED_KINDS = [Kind.JOB_SUBMITTED, Kind.JOB_PLACED, Kind.JOB_PREEMPT, Kind.JOB_STOP_REQUESTED, Kind.TASK_VERDICT]
CONSUMED_TYPES = (JobSubmitted, JobPlaced, PreemptRequested, StopRequested, TaskVerdict)


def make_backend(config: Config) -> Backend:
    if config.backend == "kubernetes":
        from services.launcher.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_config_sync(config.kube_api_url or None, config.kube_namespace)
    from services.launcher.backends.local import LocalBackend

    return LocalBackend(
        config.data_path / "launcher",
        log_cap_bytes=config.task_log_cap_bytes,
        grace_seconds=config.grace_seconds,
    )


class LauncherShell:
    def __init__(self, ctx: ServiceContext, core: LauncherCore, backend: Backend):
        self.ctx = ctx
        self.core = core
        self.backend = backend
        self.lock = asyncio.Lock()
        self._background: set[asyncio.Task] = set()

    async def restore(self) -> None:
        records = await load_all(await self.ctx.bus.kv(Bucket.JOB_STATUS), JobRecord)
        for record in records.values():
            self.core.load(record)
        known = await self.backend.recover()
        async with self.lock:
            await self._execute(self.core.recover(set(known)))
        log.info("restored %d jobs; backend knows %d tasks", len(records), len(known))

    async def handle_bus(self, message) -> None:
        event = from_message(message)
        if event is not None:
            await self._apply(event)

    async def pump_backend(self) -> None:
        async for event in self.backend.events():
            await self._apply(event)

    async def _apply(self, event) -> None:
        async with self.lock:
            actions = self.core.handle(event)
            await self._execute(actions)

    async def _execute(self, actions) -> None:
        if not actions:
            return
        kv = await self.ctx.bus.kv(Bucket.JOB_STATUS)
        for action in actions:
            if isinstance(action, SaveJob):
                await kv.put(ids.job_key(action.record.job), encode_job_record(action.record))
        for action in actions:
            match action:
                case SaveJob():
                    pass
                case StartTask(launch=launch):
                    metrics.TASKS_STARTED.inc()
                    await self.backend.start(launch)
                case KillTask(key=key, reason=reason, grace_seconds=grace):
                    self._in_background(self.backend.kill(key, grace_seconds=grace, reason=reason))
                case Publish(event=event):
                    await self.ctx.bus.publish(event)
                case StartTimer(job=job, attempt=attempt, at=at):
                    self._in_background(self._timer(job, attempt, at))
                case ForgetTask(key=key):
                    await self.backend.forget(key)

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

    async def serve_logs(self) -> None:
        async def answer(msg) -> None:
            try:
                req = msgspec.json.decode(msg.data, type=LogRequest)
                data = await self._read_log(req)
                reply = LogReply(found=True, data=data[-MAX_REPLY_BYTES:])
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                reply = LogReply(found=False, error=f"bad log request: {exc}")
            except PaiError as exc:
                reply = LogReply(found=False, error=exc.message)
            await msg.respond(msgspec.json.encode(reply))

        await self.ctx.bus.nc.subscribe(LOG_SUBJECT, queue="launcher", cb=answer)

    async def _read_log(self, req: LogRequest) -> bytes:
        record = self.core.job(req.job)
        if record is None:
            raise NotFound(f"no job {req.job}")
        attempt = record.attempt_record(req.attempt)
        task = attempt.task(req.role, req.index) if attempt else None
        if task is None or not task.startRequested:
            raise NotFound(f"task {req.role}[{req.index}] of {req.job} attempt {req.attempt} has not started")
        key = TaskKey(job=req.job, attempt=req.attempt, role=req.role, index=req.index, taskAttempt=task.taskAttempt if req.taskAttempt is None else req.taskAttempt)
        data = await self.backend.read_log(key, tail_bytes=req.tailBytes)
        return data[req.offset :] if req.offset else data

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await self.backend.close()


async def body(ctx: ServiceContext) -> None:
    core = LauncherCore(time.time, kill_grace_seconds=ctx.config.grace_seconds)
    backend = make_backend(ctx.config)
    shell = LauncherShell(ctx, core, backend)
    try:
        await shell.restore()
        ctx.spawn(shell.pump_backend(), "backend-events")
        await shell.serve_logs()
        ctx.set_ready()
        await ctx.bus.consume(Durable.LAUNCHER, CONSUMED_KINDS, CONSUMED_TYPES, shell.handle_bus, stopping=ctx.stopping, ordered=True)
    finally:
        await shell.close()


def main() -> None:
    service.run("launcher", load_config(), body, single_active=True)
