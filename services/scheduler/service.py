"""scheduler's shell: bus events in, core decisions out.

Cycle per event (kueue's admit/assume): decide in the pure core, record the
outcome in KV (pai_schedule, key user.name), then publish. The KV record is the
scheduler's durable state: at start-up placed jobs are restored onto their cells
and waiting jobs are queued again, in submission order, before any event is
consumed; placements whose `JobPlaced` may have been lost in a crash are
published again (the event id dedupes them).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import msgspec

from libs.common import ids, machine, service
from libs.common.bus import load_all
from libs.common.config import Config, load_config
from libs.common.messages import (
    JobPlaced,
    JobReleased,
    JobSubmitted,
    JobWaiting,
    NodeStatus,
    PreemptRequested,
    StopRequested,
)
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView, ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.scheduler import metrics
from services.scheduler.cluster import ClusterConfig, load_cluster_config, local_cluster_config
from services.scheduler.core import (
    Cancel,
    NodeHealth,
    Place,
    Preempt,
    Release,
    Restore,
    SchedulerCore,
    Submit,
    Tick,
    Wait,
)

log = logging.getLogger("pai.scheduler")

TICK_SECONDS = 1.0
CONSUMED = (JobSubmitted, StopRequested, JobReleased, NodeStatus)


def cluster_config(config: Config) -> ClusterConfig:
    if config.cluster_file:
        return load_cluster_config(config.cluster_file)
    info = machine.detect()
    return local_cluster_config(node=info.hostname, gpus=info.gpus, cpus=info.cpus, memory_mb=info.memory_mb)


class SchedulerShell:
    def __init__(self, ctx: ServiceContext, core: SchedulerCore):
        self.ctx = ctx
        self.core = core
        self.lock = asyncio.Lock()
        self.entries: dict[str, ScheduleEntry] = {}
        self._view_dirty = True

    async def restore(self) -> None:
        stored = await load_all(await self.ctx.bus.kv(Bucket.SCHEDULE), ScheduleEntry)
        restores, queued = [], []
        for entry in stored.values():
            if entry.spec is None:
                continue
            self.entries[entry.job] = entry
            if entry.placed:
                restores.append(Restore(job=entry.job, attempt=entry.attempt, spec=entry.spec, tasks=entry.tasks))
            else:
                queued.append((entry.queuedAt, entry.job, Submit(job=entry.job, attempt=entry.attempt, spec=entry.spec)))
        queued.sort(key=lambda q: (q[0], q[1]))
        decisions = self.core.handle(*restores, *(q[2] for q in queued))
        log.info("restored %d placed and %d waiting jobs", len(restores), len(queued))
        await self._apply(decisions, cause="restore")
        # A placement recorded just before a crash may never have reached the launcher.
        for entry in list(self.entries.values()):
            if entry.placed:
                await self._publish_placed(entry, cause="restore")

    async def handle(self, event) -> None:
        async with self.lock:
            match event:
                case JobSubmitted(spec=spec):
                    if event.job in self.entries:
                        return  # redelivered
                    entry = ScheduleEntry(
                        job=event.job, attempt=1, vc=spec.virtualCluster, reason="queued", updatedAt=time.time(), spec=spec, queuedAt=event.at
                    )
                    await self._save(entry)
                    decisions = self.core.handle(Submit(job=event.job, attempt=1, spec=spec))
                case JobReleased(attempt=attempt, requeue=requeue):
                    entry = self.entries.get(event.job)
                    if entry is None or entry.attempt != attempt:
                        return  # already handled, or a late release of an old attempt
                    if requeue:
                        again = msgspec.structs.replace(
                            entry, attempt=attempt + 1, placed=False, tasks=[], reason="queued again", updatedAt=time.time()
                        )
                        await self._save(again)
                    else:
                        await self._forget(event.job)
                    decisions = self.core.handle(Release(job=event.job, attempt=attempt, requeue=requeue))
                case StopRequested():
                    entry = self.entries.get(event.job)
                    decisions = self.core.handle(Cancel(job=event.job))
                    if entry is not None and not entry.placed:
                        await self._forget(event.job)
                case NodeStatus(node=node, healthy=healthy, reason=reason):
                    if node not in self.core.node_names():
                        return
                    decisions = self.core.handle(NodeHealth(node=node, healthy=healthy, reason=reason))
                case _:
                    return
            await self._apply(decisions, cause=event.id)
            self._view_dirty = True

    async def tick_forever(self) -> None:
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(TICK_SECONDS)
            async with self.lock:
                await self._apply(self.core.handle(Tick()), cause="tick")
                if self._view_dirty:
                    self._view_dirty = False
                    await self._refresh_reasons()
                    await self.publish_view()

    async def _refresh_reasons(self) -> None:
        """Keep the stored reasons' live figures (cells free, jobs ahead) current.

        The core decides Wait only when the kind of wait changes; the counts in
        its text move with every placement and release.
        """
        for entry in list(self.entries.values()):
            if entry.placed:
                continue
            reason = self.core.waiting_reason(entry.job)
            if reason and reason != entry.reason:
                await self._save(msgspec.structs.replace(entry, reason=reason, updatedAt=time.time()))

    async def publish_view(self) -> None:
        view = ClusterView(
            virtualClusters=[msgspec.to_builtins(vc) for vc in self.core.vc_status()],
            nodes=[{"name": n} for n in self.core.node_names()],
            updatedAt=time.time(),
        )
        await (await self.ctx.bus.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))

    async def _apply(self, decisions, *, cause: str) -> None:
        for decision in decisions:
            match decision:
                case Place(job=job, attempt=attempt, tasks=tasks, partial=partial):
                    entry = self.entries.get(job)
                    if entry is None:
                        log.error("placed unknown job %s", job, extra={"job": job})
                        continue
                    all_tasks = (list(entry.tasks) + list(tasks)) if entry.placed else list(tasks)
                    entry = msgspec.structs.replace(entry, attempt=attempt, placed=True, tasks=all_tasks, reason="", updatedAt=time.time())
                    await self._save(entry)
                    metrics.DECISIONS.labels(kind="place").inc()
                    await self._publish_placed(entry, cause=cause, tasks=tasks, partial=partial)
                case Preempt(job=job, attempt=attempt, vc=vc, by=by, reason=reason):
                    metrics.DECISIONS.labels(kind="preempt").inc()
                    await self.ctx.bus.publish(
                        PreemptRequested(id=f"{job}/{attempt}/preempt", job=job, cause=cause, at=time.time(), vc=vc, attempt=attempt, by=by, reason=reason)
                    )
                case Wait(job=job, attempt=attempt, vc=vc, reason=reason):
                    entry = self.entries.get(job)
                    if entry is None or entry.placed:
                        continue
                    first = not entry.reason or entry.reason.startswith("queued")
                    await self._save(msgspec.structs.replace(entry, reason=reason, updatedAt=time.time()))
                    metrics.DECISIONS.labels(kind="wait").inc()
                    if first:
                        await self.ctx.bus.publish(
                            JobWaiting(id=f"{job}/{attempt}/waiting", job=job, cause=cause, at=time.time(), vc=vc, attempt=attempt, reason=reason)
                        )

    async def _publish_placed(self, entry: ScheduleEntry, *, cause: str, tasks=None, partial: bool = False) -> None:
        tasks = entry.tasks if tasks is None else tasks
        suffix = "" if not partial else "/" + ",".join(f"{t.role}.{t.index}" for t in tasks)
        await self.ctx.bus.publish(
            JobPlaced(id=f"{entry.job}/{entry.attempt}/placed{suffix}", job=entry.job, cause=cause, at=time.time(), vc=entry.vc, attempt=entry.attempt, tasks=list(tasks), partial=partial)
        )

    async def _save(self, entry: ScheduleEntry) -> None:
        self.entries[entry.job] = entry
        await (await self.ctx.bus.kv(Bucket.SCHEDULE)).put(ids.job_key(entry.job), msgspec.json.encode(entry))

    async def _forget(self, job: str) -> None:
        self.entries.pop(job, None)
        await (await self.ctx.bus.kv(Bucket.SCHEDULE)).delete(ids.job_key(job))



async def body(ctx: ServiceContext) -> None:
    core = SchedulerCore(cluster_config(ctx.config), clock=time.time)
    shell = SchedulerShell(ctx, core)
    await shell.restore()
    for warning in core.restore_warnings:
        log.warning("restore: %s", warning)
    # The cell tree lives as long as the process: keep the cyclic collector from
    # walking it again and again (pauses of hundreds of ms on big clusters).
    gc.freeze()
    await shell.publish_view()
    ctx.spawn(shell.tick_forever(), "tick")
    ctx.set_ready()
    await ctx.bus.consume(
        Durable.SCHEDULER,
        [Kind.JOB_SUBMITTED, Kind.JOB_STOP_REQUESTED, Kind.JOB_RELEASED, Kind.NODE_STATUS],
        CONSUMED,
        shell.handle,
        stopping=ctx.stopping,
        ordered=True,
    )


def main() -> None:
    service.run("scheduler", load_config(), body, single_active=True)
