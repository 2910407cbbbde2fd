"""The launcher's batches against a real nats-server and real local processes.

A batch's effects (records, task starts, publications) are all carried out
before its events are acked. These tests crash the launcher in between -- the
consuming task is cancelled right after the shell handled a batch, so nothing
is acked -- and start a fresh shell that restores from the buckets and gets the
whole batch again: every task has been started once, every event stored once,
every job ends as it should. And a batch one of whose effects fails (NATS
trouble) is handed again event by event and still ends right.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Self

import pytest

from libs.common import ids
from libs.common.bus import Bus, load_all
from libs.common.config import Config
from libs.common.errors import Transient
from libs.common.messages import JobPlaced, JobState, JobSubmitted, TaskPlacement
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.records import JobRecord
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket, Durable, Kind, job_subject
from services.launcher.backends.local import LocalBackend
from services.launcher.core import LauncherCore
from services.launcher.service import CONSUMED_KINDS, CONSUMED_TYPES, LauncherShell

WAIT_SECONDS = 90.0
# What a trivial one-task job leaves on the stream, per subject kind.
ONE_TASK_JOB_EVENTS = {Kind.JOB_STATE: 3, Kind.TASK_STARTED: 1, Kind.TASK_EXITED: 1, Kind.JOB_RELEASED: 1}


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def buses(nats_server) -> AsyncIterator[dict[str, Bus]]:
    """The launcher's connection, and those of the services whose events it consumes."""
    connected = {
        user: await Bus.connect(nats_server.url, name=f"test-{user}", **nats_server.login(user))
        for user in ("launcher", "rest", "scheduler", "platform")
    }
    yield connected
    for bus in connected.values():
        await bus.close()


class CountingBackend(LocalBackend):
    """A local backend that counts the starts it was asked for, over every incarnation."""

    starts: Counter[str]

    async def start(self, launch, *, secret_commands=None) -> None:
        self.starts[launch.key.slug] += 1
        await super().start(launch, secret_commands=secret_commands)


class Launcher:
    """One incarnation of the launcher: a shell over a local backend, consuming
    as `services.launcher.service.body` does; `crash_after_batch` cancels its
    consumer right after the shell handled a batch of more than one event,
    before the bus acks it."""

    def __init__(self, bus: Bus, data_dir: Path, starts: Counter[str], *, crash_after_batch: bool = False):
        self.ctx = ServiceContext(name="launcher", config=Config(grace_seconds=1.0), bus=bus)
        self.backend = CountingBackend(data_dir, grace_seconds=1.0)
        self.backend.starts = starts
        self.shell = LauncherShell(self.ctx, LauncherCore(time.time, kill_grace_seconds=1.0), self.backend)
        self.crash_after_batch = crash_after_batch
        self.batches: list[list[str]] = []
        self.crashed = asyncio.Event()
        self.tasks: list[asyncio.Task] = []

    async def start(self, *, pump: bool = True) -> None:
        await self.shell.restore()
        if pump:
            self.tasks.append(asyncio.create_task(self.shell.pump_backend()))
        self.consumer = asyncio.create_task(
            self.ctx.bus.consume_batches(
                Durable.LAUNCHER, CONSUMED_KINDS, CONSUMED_TYPES, self._handle, stopping=self.ctx.stopping, ordered=True
            )
        )
        self.tasks.append(self.consumer)

    async def _handle(self, events: list) -> None:
        self.batches.append([e.id for e in events])  # as handed, whether or not it succeeds
        await self.shell.handle_bus(events)
        if self.crash_after_batch and len(events) > 1:
            self.crashed.set()
            # The process dies here: effects done, nothing acked; its backend
            # pump and whatever it queued for the next transaction die with it.
            for task in self.tasks:
                task.cancel()
            if self.shell._committer is not None:
                self.shell._committer.cancel()
            await asyncio.sleep(3600)

    async def until_final(self, jobs: list[str]) -> dict[str, JobRecord]:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            records = {job: self.shell.core.job(job) for job in jobs}
            if all(r is not None and r.state.is_final for r in records.values()):
                return records  # type: ignore[return-value]
            await asyncio.sleep(0.1)
        raise AssertionError(f"waited {WAIT_SECONDS:g}s for {jobs} to end: {[(j, r and r.state) for j, r in records.items()]}")

    async def close(self) -> None:
        self.ctx.stopping.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.shell.close()


