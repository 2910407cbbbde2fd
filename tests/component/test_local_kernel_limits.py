"""What the kernel holds a local task to when it runs as a user of its own (the
launcher as root, as in CI): /proc shows it no other tenant's process, its
/dev/shm and /tmp are its own and go with it, and cgroups bound its memory
(the whole task), cpu and processes; its working directory is bounded too.

Each test is an attack a task of one job could make on the machine or on
another job (issue 31), and what stops it."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from services.launcher.backends import local, local_namespaces
from services.launcher.backends.local_layout import OUTPUT_LOG, TaskFiles, read_task_exit
from services.runtime.core import RuleEngine, default_rules
from tests.component.test_local_backend import Harness, launch, open_harness, read_pid, task_file
from tests.unit.runtime.builders import task_exited

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks change user only when the launcher runs as root")

PIDS_MAX = 48
WORK_DIR_MB = 24
PYTHON = "/usr/bin/python3"  # one a task's user may run (the project's virtualenv may not be reachable)


@pytest_asyncio.fixture(scope="module")
async def bounded():
    # Under /var/tmp, traversable: the working directories stay in the data dir
    # (under a 0700 pytest directory they would go to /tmp/pai-work-*).
    data = Path(tempfile.mkdtemp(prefix="pai-limits-", dir="/var/tmp"))
    data.chmod(0o711)
    harness = await open_harness(
        data / "launcher", grace_seconds=1.0, task_user="", pids_max=PIDS_MAX, work_dir_mb=WORK_DIR_MB
    )
    yield harness
    await harness.close()
    shutil.rmtree(data, ignore_errors=True)


def output(harness: Harness, key) -> str:
    path = task_file(harness.backend, key, OUTPUT_LOG)
    return path.read_text() if path.exists() else ""  # made on the first write


def verdict(finished):
    exit = task_exited(
        finished.exitCode, finished.userLogTail, reason=finished.platformReason,
        message=finished.platformMessage, signal=finished.signal, preamble=False,
    )
    return RuleEngine(default_rules()).classify(exit).spec


def test_this_machine_gives_tasks_cgroups_and_a_mount_namespace(bounded: Harness):
    # What every test below relies on; a machine without them says so at start.
    assert bounded.backend.limits_mode in ("cgroup", "cgroup1")
    assert local_namespaces.probe() is None and bounded.backend.private_mounts


async def test_a_task_cannot_read_another_jobs_command_line(bounded: Harness):
    marker = f"secret-argument-{uuid.uuid4().hex[:8]}"
    victim = launch("victim", f"echo $$ > pid; sleep 30 && echo {marker}")
    await bounded.backend.start(victim)
    await bounded.events.running(victim.key)
    victim_pid = await read_pid(bounded.work_dir(victim.key) / "pid")
    snoop = launch(
        "snoop",
        # (quoted apart so that its own command line does not hold the word)
        f"cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; test -e /proc/{victim_pid} && echo SE''EN || true",
    )
    try:
        finished = await bounded.run(snoop)
    finally:
        await bounded.backend.kill(victim.key, grace_seconds=0, reason="done")
    seen = output(bounded, snoop.key)
    assert finished.exitCode == 0, seen
    assert marker not in seen and "SEEN" not in seen
    assert "cat /proc/" in seen  # it does see its own processes


async def test_processes_of_one_task_together_are_held_to_its_memory(bounded: Harness):
    # Four processes of ~100 MiB each under memoryMB 256: each alone is under
    # the bound (a per-process rlimit lets all four through), together not.
    allocate = f"{PYTHON} -c 'import time; b = b\"x\" * (100 * 1024 * 1024); time.sleep(4)'"
    task = launch("hog", f"for i in 1 2 3 4; do {allocate} & done; wait; echo all-four-ran", memoryMB=256)
    finished = await bounded.run(task)
    assert finished.platformReason == "OOMKilled", output(bounded, task.key)
    assert "all-four-ran" not in output(bounded, task.key)
    assert verdict(finished).phrase == "UserContainerDockerOOMKilled"


async def test_two_busy_loops_under_one_cpu_get_one_cpu(bounded: Harness):
    # The loops spin until the test says stop (not for a fixed time: on a loaded
    # machine the task could end, and its cgroup go back to the pool, before the
    # test reads it).
    loop = "sh -c 'while [ ! -e stop ]; do :; done'"
    task = launch("spinner", "touch started", f"{loop} & {loop} & wait || true", cpu=1, memoryMB=256)
    await bounded.backend.start(task)
    await bounded.events.running(task.key)
    work = bounded.work_dir(task.key)
    for _ in range(200):
        if (work / "started").exists():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    # The kernel held it back: its cgroup's throttling counter, read as root while it runs.
    parents = bounded.backend._cgroup_parents_v1
    throttled = None
    if parents:
        stat = Path(parents[1], task.key.slug, "cpu.stat").read_text()
        throttled = int(dict(line.split() for line in stat.splitlines())["nr_throttled"])
    (work / "stop").touch()
    finished = await bounded.events.finished(task.key)
    assert finished.exitCode == 0, output(bounded, task.key)
    exit = read_task_exit(TaskFiles(str(bounded.backend.tasks_dir / task.key.slug)))
    assert exit is not None and exit.cpuSeconds is not None and exit.startedAt is not None
    ran_for = exit.finishedAt - exit.startedAt
    # Two loops on two cores would use about twice the time they ran for.
    assert exit.cpuSeconds <= 1.0 * ran_for + 0.3, (exit.cpuSeconds, ran_for)
    # The kernel held it back -- unless other work on the machine kept it
    # below one cpu anyway (then the quota had nothing to stop).
    assert throttled is not None
    assert throttled > 0 or exit.cpuSeconds < 0.9 * ran_for, (throttled, exit.cpuSeconds, ran_for)


async def test_a_fork_bomb_stops_at_the_tasks_process_cap(bounded: Harness):
    bomb = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(5); os._exit(0)\n"
        "    made += 1\n"
        "print('made', made, flush=True)\n"
    )
    (bounded.backend.work_root / "bomb.py").write_text(bomb)
    (bounded.backend.work_root / "bomb.py").chmod(0o644)
    task = launch("bomb", f"{PYTHON} {bounded.backend.work_root}/bomb.py")
    finished = await bounded.run(task)
    log = output(bounded, task.key)
    assert finished.exitCode == 0, log
    made = int(log.split("made ")[1].split()[0])
    assert made < PIDS_MAX  # bash and python count too


async def test_shared_memory_is_the_tasks_own_counted_and_gone_after_it(bounded: Harness):
    name = f"pai-shm-{uuid.uuid4().hex[:8]}"
    writer = launch("shm-writer", f"echo secret > /dev/shm/{name}", "touch started", "sleep 30")
    await bounded.backend.start(writer)
    work = bounded.work_dir(writer.key)
    for _ in range(200):
        if (work / "started").exists():
            break
        await asyncio.sleep(0.05)
    reader = launch("shm-reader", f"cat /dev/shm/{name} 2>/dev/null || echo not-there")
    try:
        read = await bounded.run(reader)
        assert read.exitCode == 0
        assert output(bounded, reader.key).strip() == "not-there"  # another job's task: invisible
        assert not Path(f"/dev/shm/{name}").exists()  # nor is it the machine's
    finally:
        await bounded.backend.kill(writer.key, grace_seconds=0, reason="done")
    await bounded.events.finished(writer.key)
    assert not Path(f"/dev/shm/{name}").exists()

    # What it holds counts: no more than the task's memory fits there.
    filler = launch("shm-filler", f"head -c 96M /dev/zero > /dev/shm/{name}", memoryMB=64)
    filled = await bounded.run(filler)
    assert filled.exitCode != 0, output(bounded, filler.key)
    assert not Path(f"/dev/shm/{name}").exists()


@pytest.mark.parametrize(
    "commands",
    [
        ["head -c 64M /dev/zero > big"],  # one file past the bound
        ["for i in 1 2 3 4 5 6 7 8; do head -c 6M /dev/zero > part$i; done", "sleep 20"],  # many small ones
    ],
    ids=["one-file", "many-files"],
)
async def test_writing_past_the_working_directorys_bound_ends_the_task_with_the_disk_exit(
    bounded: Harness, commands: list[str]
):
    task = launch(f"filler-{len(commands)}", *commands)
    finished = await bounded.run(task)
    assert finished.platformReason == "WorkDirQuotaExceeded", (finished, output(bounded, task.key))
    assert f"{WORK_DIR_MB} MiB" in finished.platformMessage
    spec = verdict(finished)
    assert (spec.code, spec.phrase) == (244, "DiskFull")


async def test_a_data_dir_on_dev_shm_is_still_the_tasks_working_directory():
    # A data dir on tmpfs (/dev/shm, as the throughput runs use) lies under what
    # the task's own /dev/shm covers: its working directory is bound back there.
    data = Path(tempfile.mkdtemp(prefix="pai-limits-", dir="/dev/shm"))
    data.chmod(0o711)
    harness = await open_harness(data / "launcher", grace_seconds=1.0, task_user="")
    try:
        assert str(harness.backend.work_root).startswith("/dev/shm/")
        task = launch("on-shm", "cd \"$PAI_WORK_DIR\" && echo kept > here && cat \"$PAI_WORK_DIR/here\" && ls /dev/shm | wc -l")
        finished = await harness.run(task)
        assert finished.exitCode == 0, output(harness, task.key)
        assert output(harness, task.key).split() == ["kept", "1"]  # its own /dev/shm holds only the way back
        assert (harness.work_dir(task.key) / "here").read_text() == "kept\n"
    finally:
        await harness.close()
        shutil.rmtree(data, ignore_errors=True)


async def test_the_platforms_tensorboard_under_tmp_is_there_read_only_for_a_task_that_runs_it(
    monkeypatch: pytest.MonkeyPatch,
):
    # PAI cloned under /tmp (`git clone ... /tmp/x && make test`), its data dir there too:
    # the TensorBoard the launcher gives process tasks lies where a task's own /tmp would
    # hide it. Its directory is writable by anyone here: only the task's read-only bind
    # keeps the task from writing into the platform's virtualenv.
    clone = Path(tempfile.mkdtemp(prefix="pai-clone-", dir="/tmp"))
    clone.chmod(0o711)
    venv = clone / ".venv"
    (venv / "bin").mkdir(parents=True)
    venv.chmod(0o777)
    program = venv / "bin" / "tensorboard"
    program.write_text("#!/bin/sh\necho platform-tensorboard\n")
    program.chmod(0o755)
    monkeypatch.setattr(local, "_platform_tensorboard", lambda: {"PAI_TENSORBOARD": str(program)})
    (clone / "data").mkdir(mode=0o711)
    harness = await open_harness(clone / "data" / "launcher", grace_seconds=1.0, task_user="")
    try:
        assert str(harness.backend.work_root).startswith(f"{clone}/data/")
        # The tensorboard plugin gives its task a `tensorboard` port.
        task = launch("tb-under-tmp", '"$PAI_TENSORBOARD"', f"touch {venv}/written 2>&1 || true",
                      f"grep ' {venv} ' /proc/self/mountinfo", "echo kept > here",
                      ports={"tensorboard": [47123]})
        await harness.backend.start(task)
        running = await harness.events.running(task.key)
        finished = await harness.events.finished(task.key)
        log = output(harness, task.key)
        assert finished.exitCode == 0, log
        ran, refused, mount = log.splitlines()
        assert ran == "platform-tensorboard"
        assert "Read-only file system" in refused and not (venv / "written").exists()
        assert {"ro", "nosuid", "nodev"} <= set(mount.split()[5].split(","))  # the mount's own options
        assert f"the platform's {venv} (read-only)" in running.detail
        assert (harness.work_dir(task.key) / "here").read_text() == "kept\n"  # its working directory still its own

        # A task that runs no TensorBoard keeps a /tmp wholly its own (and _spawn_as's vfork).
        other = launch("no-tb", f"test -e {venv} && echo SE''EN || echo hidden")
        done = await harness.run(other)
        assert done.exitCode == 0 and output(harness, other.key).strip() == "hidden"
    finally:
        await harness.close()
        shutil.rmtree(clone, ignore_errors=True)
