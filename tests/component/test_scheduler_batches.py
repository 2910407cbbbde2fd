"""The scheduler's shell handling events in batches, against a real nats-server.

A crash between a batch's effects (entries stored, events published) and its
acks, and a batch whose publish fails half way, both hand the same events
again: each job is still placed once, on the same cells, with one JobPlaced
(and one JobWaiting for those that wait) in the stream, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import msgspec
import pytest

from libs.common import ids
from libs.common.bus import Bus, load_all
from libs.common.config import Config
from libs.common.messages import JobReleased, JobSubmitted, JobWaiting
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.schedule import ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket, Durable
from services.scheduler import service
from services.scheduler.cluster import local_cluster_config
from services.scheduler.core import SchedulerCore, SchedulingPolicy
from services.scheduler.service import CONSUMED, CONSUMED_KINDS, SchedulerShell
from tests.conftest import platform_bus, publish_half_then_fail_once

WAIT_SECONDS = 60.0  # generous: the machine running the tests may be loaded
CPUS = 4  # one-CPU cells: four one-task jobs run, the rest wait
JOBS = 6


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """The shell restores from whole buckets: a server of this module's own."""
    return own_nats_server


@pytest.fixture
async def admin(nats_server):
    async with platform_bus(nats_server, purge=(STREAM, f"KV_{Bucket.SCHEDULE.value}"), durables=[Durable.SCHEDULER]) as bus:
        yield bus


def submitted(job: str, *, cpus: int = 1) -> JobSubmitted:
    user, name = job.split("~")
    spec = JobSpec(
        name=name,
        user=user,
        virtualCluster="default",
        taskRoles=[TaskRole(name="worker", instances=1, resources=Resources(gpu=0, cpu=cpus, memoryMB=512 * cpus))],
    )
    return JobSubmitted(id=f"{job}/submitted", job=job, at=time.time(), spec=spec)


async def until(check, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if found := await check():
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"waited {WAIT_SECONDS:g}s for {what}")


class Scheduler:
    """One scheduler shell as the service runs it: restored from the buckets, then consuming."""

    def __init__(self, bus: Bus, announce_wait_after_s: float = 0.0):
        """`announce_wait_after_s`: 0 announces a wait in the batch that queues the job."""
        self.bus = bus
        self.ctx = ServiceContext(name="scheduler", config=Config(), bus=bus)
        self.core = SchedulerCore(local_cluster_config(node="node-a", gpus=0, cpus=CPUS, memory_mb=8192),
                                  clock=time.time,
                                  policy=SchedulingPolicy(announce_wait_after_s=announce_wait_after_s))
        self.shell = SchedulerShell(self.ctx, self.core)
        self.batches: list[list[str]] = []
        self.consuming: asyncio.Task | None = None

    @classmethod
    async def start(cls, nats_server, handler=None, announce_wait_after_s: float = 0.0) -> Scheduler:
        bus = await Bus.connect(nats_server.url, name="scheduler", **nats_server.login("scheduler"))
        scheduler = cls(bus, announce_wait_after_s)
        await scheduler.shell.restore()

        async def record(events) -> None:
            scheduler.batches.append([event.id for event in events])
            await scheduler.shell.handle_batch(events)

        scheduler.consuming = asyncio.create_task(scheduler.bus.consume_batches(
            Durable.SCHEDULER, CONSUMED_KINDS, CONSUMED, handler or record, stopping=scheduler.ctx.stopping,
            ordered=True))
        return scheduler

    def placements(self, jobs: list[str]) -> dict[str, list]:
        """job -> its placed tasks (role, index, node, leaf cells), for the placed ones."""
        found = {}
        for job in jobs:
            entry = self.core.entry(job)
            if entry is not None and entry.placed:
                found[job] = sorted((t.role, t.index, t.node, tuple(t.leafCells)) for t in entry.tasks)
        return found

    async def stop(self) -> None:
        self.ctx.stopping.set()
        if self.consuming is not None:
            self.consuming.cancel()
            await asyncio.gather(self.consuming, return_exceptions=True)
        await self.bus.close()


async def stored_events(admin: Bus) -> list[dict]:
    """Every event in the stream, in order, as plain JSON."""
    info = await admin.js.stream_info(STREAM)
    if info.state.messages == 0:
        return []
    return [msgspec.json.decode((await admin.js.get_msg(STREAM, seq)).data)
            for seq in range(info.state.first_seq, info.state.last_seq + 1)]


async def unacked(admin: Bus) -> int:
    return (await admin.js.consumer_info(STREAM, Durable.SCHEDULER.value)).num_ack_pending


def announced(events: list[dict], kind: str) -> Counter:
    """How often each job's event of this kind is in the stream."""
    return Counter(event["job"] for event in events if event["kind"] == kind)


