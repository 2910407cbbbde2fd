"""The pool of task cgroups (cgroup v1, launcher as root): an ended task's
cgroups are reset and handed to the next task instead of removed and made
again (local_limits). What must hold: the next task starts from fresh counts
(no OOM kill, no peak of the one before), no two live tasks ever share a
cgroup, and after a launcher killed with SIGKILL nothing is leaked."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from services.launcher.backends import local_limits
from services.launcher.backends.local_layout import OUTPUT_LOG, TaskFiles, read_task_exit
from tests.component.test_local_backend import REPO, WAIT_SECONDS, Harness, launch, open_harness, task_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task cgroups are made only when the launcher runs as root")

PYTHON = "/usr/bin/python3"  # one a task's user may run
# Prints the task's memory cgroup (its path below the hierarchy, and the
# directory's inode: the same inode under another name is the same cgroup).
WHERE = (
    "p=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup); "
    "echo \"cgroup $p $(stat -c %i /sys/fs/cgroup/memory$p)\""
)


def data_dir() -> Path:
    # Under /var/tmp, traversable by the tasks' users (see test_local_kernel_limits).
    data = Path(tempfile.mkdtemp(prefix="pai-pool-", dir="/var/tmp"))
    data.chmod(0o711)
    return data


def cgroup_of(harness: Harness, key) -> tuple[str, str]:
    """(path, inode) of the memory cgroup the task printed (WHERE)."""
    text = task_file(harness.backend, key, OUTPUT_LOG).read_text()
    line = next(line for line in text.splitlines() if line.startswith("cgroup "))
    _, path, inode = line.split()
    return path, inode


def span(harness: Harness, key) -> tuple[float, float]:
    exit = read_task_exit(TaskFiles(str(harness.backend.tasks_dir / key.slug)))
    assert exit is not None and exit.startedAt is not None
    return exit.startedAt, exit.finishedAt


def task_cgroups(parents: list[str]) -> list[str]:
    """Every cgroup under the data dir's parents, pooled ones included."""
    found = []
    for parent in parents:
        if os.path.isdir(parent):
            found += [f"{parent}/{e.name}" for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
    return found


async def wait_until_only_pooled(parents: list[str]) -> None:
    """The shims put the ended tasks' cgroups back a moment after the exits."""
    deadline = time.monotonic() + WAIT_SECONDS
    while any(not os.path.basename(p).startswith(local_limits.POOL_PREFIX) for p in task_cgroups(parents)):
        assert time.monotonic() < deadline, task_cgroups(parents)
        await asyncio.sleep(0.05)


async def test_a_pooled_cgroup_is_handed_on_with_fresh_counts():
    data = data_dir()
    harness = await open_harness(data / "launcher", task_user="")
    try:
        if harness.backend.limits_mode != "cgroup1":
            pytest.skip("the pool is for cgroup v1 task cgroups")
        parents = harness.backend._cgroup_parents_v1
        # One killed by the kernel for its memory, with a high peak.
        hog = launch("hog", WHERE, f"{PYTHON} -c 'b = b\"x\" * (400 * 1024 * 1024)'", memoryMB=128)
        first = await harness.run(hog)
        assert first.platformReason == "OOMKilled"
        await wait_until_only_pooled(parents)
        # The next task with the same bounds gets the same cgroup, under its own name ...
        quiet = launch("quiet", WHERE, "echo done", memoryMB=128)
        second = await harness.run(quiet)
        assert cgroup_of(harness, quiet.key)[1] == cgroup_of(harness, hog.key)[1]
        assert cgroup_of(harness, quiet.key)[0].endswith("/" + quiet.key.slug)
        # ... and neither the OOM kill nor the peak of the task before.
        assert second.exitCode == 0 and second.platformReason == ""
        assert second.memoryPeakMB is not None and second.memoryPeakMB < 16, second.memoryPeakMB
        # The launcher closes while a task runs: its shim pools the task's
        # cgroups after the launcher removed the pool, and removes them as it exits.
        last = launch("last", "sleep 1", memoryMB=128)
        await harness.backend.start(last)
        await harness.events.running(last.key)
        await harness.close()
        deadline = time.monotonic() + WAIT_SECONDS
        while task_cgroups(parents):
            assert time.monotonic() < deadline, task_cgroups(parents)
            await asyncio.sleep(0.1)
    finally:
        await harness.close()
        shutil.rmtree(data, ignore_errors=True)


LAUNCHER_KILLED_AMID_TASKS = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from libs.common.messages import TaskPlacement
    from services.launcher.core.tasks import TaskFinished, TaskKey, TaskLaunch, TaskRunning
    from services.launcher.backends.local import LocalBackend

    def launch(name, *commands):
        key = TaskKey(job=f"alice~{name}", attempt=0, role="worker", index=0)
        return TaskLaunch(key=key, vc="default", user="alice", memoryMB=128,
                          placement=TaskPlacement(role="worker", index=0, node="node-a"),
                          commands=list(commands), env={})

    async def main():
        backend = LocalBackend(Path(sys.argv[1]), task_user="", sweep_interval_seconds=0.2)
        await backend.recover()
        quick = [launch(f"quick{i}", sys.argv[2]) for i in range(6)]
        for task in quick:
            await backend.start(task)
        ended = 0
        async for event in backend.events():
            if isinstance(event, TaskFinished):
                ended += 1
                if ended == len(quick):
                    break
        # Their cgroups go to the pool; these hold theirs when we are killed.
        slow = [launch(f"slow{i}", sys.argv[2], "sleep 2") for i in range(4)]
        for task in slow:
            await backend.start(task)
        running = 0
        async for event in backend.events():
            if isinstance(event, TaskRunning):
                running += 1
                if running == len(slow):
                    break
        print("started", flush=True)
        await asyncio.sleep(300)

    asyncio.run(main())
    """
)


async def test_after_a_launcher_killed_with_sigkill_no_cgroup_is_shared_or_leaked():
    data = data_dir()
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER_KILLED_AMID_TASKS, str(data / "launcher"), WHERE],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert launcher.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(launcher.stdout.readline), WAIT_SECONDS * 2)
        assert line == "started\n"
    finally:
        launcher.kill()
        launcher.wait()

    harness = await open_harness(data / "launcher", task_user="")
    parents = list(harness.backend._cgroup_parents_v1)
    try:
        if harness.backend.limits_mode != "cgroup1":
            pytest.skip("the pool is for cgroup v1 task cgroups")
        # New tasks while the old launcher's slow ones still run, and take
        # cgroups from the pool its quick ones filled.
        fresh = [launch(f"fresh{i}", WHERE, "sleep 1", memoryMB=128) for i in range(8)]
        for task in fresh:
            await harness.backend.start(task)
        slow = [launch(f"slow{i}", WHERE).key for i in range(4)]
        for key in slow:
            assert (await harness.events.finished(key)).exitCode == 0
        for task in fresh:
            assert (await harness.events.finished(task.key)).exitCode == 0
        seen = {key: cgroup_of(harness, key) for key in slow + [task.key for task in fresh]}
        # Each ran in a cgroup named by its own slug: a cgroup two live tasks
        # held would have carried one name for both.
        for key, (path, _) in seen.items():
            assert path.endswith("/" + key.slug), (key, path)
        # Tasks that ran at the same time (the old slow ones and the new
        # ones) had distinct cgroups.
        spans = {key: span(harness, key) for key in seen}
        for a in seen:
            for b in seen:
                if a != b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]:
                    assert seen[a][1] != seen[b][1], (a, b)
        # The pool the killed launcher's quick tasks filled served the new ones.
        quick = {cgroup_of(harness, launch(f"quick{i}").key)[1] for i in range(6)}
        assert quick & {cgroup_of(harness, task.key)[1] for task in fresh}
        await wait_until_only_pooled(parents)
    finally:
        await harness.close()
        shutil.rmtree(data, ignore_errors=True)
    # Nothing left behind once every task has ended and the launcher closed.
    assert task_cgroups(parents) == []