def one_task_job(name: str, marker: Path) -> JobSpec:
    """A job whose one task leaves a line in `marker` each time it runs."""
    worker = TaskRole(name="worker", instances=1, commands=[f"echo ran >> {marker}"], resources=Resources(cpu=1, memoryMB=256))
    return JobSpec(name=name, user="alice", virtualCluster="default", taskRoles=[worker])


async def submit_and_place(buses: dict[str, Bus], jobs: list[str], markers: Path) -> None:
    """What rest and the scheduler publish for each job: its submission, then its placement."""
    for job in jobs:
        spec = one_task_job(job.split("~")[1], markers / job)
        await buses["rest"].publish(JobSubmitted(id=f"{job}/submitted", job=job, at=time.time(), spec=spec))
    for job in jobs:
        await buses["scheduler"].publish(
            JobPlaced(id=f"{job}/1/placed", job=job, vc="default", attempt=1,
                      tasks=[TaskPlacement(role="worker", index=0, node="node-0")])
        )


async def stored_events(platform: Bus, job: str) -> dict[Kind, int]:
    """How many events the stream holds on each of the launcher's subjects for `job`."""
    counts = {}
    for kind in ONE_TASK_JOB_EVENTS:
        info = await platform.js.stream_info(STREAM, subjects_filter=job_subject(kind, "default", job))
        counts[kind] = sum((info.state.subjects or {}).values())
    return counts


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_SECONDS:g}s for {what}"
        await asyncio.sleep(0.1)


async def until_all_stored(platform: Bus, jobs: list[str]) -> None:
    """Until every job's events are on the stream: the core's state moves before
    its effects are carried out, so a launcher closed on seeing it could cut
    them short."""
    deadline = time.monotonic() + WAIT_SECONDS
    for job in jobs:
        while any(n < ONE_TASK_JOB_EVENTS[k] for k, n in (await stored_events(platform, job)).items()):
            assert time.monotonic() < deadline, f"waited {WAIT_SECONDS:g}s for the events of {job}"
            await asyncio.sleep(0.1)


async def until_all_acked(bus: Bus) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while (info := await bus.js.consumer_info(STREAM, Durable.LAUNCHER.value)).num_ack_pending:
        assert time.monotonic() < deadline, f"{info.num_ack_pending} launcher events never acked"
        await asyncio.sleep(0.2)


def assert_ran_once_each(jobs: list[str], markers: Path, records: dict[str, JobRecord]) -> None:
    for job in jobs:
        assert records[job].state == JobState.SUCCEEDED, (job, records[job].state, records[job].appExitDiagnostics)
        assert (markers / job).read_text() == "ran\n", f"the task of {job} ran more than once"


