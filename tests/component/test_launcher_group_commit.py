"""The launcher's group commit, against a real nats-server.

Whatever is handed to the shell while a transaction's effects are in flight (a
bus batch, the backend's reports, a timer) goes into the next transaction
together: one record write per job for all of it. A caller still returns only
once its own events' effects are durable; events the core refuses fail only
their own caller; effects that fail are retried for the backend's reports (no
one acks those) and raised to the bus for its batch.

The backend here is a stand-in that reports what the test tells it to, so that
the order of reports against the bus's batches is the test's to choose.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Self

import pytest

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.errors import Transient
from libs.common.messages import JobPlaced, JobState, JobSubmitted, TaskPlacement
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.records import decode_job_record
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.launcher.core import LauncherCore
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning
from services.launcher.service import LauncherShell

WAIT_SECONDS = 30.0


@pytest.fixture
async def bus(nats_server) -> AsyncIterator[Bus]:
    connected = await Bus.connect(nats_server.url, name="test-launcher", **nats_server.login("launcher"))
    yield connected
    await connected.close()


class ToldBackend:
    """A backend that starts nothing and reports what the test puts in `reports`."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue = asyncio.Queue()
        self.started: list[TaskKey] = []

    async def recover(self) -> list[TaskKey]:
        return []

    async def start(self, launch, *, secret_commands=None) -> None:
        self.started.append(launch.key)

    async def kill(self, key: TaskKey, *, grace_seconds: float, reason: str) -> None:
        pass

    async def forget(self, key: TaskKey) -> None:
        pass

    async def events(self):
        while True:
            yield await self.reports.get()

    async def close(self) -> None:
        pass


