"""The local backend against real processes: start, watch, stop, recover."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
from hypothesis import given, settings, strategies as st

from libs.common.errors import NotFound
from libs.common.messages import TaskPlacement
from services.launcher.backends import local as local_backend
from services.launcher.backends.local import LocalBackend
from services.launcher.backends.local_doorbell import FINISHED_BELL, Doorbell
from services.launcher.backends.local_layout import (
    LEGACY_EXIT,
    LEGACY_REPORTED,
    LEGACY_SPEC,
    OUTPUT_LOG,
    STDERR_LOG,
    ShimSpec,
    TaskFiles,
    read_task_spec,
)
from services.launcher.backends.local_logs import CappedLog, read_log
from services.launcher.backends.local_shim import BASH
from services.launcher.core.tasks import (
    BackendEvent,
    TaskFinished,
    TaskKey,
    TaskLaunch,
    TaskRunning,
)

REPO = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 15.0


# -- builders and helpers ------------------------------------------------------


def launch(name: str, *commands: str, index: int = 0, node: str = "node-a", **fields) -> TaskLaunch:
    key = TaskKey(job=f"alice~{name}", attempt=0, role="worker", index=index)
    return TaskLaunch(
        key=key,
        vc="default",
        user="alice",
        placement=TaskPlacement(role="worker", index=index, node=node),
        commands=list(commands),
        env=fields.pop("env", {}),
        **fields,
    )


class Events:
    """Collects a backend's events so a test can wait for the ones it cares about."""

    def __init__(self, backend: LocalBackend):
        self.seen: list[BackendEvent] = []
        self._changed = asyncio.Condition()
        self._pump = asyncio.create_task(self._collect(backend))

    async def _collect(self, backend: LocalBackend) -> None:
        async for event in backend.events():
            async with self._changed:
                self.seen.append(event)
                self._changed.notify_all()

    async def wait_for(self, matches: Callable[[BackendEvent], bool]) -> BackendEvent:
        async def first_match() -> BackendEvent:
            async with self._changed:
                while True:
                    for event in self.seen:
                        if matches(event):
                            return event
                    await self._changed.wait()

        return await asyncio.wait_for(first_match(), WAIT_SECONDS)

    async def running(self, key: TaskKey) -> TaskRunning:
        return await self.wait_for(lambda e: isinstance(e, TaskRunning) and e.key == key)

    async def finished(self, key: TaskKey) -> TaskFinished:
        return await self.wait_for(lambda e: isinstance(e, TaskFinished) and e.key == key)

    def of(self, key: TaskKey) -> list[BackendEvent]:
        return [event for event in self.seen if event.key == key]

    async def stop(self) -> None:
        self._pump.cancel()
        try:
            await self._pump
        except asyncio.CancelledError:
            pass


def is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def read_pid(path: Path) -> int:
    """A pid a task wrote to a file (tasks write them as they start)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


async def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


def task_file(backend: LocalBackend, key: TaskKey, name: str) -> Path:
    """The task's file `name` (OUTPUT_LOG, ...), beside its record."""
    return Path(TaskFiles(str(backend.tasks_dir / key.slug)).beside(name))


def shim_pid(backend: LocalBackend, key: TaskKey) -> int:
    spec = read_task_spec(TaskFiles(str(backend.tasks_dir / key.slug)), ShimSpec)
    assert spec is not None and spec.shim is not None
    return spec.shim.shimPid


class Harness:
    def __init__(self, backend: LocalBackend):
        self.backend = backend
        self.events = Events(backend)

    def work_dir(self, key: TaskKey) -> Path:
        return self.backend.work_root / key.slug

    async def run(self, task: TaskLaunch) -> TaskFinished:
        await self.backend.start(task)
        return await self.events.finished(task.key)

    async def close(self) -> None:
        await self.backend.close()
        await self.events.stop()


