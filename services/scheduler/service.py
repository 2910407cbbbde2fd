"""scheduler's shell: bus events in, core decisions carried out.

The cycle per event, as kueue's admit/assume: the core decides and records its
decisions at once (cells bound, attempt numbered, first wait noted); the shell
then does the I/O for each decision: the job's entry in KV (pai_schedule, key
user.name) and the event on the bus. A decision the shell could not carry out
goes back into the core as `NotSent`; the core gives it again, brought up to
date, with the next event or Tick, and the event in hand is nak'ed so it is
redelivered. No placement waits for a restart to reach the launcher.

The shell keeps no copy of the core's state: what it stores is `core.entry(job)`.
At start-up placed jobs are restored onto their cells and waiting jobs are queued
again, in submission order, before any event is consumed; placements whose
`JobPlaced` may have been lost in a crash are published again (the event id
dedupes them).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import msgspec
import nats.errors

from libs.common import ids, machine, service
from libs.common.bus import load_all
from libs.common.config import Config, load_config
from libs.common.errors import Transient
from libs.common.messages import (
    JobPlaced,
    JobReleased,
    JobSubmitted,
    JobWaiting,
    NodeStatus,
    PreemptRequested,
    StopRequested,
)
from libs.common.records import JobRecord as LauncherRecord
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView, ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.scheduler import metrics
from services.scheduler.cluster import ClusterConfig, load_cluster_config, local_cluster_config
from services.scheduler.cluster.published import node_cells_view, sku_types_view
from services.scheduler.core import (
    Cancel,
    Decision,
    NodeHealth,
    NotSent,
    Place,
    Preempt,
    RefreshReasons,
    Release,
    Restore,
    SchedulerCore,
    Submit,
    Tick,
    Wait,
)
from services.scheduler.core.truth import Outcome, check_restore, truth_from_record

log = logging.getLogger("pai.scheduler")

TICK_SECONDS = 1.0
# What goes wrong talking to NATS (a publish the stream refuses included); anything else is a bug.
NATS_TROUBLE = (Transient, nats.errors.Error, asyncio.TimeoutError, OSError)
CONSUMED = (JobSubmitted, StopRequested, JobReleased, NodeStatus)


def cluster_config(config: Config) -> ClusterConfig:
    if config.cluster_file:
        return load_cluster_config(config.cluster_file)
    info = machine.detect()
    return local_cluster_config(node=info.hostname, gpus=info.gpus, cpus=config.local_cpus or info.cpus,
                                memory_mb=info.memory_mb, cpu_oversubscription=config.cpu_oversubscription)


class SchedulerShell:
    def __init__(self, ctx: ServiceContext, core: SchedulerCore):
        self.ctx = ctx
        self.core = core
        self.lock = asyncio.Lock()
        self._view_dirty = True

    async def restore(self) -> None:
        """Rebuild from pai_schedule, checked against the launcher's job documents
        (core/truth.py): stale placements free their cells, attempts the launcher
        runs keep theirs."""
        stored = await load_all(await self.ctx.bus.kv(Bucket.SCHEDULE), ScheduleEntry)
        launcher = await load_all(await self.ctx.bus.kv(Bucket.JOB_STATUS), LauncherRecord)
        placed, queued, vcs = [], [], {}
        for entry in stored.values():
            if entry.spec is None:
                continue
            vcs[(entry.job, entry.attempt)] = entry.vc
            if entry.placed:
                placed.append(Restore(job=entry.job, attempt=entry.attempt, spec=entry.spec, tasks=entry.tasks))
            else:
                queued.append(Submit(job=entry.job, attempt=entry.attempt, spec=entry.spec, at=entry.queuedAt))
        queued.sort(key=lambda submit: (submit.at or 0.0, submit.job))
        truth = {record.job: truth_from_record(record) for record in launcher.values()}
        checked = check_restore(placed, queued, truth)
        decisions = self.core.handle(*checked.restores, *checked.queued)
        for note in checked.notes:
            if note.outcome is not Outcome.KEPT:
                log.warning("restore: %s#%d %s: %s", note.job, note.attempt, note.outcome.value, note.why,
                            extra={"job": note.job})
        log.info("restored %d placed and %d waiting jobs", len(checked.restores), len(checked.queued))
        await self._carry_out(decisions, touched=checked.changed_jobs(), cause="restore")
        # A placement recorded just before a crash may never have reached the launcher.
        for note in checked.notes:
            restore = next((r for r in checked.restores if r.job == note.job and r.attempt == note.attempt), None)
            if note.outcome is Outcome.KEPT and restore is not None:
                vc = vcs.get((note.job, note.attempt), restore.spec.virtualCluster)
                await self.ctx.bus.publish(placed_event(note.job, note.attempt, vc, restore.tasks, cause="restore"))

    async def handle(self, event) -> None:
        async with self.lock:
            match event:
                case JobSubmitted(spec=spec):
                    decisions = self.core.handle(Submit(job=event.job, attempt=1, spec=spec, at=event.at))
                case JobReleased(attempt=attempt, requeue=requeue):
                    decisions = self.core.handle(Release(job=event.job, attempt=attempt, requeue=requeue))
                case StopRequested():
                    decisions = self.core.handle(Cancel(job=event.job))
                case NodeStatus(node=node, healthy=healthy, reason=reason):
                    if node not in self.core.node_names():
                        return
                    decisions = self.core.handle(NodeHealth(node=node, healthy=healthy, reason=reason))
                case _:
                    return
            self._view_dirty = True
            touched = [] if isinstance(event, NodeStatus) else [event.job]
            await self._carry_out(decisions, touched=touched, cause=event.id)

    async def tick_forever(self) -> None:
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(TICK_SECONDS)
            async with self.lock:
                try:
                    await self._carry_out(self.core.handle(Tick()), touched=[], cause="tick")
                    if self._view_dirty:
                        self._view_dirty = False
                        # The core gives a Wait only when the kind of wait changes; the
                        # counts in its text move with every placement and release.
                        await self._carry_out(self.core.handle(RefreshReasons()), touched=[], cause="refresh")
                        await self.publish_view()
                except NATS_TROUBLE as error:
                    self._view_dirty = True
                    log.warning("tick: NATS trouble (%r); trying again at the next tick", error)

    async def publish_view(self) -> None:
        cells = node_cells_view(self.core.config)
        view = ClusterView(
            virtualClusters=[msgspec.to_builtins(vc) for vc in self.core.vc_status()],
            nodes=[{"name": n, "cells": cells.get(n, [])} for n in self.core.node_names()],
            skuTypes=sku_types_view(self.core.config),
            updatedAt=time.time(),
        )
        await (await self.ctx.bus.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))

    async def _carry_out(self, decisions: list[Decision], *, touched: list[str], cause: str) -> None:
        """Record and publish every decision; what fails goes back to the core as NotSent.

        Raises Transient when anything failed, so the event in hand is redelivered."""
        failed: list[Decision] = []
        unrecorded = 0  # recorded again when the event in hand is redelivered
        for job in touched:
            try:
                await self._record(job)
            except NATS_TROUBLE as error:
                log.warning("recording %s failed (%r)", job, error, extra={"job": job})
                unrecorded += 1
        for decision in decisions:
            try:
                await self._carry_out_one(decision, cause=cause)
            except NATS_TROUBLE as error:
                log.warning("%s of %s#%d not sent (%r); the core gives it again", type(decision).__name__,
                            decision.job, decision.attempt, error, extra={"job": decision.job})
                failed.append(decision)
        if failed:
            self.core.handle(*(NotSent(decision=d) for d in failed))
        if failed or unrecorded:
            raise Transient(f"{len(failed) + unrecorded} effect(s) of {cause} not carried out; done again later")

    async def _carry_out_one(self, decision: Decision, *, cause: str) -> None:
        match decision:
            case Place(job=job, attempt=attempt, vc=vc, tasks=tasks, partial=partial):
                await self._record(job)
                metrics.DECISIONS.labels(kind="place").inc()
                await self.ctx.bus.publish(placed_event(job, attempt, vc, tasks, cause=cause, partial=partial))
            case Preempt(job=job, attempt=attempt, vc=vc, by=by, reason=reason):
                metrics.DECISIONS.labels(kind="preempt").inc()
                await self.ctx.bus.publish(
                    PreemptRequested(id=f"{job}/{attempt}/preempt", job=job, cause=cause, at=time.time(), vc=vc, attempt=attempt, by=by, reason=reason)
                )
            case Wait(job=job, attempt=attempt, vc=vc, reason=reason, first=first):
                await self._record(job)
                if cause != "refresh":
                    metrics.DECISIONS.labels(kind="wait").inc()
                if first:
                    await self.ctx.bus.publish(
                        JobWaiting(id=f"{job}/{attempt}/waiting", job=job, cause=cause, at=time.time(), vc=vc, attempt=attempt, reason=reason)
                    )

    async def _record(self, job: str) -> None:
        """Store what the core holds about the job's current attempt (or that it holds nothing)."""
        kv = await self.ctx.bus.kv(Bucket.SCHEDULE)
        entry = self.core.entry(job)
        if entry is None:
            await kv.delete(ids.job_key(job))
        else:
            await kv.put(ids.job_key(job), msgspec.json.encode(entry))


def placed_event(job: str, attempt: int, vc: str, tasks, *, cause: str, partial: bool = False) -> JobPlaced:
    suffix = "" if not partial else "/" + ",".join(f"{t.role}.{t.index}" for t in tasks)
    return JobPlaced(id=f"{job}/{attempt}/placed{suffix}", job=job, cause=cause, at=time.time(), vc=vc, attempt=attempt, tasks=list(tasks), partial=partial)


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