class GatedWrites:
    """Wraps the bus's record writes: counts them (keys per call), and holds the
    first one until `release` is set, so that the test can queue work behind it."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.real = bus.kv_write_many
        self.calls: list[list[str]] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.fail_next = 0

    def __enter__(self) -> Self:
        self.bus.kv_write_many = self._write  # type: ignore[method-assign]
        return self

    def __exit__(self, *_exc: object) -> None:
        self.bus.kv_write_many = self.real  # type: ignore[method-assign]

    async def _write(self, bucket, writes, **options):
        self.calls.append(sorted(writes))
        if len(self.calls) == 1:
            self.holding.set()
            await self.release.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise Transient("record write: NATS went away (test)")
        return await self.real(bucket, writes, **options)


def spec(name: str) -> JobSpec:
    role = TaskRole(name="worker", instances=1, commands=["true"], resources=Resources(cpu=1, memoryMB=256))
    return JobSpec(name=name, user="alice", virtualCluster="default", taskRoles=[role])


def submitted(job: str) -> JobSubmitted:
    return JobSubmitted(id=f"{job}/submitted", job=job, at=time.time(), spec=spec(job.split("~")[1]))


def placed(job: str) -> JobPlaced:
    return JobPlaced(id=f"{job}/1/placed", job=job, vc="default", attempt=1,
                     tasks=[TaskPlacement(role="worker", index=0, node="node-0")])


def key(job: str) -> TaskKey:
    return TaskKey(job=job, attempt=1, role="worker", index=0)


@contextlib.asynccontextmanager
async def running_shell(bus: Bus) -> AsyncIterator[tuple[LauncherShell, ToldBackend]]:
    """A launcher shell on a told backend, the backend's reports pumped into it;
    the pump stopped and the shell closed at the end."""
    backend = ToldBackend()
    ctx = ServiceContext(name="launcher", config=Config(grace_seconds=1.0), bus=bus)
    shell = LauncherShell(ctx, LauncherCore(time.time, kill_grace_seconds=1.0), backend)
    pump = asyncio.ensure_future(shell.pump_backend())
    try:
        yield shell, backend
    finally:
        pump.cancel()
        await shell.close()


async def stored_state(bus: Bus, job: str) -> JobState | None:
    entry = await (await bus.kv(Bucket.JOB_STATUS)).get(ids.job_key(job))
    return decode_job_record(entry.value).state if entry.value else None


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not await condition():
        assert time.monotonic() < deadline, f"waited {WAIT_SECONDS:g}s for {what}"
        await asyncio.sleep(0.05)


def jobs(n: int) -> list[str]:
    run = uuid.uuid4().hex[:6]
    return [f"alice~group{run}x{i}" for i in range(n)]


async def test_what_comes_while_a_transaction_is_in_flight_is_written_together_after_it(bus):
    a, b = jobs(2)
    async with running_shell(bus) as (shell, backend):
        with GatedWrites(bus) as writes:
            first = asyncio.ensure_future(shell.handle_bus([submitted(a), placed(a)]))
            await asyncio.wait_for(writes.holding.wait(), WAIT_SECONDS)
            # While the first batch's record write is in flight: the backend
            # reports a's task running and ended, and the next bus batch comes.
            await backend.reports.put(TaskRunning(key=key(a), node="node-0"))
            await backend.reports.put(TaskFinished(key=key(a), exitCode=0))
            second = asyncio.ensure_future(shell.handle_bus([submitted(b)]))
            await asyncio.sleep(0.3)  # (time for all of it to queue up behind the write)
            assert not first.done() and not second.done(), "a batch returned before its records were stored"
            writes.release.set()
            await asyncio.wait_for(asyncio.gather(first, second), WAIT_SECONDS)
        # One write for a's submission and placement; then one for all the rest:
        # a's start and end, and b's submission.
        assert writes.calls == [[ids.job_key(a)], sorted([ids.job_key(a), ids.job_key(b)])]
        assert backend.started == [key(a)]
        assert await stored_state(bus, a) == JobState.SUCCEEDED
        assert await stored_state(bus, b) == JobState.WAITING  # durable when its batch returned


async def test_events_the_core_refuses_fail_only_their_own_caller(bus):
    a, unknown = jobs(2)
    async with running_shell(bus) as (shell, backend):
        await shell.handle_bus([submitted(a), placed(a)])
        with GatedWrites(bus) as writes:
            # Something in flight, so that what follows is grouped.
            busy = asyncio.ensure_future(shell.handle_bus([submitted(jobs(1)[0])]))
            await asyncio.wait_for(writes.holding.wait(), WAIT_SECONDS)
            await backend.reports.put(TaskRunning(key=key(a), node="node-0"))
            refused = asyncio.ensure_future(shell.handle_bus([placed(unknown)]))  # its submission not seen yet
            await asyncio.sleep(0.3)
            writes.release.set()
            await asyncio.wait_for(busy, WAIT_SECONDS)
            with pytest.raises(Transient, match="whose submission the launcher has not seen yet"):
                await asyncio.wait_for(refused, WAIT_SECONDS)
        # The backend's report, grouped with the refused batch, was applied all the same.
        await until(lambda: _is(bus, a, JobState.RUNNING), f"{a} to be stored RUNNING")
        assert not shell.ctx.stopping.is_set()


async def test_a_failed_write_fails_the_bus_batch_and_retries_the_backend_reports(bus):
    a, b = jobs(2)
    async with running_shell(bus) as (shell, backend):
        await shell.handle_bus([submitted(a), placed(a)])
        with GatedWrites(bus) as writes:
            busy = asyncio.ensure_future(shell.handle_bus([submitted(b)]))
            await asyncio.wait_for(writes.holding.wait(), WAIT_SECONDS)
            writes.fail_next = 1  # this write fails: its batch is handed again by the bus
            await backend.reports.put(TaskRunning(key=key(a), node="node-0"))
            await asyncio.sleep(0.3)
            writes.release.set()
            with pytest.raises(Transient, match="NATS went away"):
                await asyncio.wait_for(busy, WAIT_SECONDS)
            # a's report, which no one acks, was put back and goes again in the
            # next transaction; the bus hands b's submission again.
            await asyncio.wait_for(shell.handle_bus([submitted(b)]), WAIT_SECONDS)
        assert await stored_state(bus, b) == JobState.WAITING
        await until(lambda: _is(bus, a, JobState.RUNNING), f"{a} to be stored RUNNING")
        assert not shell.ctx.stopping.is_set(), "a retried report stopped the launcher"


async def _is(bus: Bus, job: str, state: JobState) -> bool:
    return await stored_state(bus, job) == state


async def test_a_task_seen_running_waits_for_its_end_while_other_jobs_tasks_are_under_way(bus, monkeypatch):
    from services.launcher import service

    monkeypatch.setattr(service, "RUNNING_LINGER_SECONDS", 1.0)  # a moment even a loaded machine keeps
    a, b = jobs(2)
    async with running_shell(bus) as (shell, backend):
        await shell.handle_bus([submitted(a), placed(a), submitted(b), placed(b)])
        with GatedWrites(bus) as writes:
            writes.release.set()
            await backend.reports.put(TaskRunning(key=key(b), node="node-0"))
            await asyncio.sleep(0.1)
            await backend.reports.put(TaskFinished(key=key(b), exitCode=0))
            await until(lambda: _is(bus, b, JobState.SUCCEEDED), f"{b} to be stored SUCCEEDED")
        assert writes.calls == [[ids.job_key(b)]], "b's start and end were not written together"


async def test_a_lone_job_on_an_idle_launcher_is_seen_running_at_once(bus, monkeypatch):
    from services.launcher import service

    monkeypatch.setattr(service, "RUNNING_LINGER_SECONDS", 30.0)  # were it waited for, the test would time out
    before, a = jobs(2)
    async with running_shell(bus) as (shell, backend):
        # A job run to its end just before does not make the launcher busy.
        await shell.handle_bus([submitted(before), placed(before)])
        await backend.reports.put(TaskRunning(key=key(before), node="node-0"))
        await backend.reports.put(TaskFinished(key=key(before), exitCode=0))
        await until(lambda: _is(bus, before, JobState.SUCCEEDED), f"{before} to be stored SUCCEEDED")
        await shell.handle_bus([submitted(a), placed(a)])
        await backend.reports.put(TaskRunning(key=key(a), node="node-0"))
        await asyncio.wait_for(until(lambda: _is(bus, a, JobState.RUNNING), f"{a} to be stored RUNNING"), 10.0)


async def test_under_load_backend_reports_wait_a_moment_for_company_and_go_with_the_next_bus_batch(bus, monkeypatch):
    from services.launcher import service

    monkeypatch.setattr(service, "COMMIT_DELAY_SECONDS", 30.0)  # only company sends them on in time
    a, b, c, d = jobs(4)
    async with running_shell(bus) as (shell, backend):
        # d's task stays under way throughout: the launcher is under load.
        await shell.handle_bus([submitted(a), placed(a), submitted(b), placed(b), submitted(d), placed(d)])
        with GatedWrites(bus) as writes:
            writes.release.set()
            # Both tasks ended, each report alone.
            await backend.reports.put(TaskFinished(key=key(a), exitCode=0))
            await asyncio.sleep(0.1)
            await backend.reports.put(TaskFinished(key=key(b), exitCode=0))
            await asyncio.sleep(0.3)
            assert writes.calls == [], "a report under load did not wait for company"
            # The next bus batch takes them along, and returns at once.
            await asyncio.wait_for(shell.handle_bus([submitted(c)]), 10.0)
        assert writes.calls == [sorted(ids.job_key(j) for j in (a, b, c))]
        assert await stored_state(bus, a) == JobState.SUCCEEDED
        assert await stored_state(bus, b) == JobState.SUCCEEDED
