"""scheduler's shell: bus events in, core decisions carried out.

The cycle per batch of events, as kueue's admit/assume: the core takes every
event of the batch in one `handle(*events)` and records its decisions at once
(cells bound, attempt numbered, first wait noted); the shell then does the I/O
for the whole batch: each touched job's entry in KV (pai_schedule, key
user.name) written once, then every decision's event published, all in flight
together. The entries go first: a JobPlaced never reaches the bus before the
placement it announces is stored, so a restart cannot give its cells away.

What the shell could not carry out goes back into the core as `NotSent`; the
core gives it again, brought up to date, with the next event or Tick, and the
batch raises `Transient`, so the bus hands its events again one at a time.
That replay changes nothing twice: the core ignores what it already knows, the
entries are written from its current state, and the events carry
deterministic ids that JetStream deduplicates. No placement waits for a
restart to reach the launcher.

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
from collections.abc import Iterable, Mapping, Sequence

import msgspec
import nats.errors

from libs.common import ids, machine, service
from libs.common.bus import load_all, read_pages
from libs.common.config import Config, load_config
from libs.common.errors import BadInput, Transient
from libs.common.jetstream_limits import marker_seconds
from libs.common.messages import (
    Event,
    JobArchived,
    JobDeleted,
    JobPlaced,
    JobReleased,
    JobState,
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
    Announce,
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
# Waiting reasons carry live counts (cells free, jobs ahead) that move with every
# placement and release, so refreshing them rewrites the entry of nearly every
# waiting job. Under a long queue that would be thousands of KV writes a second for
# a number a person reads now and then: the refresh (and the cluster view with it)
# then comes less often, at most this many entries a second on average, and at
# least every REFRESH_MAX_SECONDS.
REFRESH_ENTRIES_PER_SECOND = 500.0
REFRESH_MAX_SECONDS = 30.0
# A reason is refreshed only once it is this old: a job placed within seconds of its
# Wait (most of a burst) has its entry written when queued and when placed, not in
# between as well -- that was about one more write (a PubAck, a watch delivery to
# rest) per job. Its kind is always current (a change of kind is written at once);
# only the counts in its text may be this much older than a refresh.
REFRESH_MIN_AGE_SECONDS = 5.0
# What goes wrong talking to NATS (a publish the stream refuses included); anything else is a bug.
NATS_TROUBLE = (Transient, nats.errors.Error, asyncio.TimeoutError, OSError)
# A failed batch names this many of its decisions in the log.
LOGGED_DECISIONS = 10
CONSUMED = (JobSubmitted, StopRequested, JobReleased, NodeStatus, JobDeleted, JobArchived)
CONSUMED_KINDS = [Kind.JOB_SUBMITTED, Kind.JOB_STOP_REQUESTED, Kind.JOB_RELEASED, Kind.NODE_STATUS, Kind.JOB_DELETED,
                  Kind.JOB_ARCHIVED]


def cluster_config(config: Config) -> ClusterConfig:
    if config.cluster_file:
        return load_cluster_config(config.cluster_file)
    info = machine.detect()
    return local_cluster_config(node=info.hostname, gpus=info.gpus, cpus=config.local_cpus or info.cpus,
                                memory_mb=info.memory_mb, cpu_oversubscription=config.cpu_oversubscription)


def refresh_interval(waiting: int) -> float:
    """Seconds between two refreshes of the waiting reasons with `waiting` jobs queued."""
    return min(REFRESH_MAX_SECONDS, max(TICK_SECONDS, waiting / REFRESH_ENTRIES_PER_SECOND))


class _State(msgspec.Struct):
    state: JobState = JobState.WAITING  # the record leaves its defaults out


_state_decoder = msgspec.json.Decoder(_State)


async def live_launcher_records(kv, *, also: Iterable[str]) -> dict[str, LauncherRecord]:
    """The launcher's records of unfinished jobs, and of the keys in `also`,
    whatever their state: a finished job the scheduler does not hold changes
    nothing in its restore (core/truth.py), so it is never decoded whole."""
    wanted = set(also)
    records: dict[str, LauncherRecord] = {}
    async for page in read_pages(kv):
        for entry in page:
            records.pop(entry.key, None)
            if entry.value and (entry.key in wanted or not _state_decoder.decode(entry.value).state.is_final):
                records[entry.key] = msgspec.json.decode(entry.value, type=LauncherRecord)
    return records


class SchedulerShell:
    def __init__(self, ctx: ServiceContext, core: SchedulerCore, *, clock=time.monotonic):
        self.ctx = ctx
        self.core = core
        self.lock = asyncio.Lock()
        self._clock = clock
        self._nodes = frozenset(core.node_names())
        self._view_dirty = True
        self._refreshed_at = float("-inf")
        # Keys of pai_schedule that may hold an entry: a job gone before its entry was
        # ever stored (submitted and stopped in one batch) needs no delete. Where a
        # write failed its outcome is unknown, so the key stays here.
        self._stored: set[str] = set()

    async def restore(self) -> None:
        """Rebuild from pai_schedule, checked against the launcher's job documents
        (core/truth.py): stale placements free their cells, attempts the launcher
        runs keep theirs. Both are read in pages; pai_schedule holds live jobs only,
        and of pai_job_status, which also holds finished jobs, only the records of
        live jobs and of those in pai_schedule are decoded whole."""
        stored = await load_all(await self.ctx.bus.kv(Bucket.SCHEDULE), ScheduleEntry)
        launcher = await live_launcher_records(await self.ctx.bus.kv(Bucket.JOB_STATUS), also=stored.keys())
        self._stored.update(stored)
        placed, queued, vcs = [], [], {}
        for entry in stored.values():
            if entry.spec is None:
                continue
            vcs[(entry.job, entry.attempt)] = entry.vc
            if entry.placed:
                placed.append(Restore(job=entry.job, attempt=entry.attempt, spec=entry.spec, tasks=entry.tasks,
                                      borrowed=entry.borrowed, released=list(entry.releasedTasks)))
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
        # A placement recorded just before a crash may never have reached the launcher.
        restores = {(r.job, r.attempt): r for r in checked.restores}
        again = []
        for note in checked.notes:
            restore = restores.get((note.job, note.attempt))
            if note.outcome is Outcome.KEPT and restore is not None:
                vc = vcs.get((note.job, note.attempt), restore.spec.virtualCluster)
                again.append(placed_event(note.job, note.attempt, vc, restore.tasks, cause="restore"))
        await self._carry_out(decisions, jobs=checked.changed_jobs(), cause="restore", also=again)

    async def handle(self, event: Event) -> None:
        """One event (a consumer that hands them one at a time)."""
        await self.handle_batch([event])

    async def handle_batch(self, events: Sequence[Event]) -> None:
        """The events of one fetched batch, in stream order: one core call, one write
        per touched entry, every resulting event published together."""
        inputs = []
        causes: dict[str, str] = {}  # job -> the last event of the batch about it
        for event in events:
            match event:
                case JobSubmitted(spec=spec):
                    inputs.append(Submit(job=event.job, attempt=1, spec=spec, at=event.at))
                case JobReleased(attempt=attempt, requeue=requeue, tasks=tasks):
                    inputs.append(Release(job=event.job, attempt=attempt, requeue=requeue,
                                          tasks=[(task.role, task.index) for task in tasks]))
                case StopRequested():
                    inputs.append(Cancel(job=event.job))
                case JobDeleted() | JobArchived():  # archived: the history holds it, its live records go
                    await self._forget_deleted(event)
                    continue
                case NodeStatus(node=node, healthy=healthy, reason=reason):
                    if node in self._nodes:  # a node of another cluster, or one removed: nothing of ours
                        inputs.append(NodeHealth(node=node, healthy=healthy, reason=reason))
                    continue
                case _:
                    continue
            _check_job_id(event)
            causes[event.job] = event.id
        if not inputs:
            return
        metrics.BATCH_EVENTS.observe(len(events))
        async with self.lock:
            decisions = self.core.handle(*inputs)
            self._view_dirty = True
            await self._carry_out(decisions, jobs=causes, cause=events[-1].id, causes=causes)

    async def _forget_deleted(self, event: JobDeleted | JobArchived) -> None:
        """A finished job deleted (or archived): its entry in pai_schedule goes. A job the core still
        holds is left to its Release (which removes the entry), or is a later job of
        the same name. Idempotent."""
        async with self.lock:
            if self.core.knows(event.job):
                return
            key = ids.job_key(event.job)
            await self.ctx.bus.kv_write_many(Bucket.SCHEDULE, {key: None}, gone_after=marker_seconds(self.ctx.config))
            self._stored.discard(key)

    async def tick_forever(self) -> None:
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(TICK_SECONDS)
            async with self.lock:
                try:
                    await self.tick()
                except NATS_TROUBLE as error:
                    self._view_dirty = True
                    self._refreshed_at = float("-inf")  # the refresh may not be stored: again at once
                    log.warning("tick: NATS trouble (%r); trying again at the next tick", error)

    async def tick(self) -> None:
        """Time passed: aged gangs looked at, decisions not sent given again, and now
        and then the waiting reasons and the cluster view brought up to date."""
        decisions = self.core.handle(Tick())
        refreshed: list[Decision] = []
        refresh = self._view_dirty and self._clock() - self._refreshed_at >= refresh_interval(self.core.queued_count())
        if refresh:
            self._view_dirty = False
            self._refreshed_at = self._clock()
            # The core gives a Wait only when the kind of wait changes; the
            # counts in its text move with every placement and release.
            refreshed = self.core.handle(RefreshReasons(older_than=REFRESH_MIN_AGE_SECONDS))
        await self._carry_out(decisions, refreshed=refreshed, jobs=(), cause="tick")
        if refresh:
            await self.publish_view()

    async def publish_view(self) -> None:
        cells = node_cells_view(self.core.config)
        vcs, skus = self.core.vc_status(), sku_types_view(self.core.config)
        metrics.record_capacity(vcs, skus)  # pai_vc_gpus, pai_cluster_gpus
        view = ClusterView(
            virtualClusters=[msgspec.to_builtins(vc) for vc in vcs],
            nodes=[{"name": n, "cells": cells.get(n, [])} for n in self.core.node_names()],
            skuTypes=skus,
            updatedAt=time.time(),
        )
        await (await self.ctx.bus.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))

    async def _carry_out(self, decisions: list[Decision], *, jobs: Iterable[str], cause: str,
                         causes: Mapping[str, str] | None = None, refreshed: Sequence[Decision] = (),
                         also: Sequence[Event] = ()) -> None:
        """Store the entry of every job touched (those of `jobs` and of the decisions), then
        publish every decision's event (and `also`). When anything fails, every decision
        goes back to the core as NotSent and Transient is raised, so the events in hand are
        handed again; `refreshed` are Waits of a reasons refresh (not counted as decisions)."""
        every = [*decisions, *refreshed]
        touched = dict.fromkeys(jobs)
        for decision in every:
            # A victim's entry does not change until its Release; an announcement's reason is stored already.
            if not isinstance(decision, Preempt | Announce):
                touched[decision.job] = None
        writes = self._entries(touched)
        causes = causes or {}
        events = [*also, *(e for d in every if (e := _event(d, cause=causes.get(d.job, cause))) is not None)]
        try:
            if writes:
                # A released job's entry leaves no marker behind for long (jetstream_limits.marker_seconds).
                await self.ctx.bus.kv_write_many(Bucket.SCHEDULE, writes, gone_after=marker_seconds(self.ctx.config))
                self._stored.difference_update(key for key, value in writes.items() if value is None)
            if events:
                await self.ctx.bus.publish_many(events)
        except NATS_TROUBLE as error:
            if every:
                self.core.handle(*(NotSent(decision=d) for d in every))
            named = ", ".join(f"{type(d).__name__} of {d.job}#{d.attempt}" for d in every[:LOGGED_DECISIONS])
            more = f" and {len(every) - LOGGED_DECISIONS} more" if len(every) > LOGGED_DECISIONS else ""
            log.warning("%s: %d entries and %d events not all stored (%r); not sent, the core gives them "
                        "again: %s%s", cause, len(writes), len(events), error, named or "no decision", more)
            raise Transient(f"{len(writes)} entries and {len(events)} events of {cause} not all stored") from error
        for decision in decisions:
            _DECISIONS_BY_TYPE[type(decision)].inc()
        metrics.ENTRIES_WRITTEN.inc(len(writes))

    def _entries(self, jobs: Iterable[str]) -> dict[str, bytes | None]:
        """What to store for each job: its entry, or a delete where it has none and may have had."""
        writes: dict[str, bytes | None] = {}
        for job in jobs:
            key = ids.job_key(job)
            entry = self.core.entry(job)
            if entry is not None:
                writes[key] = msgspec.json.encode(entry)
                self._stored.add(key)  # before the write: a failed one may still have stored it
            elif key in self._stored:
                writes[key] = None
        return writes


_KIND = {Place: "place", Preempt: "preempt", Wait: "wait", Announce: "announce"}
# The counter's child per decision type, looked up once: prometheus-client's `labels()`
# takes a lock and builds a key at every call.
_DECISIONS_BY_TYPE = {kind: metrics.DECISIONS.labels(kind=name) for kind, name in _KIND.items()}


def _check_job_id(event: Event) -> None:
    try:
        ids.split_job_id(event.job)
    except ValueError as error:
        raise BadInput(f"{type(event).__name__} {event.id}: job: {error}") from error


def _event(decision: Decision, *, cause: str) -> Event | None:
    """The event announcing a decision; None for one only stored (a later Wait: its new reason)."""
    match decision:
        case Place(job=job, attempt=attempt, vc=vc, tasks=tasks, partial=partial):
            return placed_event(job, attempt, vc, tasks, cause=cause, partial=partial)
        case Preempt(job=job, attempt=attempt, vc=vc, by=by, reason=reason):
            return PreemptRequested(id=f"{job}/{attempt}/preempt", job=job, cause=cause, at=time.time(), vc=vc,
                                    attempt=attempt, by=by, reason=reason)
        case Wait(job=job, attempt=attempt, vc=vc, reason=reason, first=True) | Announce(
            job=job, attempt=attempt, vc=vc, reason=reason
        ):
            return JobWaiting(id=f"{job}/{attempt}/waiting", job=job, cause=cause, at=time.time(), vc=vc,
                              attempt=attempt, reason=reason)
    return None


def placed_event(job: str, attempt: int, vc: str, tasks, *, cause: str, partial: bool = False) -> JobPlaced:
    suffix = "" if not partial else "/" + ",".join(f"{t.role}.{t.index}" for t in tasks)
    return JobPlaced(id=f"{job}/{attempt}/placed{suffix}", job=job, cause=cause, at=time.time(), vc=vc, attempt=attempt,
                     tasks=list(tasks), partial=partial)


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
    await ctx.bus.consume_batches(
        Durable.SCHEDULER, CONSUMED_KINDS, CONSUMED, shell.handle_batch, stopping=ctx.stopping, ordered=True
    )


def main() -> None:
    service.run("scheduler", load_config(), body, single_active=True)
