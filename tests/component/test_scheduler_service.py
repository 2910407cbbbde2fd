"""The scheduler's shell against a real nats-server: a decision whose publish
fails goes back into the core and is carried out later, without a restart."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import msgspec
import nats.js.api
import nats.js.errors
import pytest

from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.messages import JobPlaced, JobReleased, JobSubmitted, subject_of
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.schedule import ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket, Durable
from services.scheduler.cluster import local_cluster_config
from services.scheduler.core import SchedulerCore
from services.scheduler.service import CONSUMED, CONSUMED_KINDS, SchedulerShell
from tests.conftest import platform_bus

RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 30.0


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """This module's own server (see tests/conftest.py, own_nats_server)."""
    return own_nats_server


@pytest.fixture
async def admin(nats_server):
    async with platform_bus(nats_server, durables=[Durable.SCHEDULER]) as bus:
        yield bus


def submitted(job: str) -> JobSubmitted:
    user, name = job.split("~")
    spec = JobSpec(
        name=name,
        user=user,
        virtualCluster="default",
        taskRoles=[TaskRole(name="worker", instances=2, resources=Resources(gpu=0, cpu=1, memoryMB=1024))],
    )
    return JobSubmitted(id=f"{job}/submitted", job=job, at=time.time(), spec=spec)


async def until(check, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"waited {WAIT_SECONDS:g}s for {what}")


async def start_scheduler(nats_server, config: Config, *, ticking: bool = False):
    """The scheduler's shell as its service runs it (restored, consuming; ticking if asked),
    on a one-node cluster: (bus, ctx, core, the consuming task)."""
    bus = await Bus.connect(nats_server.url, name="scheduler", **nats_server.login("scheduler"))
    ctx = ServiceContext(name="scheduler", config=config, bus=bus)
    core = SchedulerCore(local_cluster_config(node="node-a", gpus=0, cpus=4, memory_mb=8192), clock=time.time)
    shell = SchedulerShell(ctx, core)
    await shell.restore()
    if ticking:
        ctx.spawn(shell.tick_forever(), "tick")
    consuming = asyncio.create_task(bus.consume_batches(Durable.SCHEDULER, CONSUMED_KINDS, CONSUMED,
                                                        shell.handle_batch, stopping=ctx.stopping, ordered=True))
    return bus, ctx, core, consuming


async def stop_scheduler(bus: Bus, ctx: ServiceContext, consuming: asyncio.Task) -> None:
    ctx.stopping.set()
    for task in [consuming, *ctx.tasks]:
        task.cancel()
    await asyncio.gather(consuming, *ctx.tasks, return_exceptions=True)
    await bus.close()


async def test_a_placement_whose_publish_the_stream_refused_reaches_the_launcher_without_a_restart(
    admin, nats_server, caplog
):
    """kueue's assume: the core keeps the cells bound, takes the refusal back as NotSent and
    gives the Place again with the redelivered event or the next Tick."""
    caplog.set_level(logging.WARNING, logger="pai.scheduler")
    job = f"alice~refused{RUN}"
    await admin.publish(submitted(job))
    # The stream takes no more messages: the scheduler's JobPlaced will be refused.
    before = await admin.js.stream_info(STREAM)
    full = nats.js.api.StreamConfig.from_response(before.config.as_dict())
    full.max_msgs = before.state.messages
    full.discard = nats.js.api.DiscardPolicy.NEW
    await admin.js.update_stream(full)
    placed_subject = subject_of(JobPlaced(id="", job=job, vc="default", attempt=1, tasks=[]))

    async def last_placed() -> JobPlaced | None:
        try:
            msg = await admin.js.get_last_msg(STREAM, placed_subject)
        except nats.js.errors.NotFoundError:
            return None
        return msgspec.json.decode(msg.data, type=JobPlaced)

    try:
        bus, ctx, core, consuming = await start_scheduler(nats_server, Config(), ticking=True)

        async def refused() -> bool:
            return any("Place of " + job in r.getMessage() and "not sent" in r.getMessage() for r in caplog.records)

        await until(refused, "the scheduler to see its JobPlaced refused")
        assert await last_placed() is None
        # The cells stay assumed for the job meanwhile: the core recorded its decision.
        entry = core.entry(job)
        assert entry is not None and entry.placed and len(entry.tasks) == 2
    finally:
        await admin.js.update_stream(before.config)  # room again

    try:
        placed = await until(last_placed, "the JobPlaced to appear in the stream")
        assert (placed.attempt, sorted(t.index for t in placed.tasks), placed.partial) == (1, [0, 1], False)
        # No restart: the same shell, still consuming, did it.
        assert not consuming.done() and not ctx.stopping.is_set()
        stored = await (await bus.kv(Bucket.SCHEDULE)).get(job.replace("~", "."))
        assert msgspec.json.decode(stored.value, type=ScheduleEntry).placed
        core.validate_state()
    finally:
        await stop_scheduler(bus, ctx, consuming)


async def test_a_released_job_leaves_nothing_in_the_schedule_bucket_once_its_marker_expires(admin, nats_server):
    """Its entry is purged with a marker that expires (jetstream_limits.marker_seconds, here
    the event stream's duplicate window of 1 s): no key of a finished job stays in the
    bucket's stream, nor in nats-server's memory, however many jobs ran."""
    job = f"alice~released{RUN}"
    subject = f"$KV.{Bucket.SCHEDULE.value}.{job.replace('~', '.')}"
    stream = f"KV_{Bucket.SCHEDULE.value}"

    async def last() -> nats.js.api.RawStreamMsg | None:
        try:
            return await admin.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None

    bus, ctx, core, consuming = await start_scheduler(nats_server, Config(nats_events_duplicate_window_seconds=1.0))
    try:
        await admin.publish(submitted(job))

        async def placed() -> bool:
            msg = await last()
            return msg is not None and bool(msg.data) and msgspec.json.decode(msg.data, type=ScheduleEntry).placed

        await until(placed, "the job's entry, placed")
        await admin.publish(JobReleased(id=f"{job}/released/1", job=job, vc="default", attempt=1, at=time.time()))
        marker = await until(lambda: _purged(last), "the entry purged")
        assert marker.headers and marker.headers.get("Nats-TTL") == "1"
        await until(lambda: _gone(last), "the purge marker to expire")
        core.validate_state()
    finally:
        await stop_scheduler(bus, ctx, consuming)


async def _purged(last):
    msg = await last()
    return msg if msg is not None and msg.headers and msg.headers.get("KV-Operation") == "PURGE" else None


async def _gone(last) -> bool:
    return await last() is None