@pytest.mark.parametrize("pump", [False, True], ids=["backend-unheard", "backend-reporting"])
async def test_a_crash_between_a_batchs_effects_and_its_acks_loses_and_repeats_nothing(buses, tmp_path, pump):
    run = uuid.uuid4().hex[:6]
    jobs = [f"alice~crash{run}x{i}" for i in range(6)]
    markers = tmp_path / "markers"
    markers.mkdir()
    starts: Counter[str] = Counter()
    await submit_and_place(buses, jobs, markers)

    # The first incarnation handles one batch (all twelve events waiting) and dies before acking it.
    first = Launcher(buses["launcher"], tmp_path / "launcher", starts, crash_after_batch=True)
    # Without its pump it dies before seeing any task run; with it, the
    # backend's reports may be grouped with the batch, or queued, when it dies.
    await first.start(pump=pump)
    await asyncio.wait_for(first.crashed.wait(), WAIT_SECONDS)
    handled_before_crash = first.batches[-1]
    crashed_jobs = sorted({e.split("/")[0] for e in handled_before_crash})
    # Its tasks ran meanwhile (the shims outlive the launcher): the next one must not run them again.
    await until(lambda: all((markers / job).exists() for job in crashed_jobs), "the tasks started before the crash to run")
    await first.close()
    assert len(handled_before_crash) > 1
    kv = await buses["launcher"].kv(Bucket.JOB_STATUS)
    saved = await load_all(kv, JobRecord)
    assert all(saved[ids.job_key(job)].current.tasks[0].startRequested for job in crashed_jobs)

    # A fresh incarnation restores from the buckets, re-adopts the tasks, and gets the same events again.
    second = Launcher(buses["launcher"], tmp_path / "launcher", starts)
    await second.start()
    try:
        records = await second.until_final(jobs)
        await until_all_stored(buses["platform"], jobs)
        await until_all_acked(buses["launcher"])
        redelivered = [event for batch in second.batches for event in batch]
        assert set(handled_before_crash) <= set(redelivered)  # the whole unacked batch came back
    finally:
        await second.close()

    assert_ran_once_each(jobs, markers, records)
    # Not even asked of the backend again (which would refuse to run a key twice anyway).
    assert sorted(starts.values()) == [1] * len(jobs), starts
    for job in jobs:
        assert await stored_events(buses["platform"], job) == ONE_TASK_JOB_EVENTS, job
    saved = await load_all(kv, JobRecord)
    assert all(saved[ids.job_key(job)].state == JobState.SUCCEEDED for job in jobs)


class FailingOnce:
    """Makes one of the bus's batch writes fail (NATS trouble), after carrying out part of it."""

    def __init__(self, bus: Bus, method: str, job: str):
        self.bus, self.method, self.job = bus, method, job
        self.real = getattr(bus, method)
        self.failed = False

    def __enter__(self) -> Self:
        setattr(self.bus, self.method, self._call)
        return self

    def __exit__(self, *_exc: object) -> None:
        setattr(self.bus, self.method, self.real)

    async def _call(self, *args):
        batch = args[-1]
        names = [key for key in batch] if isinstance(batch, dict) else [event.job for event in batch]
        mine = [n for n in names if self.job in n]
        if self.failed or not mine or len(names) == len(mine):
            return await self.real(*args)
        self.failed = True
        # The other jobs' part is carried out, this job's is not: then the trouble.
        if isinstance(batch, dict):
            await self.real(*args[:-1], {k: v for k, v in batch.items() if self.job not in k})
        else:
            await self.real([event for event in batch if event.job != self.job])
        raise Transient(f"{self.method} of a batch: NATS went away (test)")


@pytest.mark.parametrize("method", ["kv_write_many", "publish_many"], ids=["record-write-fails", "publish-fails"])
async def test_a_batch_mixing_jobs_whose_effect_fails_for_one_of_them_ends_right(buses, tmp_path, method):
    run = uuid.uuid4().hex[:6]
    jobs = [f"alice~mixed{run}x{i}" for i in range(4)]
    markers = tmp_path / "markers"
    markers.mkdir()
    starts: Counter[str] = Counter()
    await submit_and_place(buses, jobs, markers)
    launcher = Launcher(buses["launcher"], tmp_path / "launcher", starts)
    with FailingOnce(buses["launcher"], method, ids.job_key(jobs[2]) if method == "kv_write_many" else jobs[2]) as trouble:
        await launcher.start()
        try:
            records = await launcher.until_final(jobs)
            await until_all_stored(buses["platform"], jobs)
            await until_all_acked(buses["launcher"])
        finally:
            await launcher.close()
    assert trouble.failed, "the batch never met its trouble"
    # The failed batch was handed again one event at a time.
    assert any(len(batch) > 1 for batch in launcher.batches)
    assert any(len(batch) == 1 and batch[0].startswith(jobs[0]) for batch in launcher.batches)
    assert_ran_once_each(jobs, markers, records)
    for job in jobs:
        assert await stored_events(buses["platform"], job) == ONE_TASK_JOB_EVENTS, job
    saved = await load_all(await buses["launcher"].kv(Bucket.JOB_STATUS), JobRecord)
    assert all(saved[ids.job_key(job)].state == JobState.SUCCEEDED for job in jobs)
