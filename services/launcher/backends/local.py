"""The local backend: every task instance is a process group on this machine.

How a task runs (see local_layout for the files, local_shim for the shim):
- `start` creates the task directory (mkdir fails if it exists, so a key is
  started at most once, also across launcher restarts) and writes spec.json. A
  fork server (our child) forks a shim for it; the shim claims the directory
  and runs the commands, joined by newlines, as `bash --noprofile --norc -e -c`
  in a new session (one command after another, stopping at the first that
  fails, with bash's errexit rules, like a CI step), in `work/`, with stdin
  from /dev/null.
- Environment: PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ and
  TMPDIR from the launcher (PATH defaults to the usual system one), then
  `launch.env` (PAI_*, CUDA_VISIBLE_DEVICES), then PAI_WORK_DIR (the task's
  working directory) and PAI_TASK_KEY (the task's slug, which marks its
  processes).
- Logs: `output.log` (stdout and stderr interleaved as they arrive) and
  `stderr.log`, each capped at `log_cap_bytes` keeping the newest output
  (local_logs). TaskFinished carries the last 64 KiB of output.log.
- Bounds: cgroup v2 where allowed, else RLIMIT_DATA, else none (local_limits);
  TaskRunning.detail says which ("limits: ...").
- Stop: `kill` leaves an order (reason, grace) in the directory and signals the
  shim, which sends SIGTERM to every process of the task (its group, its
  cgroup, and every descendant, including those that called setsid), and
  SIGKILL to whatever is left after the grace period. The order survives a
  launcher crash. Its TaskFinished carries the given reason ("Killed" by
  default) as platformReason. A stop that comes before the task was claimed
  cancels it: it never starts.
- Events: shims ring an abstract unix datagram socket when a task runs and
  when it ended; a sweep (every `sweep_interval_seconds`) catches a missed
  ring, re-sends tasks no shim claimed, and notices dead shims.
- Restart: the shims do not depend on the launcher. `recover` re-adopts tasks
  whose shim lives (re-sending their TaskRunning), reports tasks that ended
  meanwhile with their real exit, and reports a task whose shim died without
  writing exit.json as platformReason "Lost" after killing what is left of it
  (nobody could report its exit otherwise). Until `forget`, a task is reported
  again after every restart.
- Exit codes: a task killed by signal N exits 128+N with `signal` set; a task
  that never ran or was lost has exit code -1 and a platformReason
  ("LaunchFailed", "Lost", or the stop reason).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from libs.common.errors import NotFound
from services.launcher.backends import local_limits, local_procs
from services.launcher.backends.base import (
    BackendEvent,
    TaskFinished,
    TaskKey,
    TaskLaunch,
    TaskRunning,
)
from services.launcher.backends.local_layout import (
    EXIT,
    FINISHED_BELL,
    KILL,
    LIMITS_CGROUP,
    LIMITS_NONE,
    LIMITS_RLIMIT,
    OUTPUT_LOG,
    REPORTED,
    RUNNING_BELL,
    SHIM,
    SPEC,
    TASK_KEY_ENV,
    TASKS_DIR,
    UNKNOWN_EXIT_CODE,
    WORK,
    WORK_DIR_ENV,
    ExitRecord,
    KillRequest,
    ShimRecord,
    ShimSpec,
    claim,
    doorbell_address,
    doorbell_name,
    encode,
    read_record,
    write_replacing,
)
from services.launcher.backends.local_logs import read_log

log = logging.getLogger(__name__)

MIB = 1024 * 1024
USER_LOG_TAIL_BYTES = 64 * 1024
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIMIT_CHOICES = ("auto", LIMITS_CGROUP, LIMITS_RLIMIT, LIMITS_NONE)
# A task no shim has claimed this long after it was sent is sent again (the
# fork server may have died); the claim makes a duplicate harmless.
RESEND_SECONDS = 2.0
# How long past the grace period `kill` trusts the shim to finish a stop.
STOP_MARGIN_SECONDS = 5.0
_STOP_POLL_SECONDS = 0.05
# A claim (shim.json) still empty after this long belongs to a shim that died
# between creating and writing it.
CLAIM_WRITE_SECONDS = 10.0
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


class TaskSpec(ShimSpec, frozen=True, kw_only=True):
    """spec.json as the backend writes it: the shim's part plus what recovery needs."""

    key: TaskKey
    node: str
    gpu: int = 0
    ports: dict[str, list[int]] = {}
    dockerImageUri: str | None = None
    submittedAt: float = 0.0


