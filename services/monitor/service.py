"""The monitor service: every event into Prometheus metrics, this node into `pai_nodes`.

`monitor_mode` (services/monitor/agent.py): `agent` only samples this node,
`cluster` decides node health and handles events, `both` does both.

Start-up order (docs/architecture.md, "State and recovery"): load the launcher's job
records so `pai_jobs` is right before the first event arrives, then sample the
node every `node_sample_seconds` and consume every event kind with the durable
consumer "monitor".

The monitor decides nothing other services wait for, so a failed sample store
is only logged: the next sample stores a newer value anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time

from libs.common.bus import Bus, load_all
from libs.common.errors import BadInput
from libs.common.messages import EVENT_TYPES, AlertFiring, AnyEvent, NodeCordonChanged
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.monitor import agent, metrics, store_fill
from services.monitor.agent import runs_agent, runs_cluster
from services.monitor.alerts.mailer import Mailer
from services.monitor.alerts.shell import AlertShell
from services.monitor.core.stored import StoredJob
from services.monitor.core.tally import MonitorCore, PartlyHandled
from services.monitor.core.updates import RaiseAlert
from services.monitor.sampler import NodeSampler, TaskProcesses, default_node_name

log = logging.getLogger("pai.monitor")

# The monitor takes every event of every job, and no job waits on it: under load
# it lets events gather this long between batches, so a batch's fixed costs (a
# pull, gauges and alert rules once per batch) are shared by many events.
GATHER_SECONDS = 0.05


async def body(ctx: ServiceContext, *, sampler: NodeSampler | None = None) -> None:
    mode = ctx.config.monitor_mode
    if mode not in agent.MODES:
        raise BadInput(f"monitor_mode: {mode!r} is not one of {', '.join(agent.MODES)}")
    if runs_agent(mode):
        sampler = sampler or NodeSampler(default_node_name(), ctx.config.data_path,
                                         tasks=TaskProcesses(read_environ=ctx.config.monitor_read_task_environ))
        await asyncio.to_thread(sampler.open)
    try:
        if runs_cluster(mode):
            await cluster_body(ctx, sampler if runs_agent(mode) else None)
        else:
            ctx.set_ready()
            assert sampler is not None  # the agent's mode: opened above
            ctx.spawn(agent.sample_forever(ctx, sampler), "node-sampler")
            await ctx.stopping.wait()
    finally:
        if sampler is not None and runs_agent(mode):
            sampler.close()


async def cluster_body(ctx: ServiceContext, sampler: NodeSampler | None) -> None:
    """Metrics of every event, node health, alerts; also this node's agent when `sampler`."""
    intake = await start_cluster(ctx)
    ctx.set_ready()
    ctx.spawn(store_fill.follow(ctx), "store-fill")  # JetStream's fill as metrics
    ctx.spawn(intake.nodes.run(), "node-health")
    if sampler is not None:
        ctx.spawn(agent.sample_forever(ctx, sampler), "node-sampler")
    await ctx.bus.consume_batches(
        Durable.MONITOR, list(Kind), list(EVENT_TYPES.values()), intake.handle, stopping=ctx.stopping,
        gather_seconds=GATHER_SECONDS,
    )


async def start_cluster(ctx: ServiceContext, *, mailer: Mailer | None = None) -> EventIntake:
    """Restore the cluster monitor's state from its buckets and start its alerts;
    what is left is to consume events with the returned intake."""
    # Finished jobs held as long as their live records are (rest's expiry archives them).
    core = MonitorCore(keep_finished=ctx.config.live_finished_job_max,
                       keep_finished_seconds=ctx.config.live_finished_job_seconds)
    stored = await load_stored_jobs(ctx.bus)
    metrics.apply(core.restore(stored))
    log.info("restored %d job(s) from %s", len(stored), Bucket.JOB_STATUS.value)
    nodes = agent.NodeHealthShell(ctx)
    await nodes.restore()
    alerts = AlertShell(ctx, mailer=mailer)  # alert rules, actions and mail (services/monitor/alerts)
    await alerts.start()
    return EventIntake(ctx.bus, core, nodes, alerts)


class EventIntake:
    """Every event on the bus, a batch at a time: node cordons, the alert rules'
    view of jobs (and owners' status mail), metrics, and the alerts the monitor
    raises itself.

    Order: nothing here needs stream order (the cores let no older event move a
    job back, and count each event id once), so the consumer is parallel.
    Every effect of a batch is stored before `handle` returns, and the bus acks
    the batch only then; each is idempotent, so a batch handed again (or, after
    a failure, its events one by one) repeats nothing: counters count each id
    once, mail is claimed in `pai_alerts` before it is queued, and the alerts
    are published with their deterministic ids.
    """

    def __init__(self, bus: Bus, core: MonitorCore, nodes: agent.NodeHealthShell, alerts: AlertShell):
        self.bus = bus
        self.core = core
        self.nodes = nodes
        self.alerts = alerts

    async def handle(self, events: list[AnyEvent]) -> None:
        for event in events:
            if isinstance(event, NodeCordonChanged):
                await self.nodes.cordon(event)
        await self.alerts.handle(*events)
        try:
            updates = self.core.handle(*events)
        except PartlyHandled as partly:
            metrics.apply(u for u in partly.updates if not isinstance(u, RaiseAlert))
            raise
        metrics.apply(u for u in updates if not isinstance(u, RaiseAlert))
        raised = [u for u in updates if isinstance(u, RaiseAlert)]
        if raised:
            await self.bus.publish_many([alert_firing(alert) for alert in raised])
            await self.alerts.raised(*raised)  # listed and mailed to the admins


def alert_firing(alert: RaiseAlert) -> AlertFiring:
    return AlertFiring(
        id=alert.id, job=alert.job, cause=alert.cause, at=time.time(),
        rule=alert.rule, severity=alert.severity, summary=alert.summary, labels=alert.labels,
    )


async def load_stored_jobs(bus: Bus) -> list[StoredJob]:
    """The state of every job the launcher recorded; a record that does not decode
    is skipped with a warning (it belongs to the launcher, not to us)."""
    kv = await bus.kv(Bucket.JOB_STATUS)
    return list((await load_all(kv, StoredJob, skip_undecodable=True)).values())