async def schedule_entries(admin: Bus) -> dict[str, ScheduleEntry]:
    return await load_all(await admin.kv(Bucket.SCHEDULE), ScheduleEntry)


def expect_one_decision_each(events: list[dict], jobs: list[str], placed: dict[str, list]) -> None:
    placed_count, waiting_count = announced(events, "job.placed"), announced(events, "job.waiting")
    waiting = [job for job in jobs if job not in placed]
    assert len(placed) == CPUS and len(waiting) == JOBS - CPUS
    assert placed_count == Counter({job: 1 for job in placed}), "each placed job announced exactly once"
    assert waiting_count == Counter({job: 1 for job in waiting}), "each waiting job announced exactly once"
    for event in events:
        if event["kind"] == "job.placed":
            cells = sorted((t["role"], t["index"], t["node"], tuple(t["leafCells"])) for t in event["tasks"])
            assert cells == placed[event["job"]], f"{event['job']} announced on other cells than it holds"


async def test_a_crash_after_a_batchs_effects_before_its_acks_places_each_job_once(admin, nats_server):
    run = uuid.uuid4().hex[:6]
    jobs = [f"alice~crash{run}n{n}" for n in range(JOBS)]
    await admin.publish_many([submitted(job) for job in jobs])
    effects_done = asyncio.Event()
    first: Scheduler | None = None

    async def handle_then_die(events) -> None:
        first.batches.append([event.id for event in events])
        await first.shell.handle_batch(events)
        effects_done.set()
        await asyncio.sleep(3600)  # killed here: entries stored, events published, nothing acked

    first = await Scheduler.start(nats_server, handle_then_die)
    try:
        await asyncio.wait_for(effects_done.wait(), WAIT_SECONDS)
        assert first.batches == [[f"{job}/submitted" for job in jobs]], "every waiting submission in one batch"
        before = first.placements(jobs)
        first.core.validate_state()
    finally:
        await first.stop()
    assert await unacked(admin) == JOBS
    expect_one_decision_each(await stored_events(admin), jobs, before)
    entries = await schedule_entries(admin)
    assert {ids.job_key(job) for job in jobs} <= set(entries)

    second = await Scheduler.start(nats_server)
    try:
        # Restored from pai_schedule: the placed jobs back on their cells before any event.
        assert second.placements(jobs) == before
        await until(lambda: _all_handled(admin, second, JOBS), "the crashed batch to be handled again and acked")
        assert sorted(sum(second.batches, [])) == sorted(f"{job}/submitted" for job in jobs)
        assert second.placements(jobs) == before
        second.core.validate_state()
        expect_one_decision_each(await stored_events(admin), jobs, before)

        # Nothing held twice: the cells of one finished job go to exactly one of the waiting ones.
        done = next(iter(before))
        await admin.publish(JobReleased(id=f"{done}/1/released", job=done, vc="default", attempt=1))
        now_placed = await until(lambda: _placed_when(second, jobs, lambda p: len(p) == CPUS and done not in p),
                                 "a waiting job to get the freed cell")
        assert {job: cells for job, cells in now_placed.items() if job in before} == {
            job: cells for job, cells in before.items() if job != done}
        assert (await schedule_entries(admin)).get(ids.job_key(done)) is None
        second.core.validate_state()
    finally:
        await second.stop()


async def test_a_batch_whose_publish_fails_is_handled_again_one_by_one_placing_each_job_once(admin, nats_server):
    """The first publish of the batch stores half its events, then fails: the core takes its
    decisions back (NotSent), the bus hands the events again one at a time, and the core gives
    each decision again as it stands, with the same id."""
    run = uuid.uuid4().hex[:6]
    jobs = [f"alice~flaky{run}n{n}" for n in range(JOBS)]
    await admin.publish_many([submitted(job) for job in jobs])
    scheduler = Scheduler(await Bus.connect(nats_server.url, name="scheduler", **nats_server.login("scheduler")))
    failed = publish_half_then_fail_once(scheduler.bus)
    await scheduler.shell.restore()

    async def record(events) -> None:
        scheduler.batches.append([event.id for event in events])
        await scheduler.shell.handle_batch(events)

    scheduler.consuming = asyncio.create_task(scheduler.bus.consume_batches(
        Durable.SCHEDULER, CONSUMED_KINDS, CONSUMED, record, stopping=scheduler.ctx.stopping, ordered=True))
    try:
        await until(lambda: _all_handled(admin, scheduler, JOBS + JOBS), "the batch, then each of its events again")
        assert failed == [JOBS]  # one event per decision of the whole batch
        assert [len(batch) for batch in scheduler.batches] == [JOBS] + [1] * JOBS
        placed = scheduler.placements(jobs)
        scheduler.core.validate_state()
        expect_one_decision_each(await stored_events(admin), jobs, placed)
        entries = await schedule_entries(admin)
        for job in jobs:
            entry = entries[ids.job_key(job)]
            assert entry.placed == (job in placed)
            assert sorted((t.role, t.index, t.node, tuple(t.leafCells)) for t in entry.tasks) == placed.get(job, [])
    finally:
        await scheduler.stop()


