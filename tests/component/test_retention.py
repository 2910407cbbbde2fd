"""Retention against real processes and a real nats-server: a finished job's task
directories and logs go after `retention_finished_seconds`, its record stays, a
running job is never touched, and a restarted launcher goes on from its records."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libs.common import ids
from libs.common.bus import Bus, get_json
from libs.common.config import Config
from libs.common.errors import NotFound
from libs.common.logs import LogRequest
from libs.common.messages import JobState, TaskPlacement
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.records import JobRecord
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.launcher.backends.local import LocalBackend
from services.launcher.core import LauncherCore, Placed, StopRequested, Submitted
from services.launcher.service import LauncherShell

RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 60.0
RETENTION = 1.0


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def launcher_bus(nats_server) -> AsyncIterator[Bus]:
    admin = await Bus.connect(nats_server.url, name="test-admin", **nats_server.login("platform"))
    await admin.bootstrap()
    await admin.close()
    bus = await Bus.connect(nats_server.url, name="launcher", **nats_server.login("launcher"))
    yield bus
    await bus.close()


def spec(name: str, command: str) -> JobSpec:
    return JobSpec(name=name, user="alice", virtualCluster="default",
                   taskRoles=[TaskRole(name="worker", instances=1, commands=[command],
                                       resources=Resources(gpu=0, cpu=1, memoryMB=256))])


class Launcher:
    """A launcher shell over a real local backend, as `services.launcher.service.body` runs it."""

    def __init__(self, bus: Bus, data_dir: Path):
        config = Config(retention_finished_seconds=RETENTION, retention_sweep_seconds=3600.0, grace_seconds=1.0)
        self.ctx = ServiceContext(name="launcher", config=config, bus=bus)
        self.backend = LocalBackend(data_dir, grace_seconds=1.0)
        self.shell = LauncherShell(self.ctx, LauncherCore(time.time, kill_grace_seconds=1.0), self.backend)
        self.pump: asyncio.Task | None = None

    async def start(self) -> None:
        await self.shell.restore()
        self.pump = asyncio.create_task(self.shell.pump_backend())

    async def run(self, job: str, command: str) -> None:
        name = job.split("~")[1]
        await self.shell._apply(Submitted(job=job, spec=spec(name, command), at=time.time(), id=f"{job}/submitted"))
        await self.shell._apply(Placed(job=job, attempt=1, id=f"{job}/1/placed",
                                       tasks=[TaskPlacement(role="worker", index=0, node=self.backend.node_names[0])]))

    async def until_state(self, job: str, *states: JobState) -> JobRecord:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            record = self.shell.core.job(job)
            if record is not None and record.state in states and not record.current.tasks[0].live:
                return record
            if record is not None and record.state in states and JobState.RUNNING in states:
                return record
            await asyncio.sleep(0.1)
        raise AssertionError(f"waited {WAIT_SECONDS:g}s for {job} to be {states}")

    def log_of(self, job: str) -> LogRequest:
        return LogRequest(job=job, attempt=1, role="worker", index=0)

    async def close(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
            await asyncio.gather(self.pump, return_exceptions=True)
        await self.shell.close()


async def test_a_finished_jobs_files_go_after_the_retention_and_a_running_job_keeps_its_own(launcher_bus, tmp_path):
    done, running = f"alice~done{RUN}", f"alice~busy{RUN}"
    launcher = Launcher(launcher_bus, tmp_path / "launcher")
    await launcher.start()
    try:
        await launcher.run(done, "echo finished-output")
        await launcher.run(running, "echo still-here; sleep 120")
        await launcher.until_state(done, JobState.SUCCEEDED)
        await launcher.until_state(running, JobState.RUNNING)
        assert b"finished-output" in await launcher.shell._read_log(launcher.log_of(done))
        done_key = launcher.shell.core.job(done).current.tasks[0]
        slug = f"{ids.job_key(done)}"
        task_files = [p for p in (tmp_path / "launcher" / "tasks").iterdir() if p.name.startswith(slug)]
        work_dirs = [p for p in (tmp_path / "launcher" / "work").iterdir() if p.name.startswith(slug)]
        assert len(task_files) >= 2 and work_dirs and done_key.startRequested  # its record and its log

        assert await launcher.shell.prune_once() == []  # younger than the retention
        await asyncio.sleep(RETENTION + 0.2)
        assert await launcher.shell.prune_once() == [done]

        assert not any(p.exists() for p in task_files + work_dirs)
        # The record stays, saying when its files went; the log request says why there is none.
        stored, _ = await get_json(await launcher_bus.kv(Bucket.JOB_STATUS), ids.job_key(done), JobRecord)
        assert stored.state == JobState.SUCCEEDED and stored.logsPrunedAt is not None
        with pytest.raises(NotFound, match=r"removed .*\(retention_finished_seconds\)"):
            await launcher.shell._read_log(launcher.log_of(done))
        # The running job (well past the retention age itself) keeps its files and runs on.
        assert b"still-here" in await launcher.shell._read_log(launcher.log_of(running))
        assert launcher.shell.core.job(running).state == JobState.RUNNING
    finally:
        await launcher.close()

    # A restarted launcher goes on from its records: nothing is pruned twice.
    again = Launcher(launcher_bus, tmp_path / "launcher")
    await again.start()
    try:
        assert again.shell.core.job(done).logsPrunedAt == stored.logsPrunedAt
        assert await again.shell.prune_once() == []
        assert b"still-here" in await again.shell._read_log(again.log_of(running))
        await again.shell._apply(StopRequested(job=running, by="alice", id=f"{running}/stop"))
        await again.until_state(running, JobState.STOPPED)
        await asyncio.sleep(RETENTION + 0.2)
        assert await again.shell.prune_once() == [running]
    finally:
        await again.close()
