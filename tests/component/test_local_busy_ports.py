"""A port something else holds is skipped (issue 31): a task (or any program)
that binds the port the launcher would hand out next does not make the next
job fail with EADDRINUSE. The launcher's shell, its core and the local backend
together, against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import pytest

from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.messages import JobPlaced, JobState, JobSubmitted, TaskPlacement
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.service import ServiceContext
from services.launcher.backends.local import LocalBackend
from services.launcher.core import LauncherCore
from services.launcher.service import LauncherShell
from tests.component.test_launcher_group_commit import stored_state, until

PYTHON = "/usr/bin/python3"
# Binds its port as a server does (listen), fails with EADDRINUSE if it is taken.
SERVE = (
    f"{PYTHON} -c 'import os, socket; s = socket.socket(); "
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    "s.bind((\"\", int(os.environ[\"PAI_PORT_LIST_worker_0_http\"]))); s.listen(); "
    "print(\"serving on\", s.getsockname()[1])'"
)


@pytest.fixture
async def bus(nats_server):
    connected = await Bus.connect(nats_server.url, name="test-launcher-ports", **nats_server.login("launcher"))
    yield connected
    await connected.close()


def squat_a_range() -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket on a port, and a port range that starts with it."""
    squatter = socket.socket()
    squatter.bind(("", 0))
    squatter.listen()
    first = squatter.getsockname()[1]
    return squatter, (first, min(first + 50, 65536))


async def test_a_port_in_use_is_skipped_and_the_job_runs_on_another(bus, tmp_path: Path):
    squatter, port_range = squat_a_range()
    backend = LocalBackend(tmp_path / "launcher", sweep_interval_seconds=0.2, limits="none")
    ctx = ServiceContext(name="launcher", config=Config(grace_seconds=1.0), bus=bus)
    shell = LauncherShell(ctx, LauncherCore(time.time, port_range=port_range, kill_grace_seconds=1.0), backend)
    pump = asyncio.ensure_future(shell.pump_backend())
    job = f"alice~ports{port_range[0]}"
    role = TaskRole(name="worker", instances=1, commands=[SERVE], resources=Resources(cpu=1, memoryMB=256, ports={"http": 1}))
    spec = JobSpec(name=job.split("~")[1], user="alice", virtualCluster="default", taskRoles=[role])
    try:
        await backend.recover()
        await shell.handle_bus([
            JobSubmitted(id=f"{job}/submitted", job=job, at=time.time(), spec=spec),
            JobPlaced(id=f"{job}/1/placed", job=job, vc="default", attempt=1,
                      tasks=[TaskPlacement(role="worker", index=0, node="node-0")]),
        ])
        await until(lambda: _task_ended(shell, job), f"the task of {job} to end")
        task = shell.core.job(job).current.tasks[0]
        assert (task.exitCode, task.platformReason) == (0, ""), task  # it could bind its port
        await until(lambda: _final(bus, job), f"{job} to end")
        record = shell.core.job(job)
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
        await shell.close()
        await backend.close()
        squatter.close()
    assert record is not None
    assert record.state == JobState.SUCCEEDED
    assert task.ports["http"][0] != port_range[0]
    assert port_range[0] < task.ports["http"][0] < port_range[1]


async def _task_ended(shell: LauncherShell, job: str) -> bool:
    record = shell.core.job(job)
    return record is not None and record.current.tasks[0].completedTime is not None


async def _final(bus: Bus, job: str) -> bool:
    state = await stored_state(bus, job)
    return state is not None and state.is_final
