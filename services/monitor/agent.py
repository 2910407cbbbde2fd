"""The node agent and the cluster's view of nodes: the monitor's two node roles.

Node agent (one per node; `monitor_mode: agent`, a DaemonSet on Kubernetes):
every `node_sample_seconds` sample this machine (CPU, memory, disk, GPUs
through NVML, PAI tasks and the processes on each GPU), set this process's
gauges, and store the sample in `pai_nodes` under the node's name. The stored
sample is the node's heartbeat.

Cluster node health (`monitor_mode: cluster`): watch `pai_nodes`, feed every
sample heard and a tick per second to `core.nodes.NodeHealthCore`, carry out
what it decides: save the node's record in `pai_node_health`, publish
`NodeStatus` (the scheduler avoids unhealthy nodes, the launcher ends the
tasks of lost ones), set `pai_node_up` and `pai_node_count`. Admins' cordons
arrive as `NodeCordonChanged` events through the monitor's consumer (`cordon`).

`monitor_mode: both` (what `pai up` runs) does both in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from libs.common.bus import load_all, watch_key
from libs.common.errors import Transient
from libs.common.ids import EventId, JobId, NodeName
from libs.common.messages import NodeCordonChanged, NodeStatus
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.monitor import metrics
from services.monitor.core.nodes import (
    Cordon,
    HealthOutput,
    HealthSettings,
    Heard,
    NodeHealthCore,
    NodeHealthRecord,
    SaveHealth,
    StatusChanged,
    Tick,
    encode_health,
)
from services.monitor.core.samples import decode_node_sample, encode_node_sample, node_key
from services.monitor.sampler import NodeSampler
from services.monitor.usage import UsageRecorder

log = logging.getLogger("pai.monitor.nodes")

# Sampling faster than this only measures the sampler itself.
MIN_SAMPLE_SECONDS = 0.1
TICK_SECONDS = 1.0

AGENT = "agent"
CLUSTER = "cluster"
BOTH = "both"
MODES = (AGENT, CLUSTER, BOTH)


def runs_agent(mode: str) -> bool:
    return mode in (AGENT, BOTH)


def runs_cluster(mode: str) -> bool:
    return mode in (CLUSTER, BOTH)


# --- the node agent ------------------------------------------------------------------


async def sample_forever(ctx: ServiceContext, sampler: NodeSampler) -> None:
    kv = await ctx.bus.kv(Bucket.NODES)
    period = max(MIN_SAMPLE_SECONDS, ctx.config.node_sample_seconds)
    usage = UsageRecorder(step=period, cap=ctx.config.job_metrics_points)
    usage_kv = await ctx.bus.kv(Bucket.JOB_METRICS)
    while not ctx.stopping.is_set():
        sample = await asyncio.to_thread(sampler.sample)
        metrics.label_node(sample.node)
        metrics.record_node_sample(sample)
        try:
            await kv.put(node_key(sample.node), encode_node_sample(sample))
        except nats.errors.Error as exc:  # NATS away for a moment; the next sample tries again
            log.warning("could not store the sample of %s: %r", sample.node, exc)
        await usage.record(usage_kv, sample)  # each task's utilisation over time
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), timeout=period)


# --- cluster node health -------------------------------------------------------------


def health_settings(ctx: ServiceContext) -> HealthSettings:
    config = ctx.config
    return HealthSettings(
        lost_after_seconds=config.node_lost_seconds,
        disk_full_percent=config.node_disk_full_percent,
        memory_full_percent=config.node_memory_full_percent,
    )


class NodeHealthShell:
    """Carries out the node health core's decisions; one lock for its three inputs
    (samples heard, ticks, cordons), so the core sees one event at a time."""

    def __init__(self, ctx: ServiceContext, *, clock: Callable[[], float] = time.time):
        self.ctx = ctx
        self.core = NodeHealthCore(health_settings(ctx))
        self.clock = clock
        self.lock = asyncio.Lock()
        # Statuses whose publish failed, by node: sent again at the next tick (the
        # core already moved on, so nothing else would send them).
        self._unsent: dict[str, StatusChanged] = {}

    async def restore(self) -> None:
        kv = await self.ctx.bus.kv(Bucket.NODE_HEALTH)
        records = list((await load_all(kv, NodeHealthRecord, skip_undecodable=True)).values())
        metrics.apply(self.core.restore(records, self.clock()))
        log.info("restored the health of %d node(s)", len(records))

    async def run(self) -> None:
        """Watch samples and tick until stopping."""
        self.ctx.spawn(self._tick_forever(), "node-health-tick")
        samples: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()  # (key, value)
        # The stored values come first: they are as old as they are, and the
        # restored records say what was decided from them (after a reconnect too:
        # the tick's clock starts again then, and each node's next sample counts).
        stored = [0]

        def began(connection: int, stored_entries: int) -> None:
            stored[0] = stored_entries

        def heard(entry: KeyValue.Entry) -> None:
            if stored[0] > 0:
                stored[0] -= 1
            elif entry.value and entry.operation is None:
                samples.put_nowait((entry.key, entry.value))

        self.ctx.spawn(watch_key(self.ctx.bus, Bucket.NODES, self.ctx.stopping, heard, on_start=began),
                       "node-samples-watch")
        while not self.ctx.stopping.is_set():
            try:
                key, value = await asyncio.wait_for(samples.get(), timeout=TICK_SECONDS)
            except TimeoutError:
                continue
            try:
                sample = decode_node_sample(value)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                log.warning("ignoring a sample under %s that does not decode: %s", key, exc)
                continue
            await self._decide(Heard(sample=sample, at=self.clock()))

    async def cordon(self, event: NodeCordonChanged) -> None:
        """An admin's cordon, from the monitor's consumer. Raises Transient when the
        status could not be published, so the event is redelivered; the status id
        comes from the event's time, so a redelivery publishes the same event."""
        async with self.lock:
            outputs = self.core.handle(
                Cordon(node=event.node, cordoned=event.cordoned, reason=event.reason, by=event.by, at=event.at, cause=event.id)
            )
            await self._carry_out(outputs, raise_unsent=True)

    async def _tick_forever(self) -> None:
        # nats-py counts the client's reconnects; silence judged by a monitor that
        # could not listen says nothing, so the clock starts again after each.
        bus = self.ctx.bus
        listening_since, reconnects = self.clock(), bus.nc.stats["reconnects"]
        while not self.ctx.stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ctx.stopping.wait(), timeout=TICK_SECONDS)
            if not bus.nc.is_connected:
                continue  # deaf now: silence says nothing about the nodes
            if bus.nc.stats["reconnects"] != reconnects:
                listening_since, reconnects = self.clock(), bus.nc.stats["reconnects"]
            await self._decide(Tick(now=self.clock(), listeningSince=listening_since))

    async def _decide(self, event: Heard | Tick) -> None:
        async with self.lock:
            outputs = self.core.handle(event)
            await self._carry_out(outputs, raise_unsent=False)
            for node, status in list(self._unsent.items()):
                if await self._publish(status):
                    self._unsent.pop(node, None)

    async def _carry_out(self, outputs: list[HealthOutput], *, raise_unsent: bool) -> None:
        # Publish first, then save: a crash in between publishes again (same id)
        # rather than saving a change no one was told of.
        for output in outputs:
            if isinstance(output, StatusChanged):
                self._unsent.pop(output.node, None)
                if not await self._publish(output):
                    if raise_unsent:
                        raise Transient(f"the status of node {output.node} could not be published")
                    self._unsent[output.node] = output
        kv = await self.ctx.bus.kv(Bucket.NODE_HEALTH)
        for output in outputs:
            if isinstance(output, SaveHealth):
                try:
                    await kv.put(node_key(output.record.node), encode_health(output.record))
                except nats.errors.Error as exc:
                    log.warning("could not save the health of %s: %r", output.record.node, exc)
        metrics.apply(o for o in outputs if not isinstance(o, (StatusChanged, SaveHealth)))

    async def _publish(self, status: StatusChanged) -> bool:
        event = NodeStatus(
            id=EventId(status.status_id),
            job=JobId(""),
            cause=EventId(status.cause),
            at=status.at,
            node=NodeName(status.node),
            healthy=status.healthy,
            reason=status.reason,
            conditions=list(status.conditions),
        )
        try:
            await self.ctx.bus.publish(event)
        except (Transient, nats.errors.Error) as exc:
            log.warning("could not publish the status of node %s: %r", status.node, exc)
            return False
        level = logging.INFO if status.healthy else logging.WARNING
        log.log(level, "node %s is %s%s", status.node, "healthy" if status.healthy else "unhealthy",
                f": {status.reason}" if status.reason else "")
        return True