class _Task:
    __slots__ = ("key", "dir", "node", "image", "running_reported", "finished", "sent_at", "shim")

    def __init__(self, key: TaskKey, task_dir: Path, node: str, image: str | None):
        self.key = key
        self.dir = task_dir
        self.node = node
        self.image = image
        self.running_reported = False
        self.finished = asyncio.Event()
        self.sent_at = float("-inf")
        self.shim: ShimRecord | None = None  # cached once the task runs


class LocalBackend:
    """Runs task instances as local process groups; see the module docstring."""

    name = "local"

    def __init__(
        self,
        data_dir: Path,
        *,
        node_names: list[str] | None = None,
        log_cap_bytes: int = 64 * MIB,
        grace_seconds: float = 10.0,
        limits: str = "auto",
        cgroup_parent: Path | None = None,
        cgroup_root: Path = local_limits.CGROUP_ROOT,
        sweep_interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ):
        if limits not in LIMIT_CHOICES:
            raise ValueError(f"limits must be one of {LIMIT_CHOICES}, not {limits!r}")
        self.data_dir = Path(data_dir)
        self.tasks_dir = self.data_dir / TASKS_DIR
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        # Every declared node maps onto this machine; placements name any of them.
        self.node_names = list(node_names or [socket.gethostname()])
        self.log_cap_bytes = log_cap_bytes
        self.grace_seconds = grace_seconds
        self.sweep_interval_seconds = sweep_interval_seconds
        self._clock = clock
        self.limits_mode, self._cgroup_parent = _choose_limits(limits, cgroup_root, cgroup_parent)
        self._doorbell = doorbell_name(self.data_dir)
        self._tasks: dict[str, _Task] = {}
        self._queue: asyncio.Queue[BackendEvent | None] = asyncio.Queue()
        self._base_env = _inherited_env()
        self._bell: socket.socket | None = None
        self._server: asyncio.subprocess.Process | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    # -- Backend -------------------------------------------------------------

    async def recover(self) -> list[TaskKey]:
        await self._ensure_running()
        known = []
        for entry in sorted(os.scandir(self.tasks_dir), key=lambda e: e.name):
            task_dir = Path(entry.path)
            if (task_dir / REPORTED).exists():
                continue
            task = self._tasks.get(entry.name) or self._adopt(task_dir)
            if task is not None:
                known.append(task.key)
                self._check(task, time.monotonic())
        return known

    async def start(self, launch: TaskLaunch) -> None:
        await self._ensure_running()
        slug = launch.key.slug
        if slug in self._tasks:
            return
        task_dir = self.tasks_dir / slug
        try:
            task_dir.mkdir()
        except FileExistsError:
            return  # started before, perhaps by an earlier launcher: never twice
        node = launch.placement.node or self.node_names[0]
        spec = TaskSpec(
            key=launch.key,
            slug=slug,
            node=node,
            commands=launch.commands,
            env=self._task_env(launch, task_dir),
            cpu=launch.cpu,
            memoryMB=launch.memoryMB,
            gpu=launch.gpu,
            ports=launch.ports,
            limits=self.limits_mode,
            cgroupParent=str(self._cgroup_parent or ""),
            graceSeconds=self.grace_seconds,
            logCapBytes=self.log_cap_bytes,
            dockerImageUri=launch.dockerImageUri,
            submittedAt=self._clock(),
        )
        # One write: a crash before it completes leaves a directory without a
        # readable spec, which no shim starts and `recover` removes.
        (task_dir / SPEC).write_bytes(encode(spec))
        task = _Task(launch.key, task_dir, node, launch.dockerImageUri)
        self._tasks[slug] = task
        self._send(task)
        # Let the doorbell be read between starts: shims wait while its queue is full.
        await asyncio.sleep(0)

    async def kill(self, key: TaskKey, *, grace_seconds: float, reason: str) -> None:
        await self._ensure_running()
        task_dir = self.tasks_dir / key.slug
        task = self._tasks.get(key.slug)
        if task is None:
            if not (task_dir / SPEC).exists() or (task_dir / REPORTED).exists():
                return  # unknown, or finished and recorded
            task = self._adopt(task_dir)
            if task is None:
                return
        if task.finished.is_set() or (task_dir / EXIT).exists():
            self._report_finished(task)
            return
        reason = reason or "Killed"
        write_replacing(task_dir / KILL, encode(KillRequest(reason=reason, graceSeconds=grace_seconds)))
        if claim(task_dir / SHIM, encode(ShimRecord(shimPid=0, shimStartTicks=0, cancelled=True))):
            self._record_exit(task, reason, "stopped before it started")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds + STOP_MARGIN_SECONDS
        signalled = False
        while not task.finished.is_set():
            if (task_dir / EXIT).exists():
                self._report_finished(task)
                return
            shim = read_record(task_dir / SHIM, ShimRecord)
            if shim is None or shim.cancelled:
                pass  # being rewritten, or cancelled by a concurrent stop
            elif not local_procs.is_alive(shim.shimPid, shim.shimStartTicks):
                if not (task_dir / EXIT).exists():
                    self._kill_orphans(task)
                    self._record_exit(task, reason, "its shim was gone; its processes were killed")
                continue
            elif loop.time() > deadline:
                # The shim did not finish the stop in time: end it, then take over.
                local_procs.signal_each([shim.shimPid], signal.SIGKILL)
            elif not signalled:
                local_procs.signal_each([shim.shimPid], signal.SIGTERM)
                signalled = True
            try:
                await asyncio.wait_for(task.finished.wait(), _STOP_POLL_SECONDS)
            except TimeoutError:
                pass

    def events(self) -> AsyncIterator[BackendEvent]:
        return self._event_stream()

    async def read_log(self, key: TaskKey, *, tail_bytes: int | None = None) -> bytes:
        task_dir = self.tasks_dir / key.slug
        if not (task_dir / SPEC).exists():
            raise NotFound(f"no local task {key.slug}")
        return await asyncio.to_thread(
            read_log, task_dir / OUTPUT_LOG, cap_bytes=self.log_cap_bytes, tail_bytes=tail_bytes
        )

    async def forget(self, key: TaskKey) -> None:
        task_dir = self.tasks_dir / key.slug
        if (task_dir / SPEC).exists():
            (task_dir / REPORTED).touch()
        self._tasks.pop(key.slug, None)

    async def close(self) -> None:
        """Stop watching; running tasks carry on (a later `recover` re-adopts them)."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        if self._bell is not None:
            asyncio.get_running_loop().remove_reader(self._bell.fileno())
            self._bell.close()
        if self._server is not None:
            await _stop_fork_server(self._server)
        self._queue.put_nowait(None)

    # -- plumbing ------------------------------------------------------------

    async def _ensure_running(self) -> None:
        if self._closed:
            raise RuntimeError("the local backend is closed")
        if self._bell is None:
            bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                bell.bind(doorbell_address(self._doorbell))
            except OSError as exc:
                bell.close()
                if exc.errno == errno.EADDRINUSE:
                    raise RuntimeError(f"{self.data_dir} is in use by another PAI launcher") from exc
                raise
            bell.setblocking(False)
            asyncio.get_running_loop().add_reader(bell.fileno(), self._on_bell)
            self._bell = bell
        if self._server is None or self._server.returncode is not None:
            if self._server is not None:
                log.warning("local fork server exited (%s); starting another", self._server.returncode)
            self._server = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.launcher.backends.local_shim",
                self._doorbell,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                env=_fork_server_env(),
            )
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="local-backend-sweep")

    def _send(self, task: _Task) -> None:
        assert self._server is not None and self._server.stdin is not None
        task.sent_at = time.monotonic()
        try:
            self._server.stdin.write(f"{task.dir}\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sweep restarts the server and re-sends

    def _on_bell(self) -> None:
        assert self._bell is not None
        while True:
            try:
                message = self._bell.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            kind, body = message[:1], message[1:].decode(errors="replace")
            slug, _, detail = body.partition("\n")
            task = self._tasks.get(slug)
            if task is None:
                continue  # forgotten, or not yet recovered: recover() will see it
            if kind == RUNNING_BELL:
                self._report_running(task, detail)
            elif kind == FINISHED_BELL:
                self._report_finished(task)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_seconds)
            try:
                if self._server is not None and self._server.returncode is not None:
                    await self._ensure_running()
                now = time.monotonic()
                for task in list(self._tasks.values()):
                    if not task.finished.is_set():
                        self._check(task, now)
            except Exception:  # noqa: BLE001 - a sweep must not die; the next one retries
                log.exception("local backend sweep failed")

    def _check(self, task: _Task, now: float) -> None:
        """Look at a task's directory; report what changed, re-send, or declare it lost."""
        if task.finished.is_set():
            return
        if (task.dir / EXIT).exists():
            self._report_finished(task)
            return
        shim = task.shim or read_record(task.dir / SHIM, ShimRecord)
        if shim is None:
            try:
                claimed_at = os.stat(task.dir / SHIM).st_mtime
            except FileNotFoundError:
                if now - task.sent_at >= RESEND_SECONDS:
                    self._send(task)
                return
            if time.time() - claimed_at > CLAIM_WRITE_SECONDS:
                self._declare_lost(task)
            return
        if shim.cancelled:
            return  # a stop is recording the exit
        task.shim = shim
        self._report_running(task, shim.detail)
        if not local_procs.is_alive(shim.shimPid, shim.shimStartTicks):
            if (task.dir / EXIT).exists():
                self._report_finished(task)  # it ended between our two looks
                return
            self._declare_lost(task)

    def _declare_lost(self, task: _Task) -> None:
        self._kill_orphans(task)
        self._record_exit(
            task, "Lost", "the task's shim died before recording its exit; its processes were killed"
        )

    def _adopt(self, task_dir: Path) -> _Task | None:
        spec = read_record(task_dir / SPEC, TaskSpec)
        if spec is None:
            # A start interrupted before its spec was whole: nothing ran.
            log.warning("removing %s: the launcher died while creating it", task_dir)
            shutil.rmtree(task_dir, ignore_errors=True)
            return None
        task = _Task(spec.key, task_dir, spec.node, spec.dockerImageUri)
        self._tasks[spec.key.slug] = task
        return task

    def _report_running(self, task: _Task, detail: str) -> None:
        if task.running_reported or task.finished.is_set():
            return
        task.running_reported = True
        if task.image:
            detail = f"{detail}; dockerImage {task.image} ignored by the local backend"
        self._queue.put_nowait(TaskRunning(key=task.key, node=task.node, detail=detail))

    def _report_finished(self, task: _Task) -> None:
        if task.finished.is_set():
            return
        record = read_record(task.dir / EXIT, ExitRecord)
        if record is None:
            return
        if not task.running_reported and record.startedAt is not None:
            shim = read_record(task.dir / SHIM, ShimRecord)
            self._report_running(task, shim.detail if shim else "")
        output = task.dir / OUTPUT_LOG
        tail = read_log(output, cap_bytes=self.log_cap_bytes, tail_bytes=USER_LOG_TAIL_BYTES)
        task.finished.set()
        self._queue.put_nowait(
            TaskFinished(
                key=task.key,
                exitCode=record.exitCode,
                signal=record.signal,
                platformReason=record.platformReason,
                platformMessage=record.platformMessage,
                userLogTail=tail.decode(errors="replace"),
                logPath=str(output),
                memoryPeakMB=record.memoryPeakMB,
            )
        )

    def _record_exit(self, task: _Task, reason: str, message: str) -> None:
        """The exit of a task nobody saw end; written only when no shim can be alive
        (it never claimed the task, or it is dead), so it never races the shim's."""
        record = ExitRecord(
            exitCode=UNKNOWN_EXIT_CODE,
            platformReason=reason,
            platformMessage=message,
            finishedAt=self._clock(),
        )
        write_replacing(task.dir / EXIT, encode(record))
        self._report_finished(task)

    def _kill_orphans(self, task: _Task) -> None:
        """What is left of a task whose shim is gone: its cgroup, and marked processes."""
        if self._cgroup_parent is not None:
            local_limits.kill_cgroup(self._cgroup_parent / task.key.slug, signal.SIGKILL)
        local_procs.sweep_marked(task.key.slug, TASK_KEY_ENV)

    def _task_env(self, launch: TaskLaunch, task_dir: Path) -> dict[str, str]:
        env = dict(self._base_env)
        env.update(launch.env)
        env[WORK_DIR_ENV] = str(task_dir / WORK)
        env[TASK_KEY_ENV] = launch.key.slug
        return env

    async def _event_stream(self) -> AsyncIterator[BackendEvent]:
        while True:
            event = await self._queue.get()
            if event is None:
                self._queue.put_nowait(None)  # let any other reader end too
                return
            yield event


def _inherited_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.update({name: value for name, value in os.environ.items() if name.startswith("LC_")})
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def _choose_limits(limits: str, cgroup_root: Path, cgroup_parent: Path | None) -> tuple[str, Path | None]:
    if limits in (LIMITS_RLIMIT, LIMITS_NONE):
        return limits, None
    parent = local_limits.prepare_cgroup_parent(cgroup_root, cgroup_parent)
    if parent is not None:
        return LIMITS_CGROUP, parent
    if limits == LIMITS_CGROUP:
        raise RuntimeError(
            f"cgroup v2 limits were asked for, but no cgroup with cpu and memory controllers "
            f"can be made under {cgroup_parent or cgroup_root}"
        )
    return LIMITS_RLIMIT, None


def _fork_server_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(_PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


async def _stop_fork_server(server: asyncio.subprocess.Process) -> None:
    if server.stdin is not None:
        server.stdin.close()  # EOF: it exits; the shims it forked carry on
    try:
        await asyncio.wait_for(server.wait(), 5.0)
    except TimeoutError:
        server.kill()
        await server.wait()
