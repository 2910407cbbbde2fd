"""The monitor service: every event into Prometheus metrics, this node into `pai_nodes`.

Start-up order (DESIGN.md, "State and recovery"): load the launcher's job
records so `pai_jobs` is right before the first event arrives, then sample the
node every `node_sample_seconds` and consume every event kind with the durable
consumer "monitor".

The monitor decides nothing other services wait for, so a failed sample store
is only logged: the next sample stores a newer value anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
import nats.errors
import nats.js.errors

from libs.common.bus import Bus, all_keys
from libs.common.messages import EVENT_TYPES, AlertFiring, AnyEvent
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.monitor import metrics
from services.monitor.core.samples import encode_node_sample, node_key
from services.monitor.core.stored import StoredJob, decode_stored_job
from services.monitor.core.tally import MonitorCore
from services.monitor.core.updates import RaiseAlert
from services.monitor.sampler import NodeSampler, default_node_name

log = logging.getLogger("pai.monitor")

# Sampling faster than this only measures the sampler itself.
MIN_SAMPLE_SECONDS = 0.1


async def body(ctx: ServiceContext, *, sampler: NodeSampler | None = None) -> None:
    core = MonitorCore()
    stored = await load_stored_jobs(ctx.bus)
    metrics.apply(core.restore(stored))
    log.info("restored %d job(s) from %s", len(stored), Bucket.JOB_STATUS.value)

    sampler = sampler or NodeSampler(default_node_name(), ctx.config.data_path)
    await asyncio.to_thread(sampler.open)
    try:
        ctx.set_ready()
        ctx.spawn(sample_forever(ctx, sampler, core), "node-sampler")

        async def handle(event: AnyEvent) -> None:
            updates = core.handle(event)
            metrics.apply(u for u in updates if not isinstance(u, RaiseAlert))
            for alert in updates:
                if isinstance(alert, RaiseAlert):
                    await ctx.bus.publish(alert_firing(alert))

        await ctx.bus.consume(
            Durable.MONITOR, list(Kind), list(EVENT_TYPES.values()), handle, stopping=ctx.stopping
        )
    finally:
        sampler.close()


def alert_firing(alert: RaiseAlert) -> AlertFiring:
    return AlertFiring(
        id=alert.id, job=alert.job, cause=alert.cause, at=time.time(),
        rule=alert.rule, severity=alert.severity, summary=alert.summary, labels=alert.labels,
    )


async def load_stored_jobs(bus: Bus) -> list[StoredJob]:
    """The state of every job the launcher recorded; a record that does not decode
    is skipped with a warning (it belongs to the launcher, not to us)."""
    kv = await bus.kv(Bucket.JOB_STATUS)
    jobs: list[StoredJob] = []
    for key in await all_keys(kv):
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            continue
        if not entry.value:
            continue
        try:
            jobs.append(decode_stored_job(entry.value))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("skipping job record %s: %s", key, exc)
    return jobs


async def sample_forever(ctx: ServiceContext, sampler: NodeSampler, core: MonitorCore) -> None:
    kv = await ctx.bus.kv(Bucket.NODES)
    period = max(MIN_SAMPLE_SECONDS, ctx.config.node_sample_seconds)
    while not ctx.stopping.is_set():
        sample = await asyncio.to_thread(sampler.sample)
        metrics.record_node_sample(sample)
        metrics.apply(core.node_sampled(sample.node, sample.at))
        try:
            await kv.put(node_key(sample.node), encode_node_sample(sample))
        except nats.errors.Error as exc:  # NATS away for a moment; the next sample tries again
            log.warning("could not store the sample of %s: %r", sample.node, exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), timeout=period)