async def open_harness(data_dir: Path, **options) -> Harness:
    options.setdefault("sweep_interval_seconds", 0.2)
    backend = LocalBackend(data_dir, **options)
    await backend.recover()
    return Harness(backend)


@pytest_asyncio.fixture(scope="module")
async def local(tmp_path_factory: pytest.TempPathFactory):
    harness = await open_harness(
        tmp_path_factory.mktemp("local"), node_names=["node-a", "node-b"], grace_seconds=2.0
    )
    yield harness
    await harness.close()


# -- running tasks ---------------------------------------------------------------


async def test_a_task_runs_in_its_work_dir_and_its_files_stay(local: Harness):
    task = launch("writes-file", 'echo "made by PAI" > made.txt', 'test "$PWD" = "$PAI_WORK_DIR"')

    finished = await local.run(task)

    assert finished.exitCode == 0 and finished.signal is None and finished.platformReason == ""
    assert (local.work_dir(task.key) / "made.txt").read_text() == "made by PAI\n"
    kinds = [type(event) for event in local.events.of(task.key)]
    assert kinds == [TaskRunning, TaskFinished]


async def test_the_task_sees_the_launch_env_and_only_basics_of_the_launchers(
    local: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("LAUNCHER_ONLY_SECRET", "must-not-leak")
    monkeypatch.delenv("SHELL", raising=False)  # as under systemd or in a container
    probe = await open_harness(tmp_path, limits="none")
    try:
        task = launch(
            "env",
            "env > env.txt",
            env={"PAI_JOB_NAME": "env", "CUDA_VISIBLE_DEVICES": "0,1", "PAI_TASK_ROLE_LIST": "worker"},
        )
        finished = await probe.run(task)
        text = (probe.work_dir(task.key) / "env.txt").read_text()
    finally:
        await probe.close()

    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert finished.exitCode == 0
    assert env["PAI_JOB_NAME"] == "env"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PAI_TASK_ROLE_LIST"] == "worker"
    assert env["PAI_TASK_KEY"] == task.key.slug
    assert env["PAI_WORK_DIR"] == str(probe.work_dir(task.key))
    assert env["PATH"]
    assert env["SHELL"] == BASH  # the shell the task runs in
    assert "LAUNCHER_ONLY_SECRET" not in env


@pytest.mark.parametrize(
    ("commands", "exit_code", "signal_number"),
    [
        (["true"], 0, None),
        (["exit 3"], 3, None),
        (["false", "echo never reached"], 1, None),
        (["no-such-command-in-pai"], 127, None),
        (["kill -TERM $$"], 128 + signal.SIGTERM, signal.SIGTERM),
        (["kill -KILL $$"], 128 + signal.SIGKILL, signal.SIGKILL),
    ],
    ids=["success", "exit-3", "stops-at-first-failure", "command-not-found", "sigterm", "sigkill"],
)
async def test_exit_code_and_signal_are_reported(
    local: Harness, commands: list[str], exit_code: int, signal_number: int | None
):
    name = f"exit-{exit_code}-{len(commands)}"
    finished = await local.run(launch(name, *commands))

    assert (finished.exitCode, finished.signal) == (exit_code, signal_number)
    assert "never reached" not in finished.userLogTail


async def test_a_malformed_finished_bell_neither_ends_a_task_early_nor_stops_the_backend(local: Harness):
    """Anything on this machine can write to the abstract doorbell socket: a bell
    saying a task finished, with a record that is cut short or none at all, is
    checked against the exit recorded in its record, which it does not have yet."""
    task = launch("bell-forged", "sleep 1.5", "exit 4")
    await local.backend.start(task)
    await local.events.running(task.key)
    slug = task.key.slug.encode()
    forger = Doorbell(local.backend._doorbell)
    for forged in (b'\n{"exitCode": 0, "finishedAt"', b"", b"\n\xff\xfe"):
        forger.ring(FINISHED_BELL + slug + forged)
        forger.flush()
    await asyncio.sleep(0.1)
    assert not [event for event in local.events.of(task.key) if isinstance(event, TaskFinished)]

    finished = await local.events.finished(task.key)

    assert finished.exitCode == 4


async def test_the_log_tail_comes_with_the_exit_and_the_log_can_be_read(local: Harness):
    task = launch(
        "log-tail",
        "for i in $(seq 1 3000); do echo \"line $i of the job's output, padded to be long\"; done",
        "echo 'Traceback: something broke' >&2",
        "exit 1",
    )

    finished = await local.run(task)
    full = await local.backend.read_log(task.key)
    tail = await local.backend.read_log(task.key, tail_bytes=27)

    assert len(full) > 64 * 1024
    assert full.startswith(b"line 1 of")
    assert len(finished.userLogTail.encode()) <= 64 * 1024
    assert finished.userLogTail.endswith("Traceback: something broke\n")
    assert full.endswith(finished.userLogTail.encode())
    assert tail == b"Traceback: something broke\n"
    assert Path(finished.logPath).read_bytes() == full
    assert task_file(local.backend, task.key, STDERR_LOG).read_text() == "Traceback: something broke\n"


async def test_a_capped_log_keeps_its_end(tmp_path: Path):
    cap = 64 * 1024
    harness = await open_harness(tmp_path, log_cap_bytes=cap, limits="none")
    task = launch("chatty", "for i in $(seq 1 20000); do echo \"output line $i\"; done", "echo LAST LINE")
    try:
        finished = await harness.run(task)
        log = await harness.backend.read_log(task.key)
    finally:
        await harness.close()

    logs = harness.backend.tasks_dir.glob(f"{task.key.slug}.{OUTPUT_LOG}*")
    on_disk = sum(path.stat().st_size for path in logs if path.suffix != ".dropped")
    assert finished.exitCode == 0
    assert on_disk <= cap
    assert log.startswith(b"[PAI: log capped at 65536 bytes;")
    assert b"output line 1\n" not in log
    assert log.endswith(b"output line 20000\nLAST LINE\n")
    kept = log.split(b"\n", 1)[1]
    assert len(kept) >= cap // 2


async def test_the_task_is_placed_on_the_declared_node_it_was_given(local: Harness):
    task = launch("on-node-b", "true", node="node-b", dockerImageUri="openpai/standard:python_3.6")
    await local.backend.start(task)

    running = await local.events.running(task.key)

    assert running.node == "node-b"
    assert "dockerImage openpai/standard:python_3.6 ignored" in running.detail
    assert local.backend.node_names == ["node-a", "node-b"]


async def test_starting_a_task_twice_runs_it_once(local: Harness):
    task = launch("twice", "echo ran >> runs.txt")

    await local.backend.start(task)
    await local.backend.start(task)
    await local.events.finished(task.key)
    await local.backend.start(task)  # also after it ended
    await asyncio.sleep(0.3)

    assert (local.work_dir(task.key) / "runs.txt").read_text() == "ran\n"
    assert [type(e) for e in local.events.of(task.key)] == [TaskRunning, TaskFinished]


async def test_reading_the_log_of_an_unknown_task_is_not_found(local: Harness):
    with pytest.raises(NotFound):
        await local.backend.read_log(launch("never-started", "true").key)


# -- stopping tasks --------------------------------------------------------------

STUBBORN_FAMILY = [
    # a child that ignores SIGTERM
    "bash -c 'trap \"\" TERM; echo $$ > stubborn.pid; while true; do sleep 0.05; done' &",
    # a grandchild in its own session, its parent still alive
    "setsid bash -c 'trap \"\" TERM; echo $$ > escaped.pid; while true; do sleep 0.05; done' &",
    # one in its own session whose parent exits at once: an orphan
    "(setsid bash -c 'trap \"\" TERM; echo $$ > orphan.pid; exec sleep 300' &)",
    "trap '' TERM",
    "while true; do sleep 0.05; done",
]


async def test_a_stop_ends_every_process_of_the_task_even_stubborn_and_detached_ones(local: Harness):
    task = launch("stubborn", *STUBBORN_FAMILY)
    await local.backend.start(task)
    work = local.work_dir(task.key)
    pids = [await read_pid(work / name) for name in ("stubborn.pid", "escaped.pid", "orphan.pid")]
    assert all(is_running(pid) for pid in pids)

    await local.backend.kill(task.key, grace_seconds=0.3, reason="Preempted")
    finished = await local.events.finished(task.key)

    assert finished.platformReason == "Preempted"
    assert finished.signal == signal.SIGKILL and finished.exitCode == 128 + signal.SIGKILL
    assert "SIGKILL after 0.3s" in finished.platformMessage
    assert [pid for pid in pids if is_running(pid)] == []


async def test_a_stop_that_sigterm_suffices_for_is_not_escalated(local: Harness):
    task = launch("polite", "sleep 300")
    await local.backend.start(task)
    await local.events.running(task.key)

    await local.backend.kill(task.key, grace_seconds=5, reason="")
    finished = await local.events.finished(task.key)

    assert (finished.exitCode, finished.signal) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert (finished.platformReason, finished.platformMessage) == ("Killed", "stopped: SIGTERM")


async def test_processes_left_behind_by_a_task_that_exited_are_ended(local: Harness):
    task = launch(
        "leaves-children",
        "sleep 300 & echo $! > background.pid",
        "(setsid sleep 300 & echo $! > detached.pid)",
        "exit 0",
    )

    finished = await local.run(task)

    work = local.work_dir(task.key)
    pids = [int((work / name).read_text()) for name in ("background.pid", "detached.pid")]
    assert finished.exitCode == 0 and finished.platformReason == ""
    assert [pid for pid in pids if is_running(pid)] == []


async def test_stopping_unknown_or_finished_tasks_is_harmless(local: Harness):
    done = launch("done-before-stop", "true")
    await local.run(done)

    await local.backend.kill(launch("no-such-task", "true").key, grace_seconds=1, reason="Killed")
    await local.backend.kill(done.key, grace_seconds=1, reason="Killed")

    assert [type(e) for e in local.events.of(done.key)] == [TaskRunning, TaskFinished]


async def test_a_stop_before_any_shim_took_the_task_cancels_it(local: Harness):
    task = launch("cancelled", "echo ran > ran.txt")
    fork_server = local.backend._server
    assert fork_server is not None
    fork_server.send_signal(signal.SIGSTOP)  # hold the shims back
    try:
        await local.backend.start(task)
        await local.backend.kill(task.key, grace_seconds=1, reason="UserStop")
    finally:
        fork_server.send_signal(signal.SIGCONT)
    finished = await local.events.finished(task.key)
    await asyncio.sleep(0.3)  # time for a shim to (wrongly) run it

    assert finished.platformReason == "UserStop"
    assert finished.platformMessage == "stopped before it started"
    assert not (local.work_dir(task.key) / "ran.txt").exists()
    assert [type(e) for e in local.events.of(task.key)] == [TaskFinished]


async def test_tasks_sharing_a_shim_are_stopped_and_reported_one_by_one(local: Harness):
    # A burst: the fork server finds all five waiting and gives them one shim.
    burst = [launch("burst", f"echo task {i}", f"sleep {0.3 + i * 0.1}", f"exit {i}", index=i) for i in range(4)]
    stopped = launch("burst", "echo task 4", "sleep 300", index=4)
    fork_server = local.backend._server
    assert fork_server is not None
    fork_server.send_signal(signal.SIGSTOP)
    try:
        for task in [*burst, stopped]:
            await local.backend.start(task)
    finally:
        fork_server.send_signal(signal.SIGCONT)
    await local.events.running(stopped.key)

    await local.backend.kill(stopped.key, grace_seconds=1, reason="Preempted")
    results = [await local.events.finished(task.key) for task in burst]
    stop = await local.events.finished(stopped.key)

    assert len({shim_pid(local.backend, t.key) for t in [*burst, stopped]}) == 1
    assert [(r.exitCode, r.userLogTail) for r in results] == [(i, f"task {i}\n") for i in range(4)]
    assert (stop.platformReason, stop.signal) == ("Preempted", signal.SIGTERM)


async def test_a_task_that_ends_beside_a_chatty_one_of_its_shim_is_reported_at_once(local: Harness):
    # The chatty task's output wakes the shim all the time: the other's exit
    # must still be noticed (the shim reaps on SIGCHLD, not on every wakeup).
    chatty = launch("chatty", "while :; do echo output; done", index=0)
    quiet = launch("chatty", "sleep 0.3", "exit 3", index=1)
    fork_server = local.backend._server
    assert fork_server is not None
    fork_server.send_signal(signal.SIGSTOP)  # both in one batch: one shim
    try:
        await local.backend.start(chatty)
        await local.backend.start(quiet)
    finally:
        fork_server.send_signal(signal.SIGCONT)

    finished = await local.events.finished(quiet.key)

    assert shim_pid(local.backend, chatty.key) == shim_pid(local.backend, quiet.key)
    assert finished.exitCode == 3
    assert not any(isinstance(e, TaskFinished) for e in local.events.of(chatty.key))
    await local.backend.kill(chatty.key, grace_seconds=1, reason="Killed")
    assert (await local.events.finished(chatty.key)).platformReason == "Killed"


async def test_a_task_handed_to_a_fork_server_that_died_still_runs_once(local: Harness):
    task = launch("resent", "echo ran >> runs.txt")
    fork_server = local.backend._server
    assert fork_server is not None
    fork_server.send_signal(signal.SIGSTOP)
    await local.backend.start(task)  # its spec waits, unread, in the dead server's pipe
    fork_server.send_signal(signal.SIGKILL)

    finished = await local.events.finished(task.key)

    assert finished.exitCode == 0
    assert (local.work_dir(task.key) / "runs.txt").read_text() == "ran\n"
    assert local.backend._server is not fork_server


async def test_tasks_started_one_after_another_share_a_shim_while_it_is_fed(tmp_path: Path):
    harness = await open_harness(tmp_path / "fed", shim_feed_seconds=1.0)
    first, second, after = (launch("fed", f"echo {i}", "sleep 0.2", index=i) for i in range(3))
    try:
        assert (await harness.run(first)).exitCode == 0
        assert (await harness.run(second)).exitCode == 0  # started alone, after the first ended
        fed = shim_pid(harness.backend, first.key)
        await wait_until(lambda: not is_running(fed))  # its feed closed: it ended, having no task
        assert (await harness.run(after)).exitCode == 0
    finally:
        await harness.close()
    assert shim_pid(harness.backend, second.key) == fed
    assert shim_pid(harness.backend, after.key) != fed


async def test_without_a_feed_each_task_started_alone_gets_a_shim(tmp_path: Path):
    harness = await open_harness(tmp_path / "unfed", shim_feed_seconds=0)
    tasks = [launch("unfed", "true", index=i) for i in range(2)]
    try:
        for task in tasks:
            assert (await harness.run(task)).exitCode == 0
    finally:
        await harness.close()
    assert shim_pid(harness.backend, tasks[0].key) != shim_pid(harness.backend, tasks[1].key)


async def test_a_task_sent_to_a_shim_that_died_before_reading_it_is_sent_again_and_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(local_backend, "RESEND_SECONDS", 0.5)
    harness = await open_harness(tmp_path / "resend", shim_feed_seconds=60)
    holder = launch("holder", "sleep 300")
    lost = launch("lost-in-feed", "echo ran >> runs.txt")
    try:
        await harness.backend.start(holder)
        await harness.events.running(holder.key)
        fed = shim_pid(harness.backend, holder.key)
        os.kill(fed, signal.SIGSTOP)
        await harness.backend.start(lost)  # its line waits, unread, in the stopped shim's feed
        await asyncio.sleep(0.2)
        os.kill(fed, signal.SIGKILL)
        finished = await harness.events.finished(lost.key)
        lost_holder = await harness.events.finished(holder.key)
    finally:
        await harness.close()
    assert finished.exitCode == 0
    assert (harness.work_dir(lost.key) / "runs.txt").read_text() == "ran\n"
    assert shim_pid(harness.backend, lost.key) != fed
    assert lost_holder.platformReason == "Lost"


# -- limits ----------------------------------------------------------------------

ALLOCATE_200_MB = f"{sys.executable} -c 'bytearray(200 * 1024 * 1024)'"


@pytest.mark.parametrize(
    ("limits", "detail", "exit_code"),
    [
        ("rlimit", "limits: rlimit (RLIMIT_DATA 64 MiB per process; cpu not bounded)", 1),
        ("none", "limits: none", 0),
    ],
    ids=["rlimit-bounds-memory", "none-bounds-nothing"],
)
async def test_memory_bounds_are_applied_and_reported(
    tmp_path: Path, limits: str, detail: str, exit_code: int
):
    harness = await open_harness(tmp_path, limits=limits)
    task = launch("allocates", ALLOCATE_200_MB, memoryMB=64)
    try:
        await harness.backend.start(task)
        running = await harness.events.running(task.key)
        finished = await harness.events.finished(task.key)
    finally:
        await harness.close()

    assert running.detail.startswith(detail)  # then what the task is isolated by
    assert finished.exitCode == exit_code
    assert ("MemoryError" in finished.userLogTail) == (exit_code != 0)


async def test_automatic_limits_say_what_is_in_force(local: Harness):
    task = launch("limits-auto", "true")
    await local.backend.start(task)

    running = await local.events.running(task.key)

    assert local.backend.limits_mode in ("cgroup", "cgroup1", "rlimit")
    assert running.detail.startswith(
        {"cgroup": "limits: cgroup v2", "cgroup1": "limits: cgroup v1", "rlimit": "limits: rlimit"}[
            local.backend.limits_mode
        ]
    )


async def test_without_cgroup_v2_auto_falls_back_and_cgroup_is_refused(tmp_path: Path):
    no_cgroups = tmp_path / "no-cgroupfs"
    no_cgroups.mkdir()

    assert LocalBackend(tmp_path / "a", cgroup_root=no_cgroups).limits_mode == "rlimit"
    with pytest.raises(RuntimeError, match="cgroup limits were asked for"):
        LocalBackend(tmp_path / "b", limits="cgroup", cgroup_root=no_cgroups)


async def test_a_cgroup_per_task_gets_the_tasks_cpu_and_memory(tmp_path: Path):
    # A stand-in for a delegated cgroup2 directory: the kernel does not enforce
    # anything here, but the files the task's cgroup is given are checked.
    parent = tmp_path / "pai.slice"
    parent.mkdir()
    (parent / "cgroup.subtree_control").write_text("")
    harness = await open_harness(tmp_path / "data", limits="cgroup", cgroup_parent=parent)
    task = launch("in-cgroup", "true", cpu=2, memoryMB=128)
    try:
        await harness.backend.start(task)
        running = await harness.events.running(task.key)
        finished = await harness.events.finished(task.key)
    finally:
        await harness.close()

    cgroup = parent / task.key.slug
    assert running.detail.startswith("limits: cgroup v2 (cpu.max 2 cpu, memory.max 128 MiB, whole task)")
    assert finished.exitCode == 0
    assert (cgroup / "cpu.max").read_text() == "200000 100000"
    assert (cgroup / "memory.max").read_text() == str(128 * 1024 * 1024)
    assert (cgroup / "cgroup.procs").read_text().strip().isdigit()  # the task joined it


# -- recovery --------------------------------------------------------------------


async def test_a_new_backend_recovers_running_ended_and_lost_tasks(tmp_path: Path):
    first = await open_harness(tmp_path, shim_feed_seconds=0)  # a shim per task started alone
    running_on = launch("keeps-running", "sleep 1.5", "exit 7")
    ends_meanwhile = launch("ends-meanwhile", "sleep 0.2", "echo finished while down", "exit 5")
    shim_dies = launch("shim-dies", "echo $$ > task.pid", "sleep 300")
    for task in (running_on, ends_meanwhile, shim_dies):
        await first.backend.start(task)
        await first.events.running(task.key)  # one shim each
    task_pid = await read_pid(first.work_dir(shim_dies.key) / "task.pid")
    await first.close()  # the launcher goes away; its tasks do not
    os.kill(shim_pid(first.backend, shim_dies.key), signal.SIGKILL)
    await asyncio.sleep(0.5)

    second = await open_harness(tmp_path)
    try:
        known = await second.backend.recover()
        ended = await second.events.finished(ends_meanwhile.key)
        lost = await second.events.finished(shim_dies.key)
        readopted = await second.events.running(running_on.key)
        later = await second.events.finished(running_on.key)
    finally:
        await second.close()

    assert set(known) >= {running_on.key, ends_meanwhile.key, shim_dies.key}
    assert (ended.exitCode, ended.userLogTail) == (5, "finished while down\n")
    assert lost.platformReason == "Lost" and lost.exitCode == -1
    assert not is_running(task_pid)
    assert readopted.detail.startswith("limits: ")
    assert later.exitCode == 7


async def test_a_shim_killed_while_the_backend_runs_is_reported_lost(local: Harness):
    task = launch("shim-killed", "echo $$ > task.pid", "sleep 300")
    await local.backend.start(task)
    await local.events.running(task.key)
    task_pid = await read_pid(local.work_dir(task.key) / "task.pid")

    os.kill(shim_pid(local.backend, task.key), signal.SIGKILL)
    finished = await local.events.finished(task.key)

    assert finished.platformReason == "Lost"
    await wait_until(lambda: not is_running(task_pid))


LAUNCHER_THAT_CRASHES = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from libs.common.messages import TaskPlacement
    from services.launcher.core.tasks import TaskKey, TaskLaunch, TaskRunning
    from services.launcher.backends.local import LocalBackend

    async def main():
        backend = LocalBackend(Path(sys.argv[1]))
        key = TaskKey(job="alice~survivor", attempt=0, role="worker", index=0)
        await backend.start(TaskLaunch(
            key=key, vc="default", user="alice",
            placement=TaskPlacement(role="worker", index=0, node="node-a"),
            commands=["sleep 1", "echo survived", "exit 4"], env={},
        ))
        async for event in backend.events():
            if isinstance(event, TaskRunning):
                print("running", flush=True)
                await asyncio.sleep(300)

    asyncio.run(main())
    """
)


async def test_a_task_survives_a_launcher_killed_with_sigkill(tmp_path: Path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER_THAT_CRASHES, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(launcher.stdout.readline), WAIT_SECONDS)
        assert line == "running\n"
    finally:
        launcher.kill()
        launcher.wait()

    harness = await open_harness(tmp_path)
    key = launch("survivor").key
    try:
        finished = await harness.events.finished(key)
    finally:
        await harness.close()

    assert (finished.exitCode, finished.userLogTail) == (4, "survived\n")


async def test_a_forgotten_task_is_not_reported_again_but_keeps_its_log(tmp_path: Path):
    first = await open_harness(tmp_path)
    task = launch("forgotten", "echo kept")
    await first.run(task)
    await first.backend.forget(task.key)
    await first.close()

    second = await open_harness(tmp_path)
    try:
        known = await second.backend.recover()
        log = await second.backend.read_log(task.key)
        await asyncio.sleep(0.3)
    finally:
        await second.close()

    assert task.key not in known
    assert second.events.of(task.key) == []
    assert log == b"kept\n"


def as_old_directory(record: Path, *, exit_in_own_file: bool = False, reported: bool = False) -> None:
    """Turn a task's record and logs into the directory that launchers before
    single-file records kept: spec.json (reported.json once reported), exit.json
    before exits were appended, and the logs inside."""
    spec_line, _, exit_line = record.read_bytes().partition(b"\n")
    exit_line = exit_line.strip().split(b"\n")[0]
    logs = {name: Path(TaskFiles(str(record)).beside(name)) for name in (OUTPUT_LOG, STDERR_LOG)}
    record.unlink()
    record.mkdir()
    (record / (LEGACY_REPORTED if reported else LEGACY_SPEC)).write_bytes(
        spec_line if exit_in_own_file else spec_line + b"\n" + exit_line + b"\n")
    if exit_in_own_file:
        (record / LEGACY_EXIT).write_bytes(exit_line)
    for name, path in logs.items():
        if path.exists():
            path.rename(record / name)


@pytest.mark.parametrize("exit_in_own_file", [False, True], ids=["exit-appended", "exit-json"])
async def test_a_task_that_ended_under_a_previous_layout_is_reported_with_its_exit(tmp_path: Path,
                                                                                   exit_in_own_file: bool):
    """Launchers before single-file records kept a directory per task, and their
    shims, which outlive them, wrote the exit into it (into exit.json before
    exits were appended): a task that ended that way while the launcher was
    being upgraded is reported with its real exit and log."""
    first = await open_harness(tmp_path)
    task = launch("old-layout", "echo from before", "exit 6")
    await first.run(task)
    await first.close()
    as_old_directory(first.backend.tasks_dir / task.key.slug, exit_in_own_file=exit_in_own_file)

    second = await open_harness(tmp_path)
    try:
        finished = await second.events.finished(task.key)
        log = await second.backend.read_log(task.key)
        await second.backend.forget(task.key)
    finally:
        await second.close()

    assert (finished.exitCode, finished.userLogTail, log) == (6, "from before\n", b"from before\n")
    assert (first.backend.tasks_dir / task.key.slug / LEGACY_REPORTED).exists()


async def test_a_task_reported_under_the_previous_layout_stays_reported_until_pruned(tmp_path: Path):
    first = await open_harness(tmp_path)
    task = launch("old-reported", "echo kept")
    await first.run(task)
    await first.close()
    old_dir = first.backend.tasks_dir / task.key.slug
    as_old_directory(old_dir, reported=True)

    second = await open_harness(tmp_path)
    try:
        known = await second.backend.recover()
        log = await second.backend.read_log(task.key)
        await asyncio.sleep(0.3)
        pruned = await second.backend.prune(task.key)
    finally:
        await second.close()

    assert task.key not in known and second.events.of(task.key) == []
    assert log == b"kept\n"
    assert pruned and not old_dir.exists()


async def test_one_data_dir_serves_one_launcher(local: Harness):
    intruder = LocalBackend(local.backend.data_dir)

    with pytest.raises(RuntimeError, match="in use by another PAI launcher"):
        await intruder.recover()


# -- capped log files (property) ---------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(min_value=2, max_value=512),
    chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=40),
)
def test_a_capped_log_never_exceeds_its_cap_and_keeps_a_suffix(
    tmp_path_factory: pytest.TempPathFactory, cap: int, chunks: list[bytes]
):
    path = tmp_path_factory.mktemp("capped") / "output.log"
    log = CappedLog(path, cap)
    for chunk in chunks:
        log.write(chunk)
    log.close()

    everything = b"".join(chunks)
    kept = read_log(path, cap_bytes=cap, tail_bytes=len(everything) + 1)
    on_disk = sum(p.stat().st_size for p in path.parent.glob("output.log*") if p.suffix != ".dropped")
    assert on_disk <= cap
    assert everything.endswith(kept)
    assert len(kept) >= min(len(everything), cap // 2)
    assert log.dropped_bytes == len(everything) - len(kept)