async def test_a_wait_is_announced_once_it_has_lasted_and_once_only_across_a_restart(admin, nats_server):
    """With announcements after a wait has lasted: nothing announced while the jobs are queued;
    once they have waited, the tick announces each job still waiting, once. A scheduler restarted
    after that restores the jobs as waiting, announces them again when they have waited once more,
    and the stream deduplicates it (the same event id): still one each."""
    after = 0.5
    run = uuid.uuid4().hex[:6]
    jobs = [f"alice~later{run}n{n}" for n in range(JOBS)]
    await admin.publish_many([submitted(job) for job in jobs])
    first = await Scheduler.start(nats_server, announce_wait_after_s=after)
    try:
        await until(lambda: _all_handled(admin, first, JOBS), "the submissions to be handled")
        placed = first.placements(jobs)
        assert len(placed) == CPUS
        assert not announced(await stored_events(admin), "job.waiting"), "nothing announced when queued"
        await asyncio.sleep(after)
        await first.shell.tick()
        expect_one_decision_each(await stored_events(admin), jobs, placed)
    finally:
        await first.stop()

    second = await Scheduler.start(nats_server, announce_wait_after_s=after)
    published = []
    publish_many = second.bus.publish_many

    async def recording(events, *args, **kwargs):
        published.extend(events)
        return await publish_many(events, *args, **kwargs)

    second.bus.publish_many = recording
    try:
        assert second.placements(jobs) == placed
        await asyncio.sleep(after)
        await second.shell.tick()
        again = sorted(event.job for event in published if isinstance(event, JobWaiting))
        assert again == sorted(set(jobs) - set(placed)), "announced again after the restart"
        expect_one_decision_each(await stored_events(admin), jobs, placed)
    finally:
        await second.stop()


async def _all_handled(admin: Bus, scheduler: Scheduler, events: int) -> bool:
    return sum(map(len, scheduler.batches)) >= events and await unacked(admin) == 0


async def _placed_when(scheduler: Scheduler, jobs: list[str], check) -> dict[str, list] | None:
    placed = scheduler.placements(jobs)
    return placed if check(placed) else None


async def test_under_a_long_queue_waiting_reasons_are_refreshed_less_often_but_surely(admin, nats_server, monkeypatch):
    """The live counts in a waiting reason (jobs ahead) are rewritten for every waiting job at a
    refresh: with many waiting the refresh comes less often (here: one entry a second allowed, two
    jobs waiting, so every two seconds), and then it does come."""
    monkeypatch.setattr(service, "REFRESH_ENTRIES_PER_SECOND", 1.0)
    # The rate limit alone (a reason's minimum age is the core's: tests/unit/scheduler/test_not_sent.py).
    monkeypatch.setattr(service, "REFRESH_MIN_AGE_SECONDS", 0.0)
    run = uuid.uuid4().hex[:6]
    big, *small = [f"alice~refresh{run}n{n}" for n in range(5)]
    bus = await Bus.connect(nats_server.url, name="scheduler", **nats_server.login("scheduler"))
    now = [100.0]
    core = SchedulerCore(local_cluster_config(node="node-a", gpus=0, cpus=2, memory_mb=4096), clock=time.time)
    shell = SchedulerShell(ServiceContext(name="scheduler", config=Config(), bus=bus), core, clock=lambda: now[0])
    kv = await bus.kv(Bucket.SCHEDULE)

    async def stored_reason(job: str) -> str:
        return msgspec.json.decode((await kv.get(ids.job_key(job))).value, type=ScheduleEntry).reason

    try:
        await shell.restore()
        await shell.handle_batch([submitted(big, cpus=2), *(submitted(job) for job in small)])
        await shell.tick()
        last = small[-1]
        assert "3 jobs ahead" in await stored_reason(last)

        await shell.handle_batch([JobReleased(id=f"{big}/1/released", job=big, vc="default", attempt=1)])
        assert [job for job in small if core.entry(job).placed] == small[:2]
        assert "1 job ahead" in core.waiting_reason(last)
        now[0] += 1.0
        await shell.tick()
        assert "3 jobs ahead" in await stored_reason(last), "refreshed before its interval"
        now[0] += 1.0
        await shell.tick()
        assert await stored_reason(last) == core.waiting_reason(last)
        assert "1 job ahead" in await stored_reason(last)
    finally:
        await bus.close()
