"""A full disk under the local backend's task logs (a real tmpfs of 256 KiB): the
task ends, its log is marked cut short by the full disk, its exit says so, the
backend stays up and the next task runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from libs.common.messages import TaskPlacement
from services.launcher.backends.local import LocalBackend
from services.launcher.backends.local_logs import DISK_FULL_PLATFORM_REASON
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskLaunch

RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 60.0


@pytest.fixture
def tiny_disk(tmp_path: Path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount not permitted here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def launch(name: str, command: str) -> TaskLaunch:
    key = TaskKey(job=f"alice~{name}{RUN}", attempt=1, role="worker", index=0)
    return TaskLaunch(key=key, vc="default", user="alice", placement=TaskPlacement(role="worker", index=0, node="node-a"),
                      commands=[command], env={})


async def finished(backend: LocalBackend, events, key: TaskKey) -> TaskFinished:
    async def first() -> TaskFinished:
        async for event in events:
            if isinstance(event, TaskFinished) and event.key == key:
                return event
        raise AssertionError("backend events ended")

    return await asyncio.wait_for(first(), WAIT_SECONDS)


async def test_a_log_that_fills_the_disk_is_cut_short_and_the_next_task_runs(tiny_disk):
    backend = LocalBackend(tiny_disk / "launcher", node_names=["node-a"], grace_seconds=1.0)
    events = backend.events().__aiter__()
    try:
        # 2 MB of output onto a 256 KiB disk, then a line that would be the log's end.
        noisy = launch("noisy", "head -c 2000000 /dev/zero | tr '\\0' x; echo; echo the-end")
        await backend.start(noisy)
        end = await finished(backend, events, noisy.key)
        assert end.exitCode == 0  # the task was not blocked nor killed by its log
        assert end.platformReason == DISK_FULL_PLATFORM_REASON
        assert "no space left on device" in end.userLogTail  # what the runtime's DiskFull rule matches
        log = await backend.read_log(noisy.key)
        assert log.endswith(b"no space left on device (ENOSPC) on the launcher's data disk]\n")
        assert b"the-end" not in log  # nothing after the disk filled up is kept
        await backend.forget(noisy.key)

        # The log gave its room back: the next task starts, runs and is logged.
        quiet = launch("quiet", "echo hello-after-full-disk")
        await backend.start(quiet)
        after = await finished(backend, events, quiet.key)
        assert (after.exitCode, after.platformReason) == (0, "")
        assert b"hello-after-full-disk" in await backend.read_log(quiet.key)
    finally:
        await backend.close()
