"""The shim: one small process per local task, which outlives the launcher.

A shim claims its task directory (so the task never starts twice), starts the
task as `bash --noprofile --norc -e -c <commands>` in a new session, pipes its
output into capped logs, obeys stop orders (SIGTERM to the whole task, SIGKILL
after the grace period), and when the task ends writes `exit.json` with the
exit code, signal and peak memory. The shim is a child subreaper, so even a
grandchild that called setsid and lost its parent stays its descendant: nothing
of a task outlives it. When the task's main process exits, whatever it left
running is killed, as when a container's main process exits.

Cost matters (a few hundred tasks a second on two cores), so:
- shims are forked, not executed: `python -m services.launcher.backends.local_shim
  DOORBELL` is a fork server that the backend runs as its child. It reads task
  directories, one per line on stdin, and forks a shim for each. It holds no
  state: when the launcher dies it reads EOF and exits, and its shims carry on,
  each in its own session; a new server is simply sent what nobody claimed.
- the task is spawned with posix_spawn (vfork + exec), not fork: no copy of the
  shim's page tables;
- the shim imports only the standard library and msgspec, so it forks fast.

Every shim rings the backend's doorbell (see local_layout) when its task runs
and when exit.json is written.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from services.launcher.backends import local_limits, local_procs
from services.launcher.backends.local_layout import (
    EXIT,
    FINISHED_BELL,
    KILL,
    LIMITS_CGROUP,
    LIMITS_RLIMIT,
    OUTPUT_LOG,
    RUNNING_BELL,
    SHIM,
    SPEC,
    STDERR_LOG,
    UNKNOWN_EXIT_CODE,
    WORK,
    Doorbell,
    ExitRecord,
    KillRequest,
    ShimRecord,
    ShimSpec,
    claim,
    encode,
    read_record,
    write_replacing,
)
from services.launcher.backends.local_logs import CappedLog

BASH = shutil.which("bash") or "/bin/bash"
_READ_CHUNK = 65536
# How often a stop re-sweeps for processes forked while it was killing.
_RESWEEP_SECONDS = 0.05
# How long to wait for log pipes to close once no process of the task is left
# (a descendant could have handed its pipe to a process outside the task).
_DRAIN_SECONDS = 1.0
# Dispositions a task must not inherit: Python ignores SIGPIPE and SIGXFSZ, the
# fork server ignores SIGCHLD and SIGINT.
_SIGNALS_RESET_FOR_TASK = frozenset(
    {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ}
)


class _Limits:
    """The bounds actually obtained for one task (cgroup creation may fail)."""

    def __init__(self, spec: ShimSpec):
        self.mode = spec.limits
        self.cgroup: Path | None = None
        if self.mode == LIMITS_CGROUP:
            try:
                self.cgroup = local_limits.create_task_cgroup(
                    Path(spec.cgroupParent), spec.slug, spec.cpu, spec.memoryMB
                )
            except OSError:
                self.mode = LIMITS_RLIMIT
        self.detail = local_limits.describe(self.mode, spec.cpu, spec.memoryMB)
        self.prelude = local_limits.prelude(self.mode, self.cgroup, spec.memoryMB)

    def signal(self, sig: int) -> None:
        if self.cgroup is not None:
            local_limits.kill_cgroup(self.cgroup, sig)


class Shim:
    def __init__(self, task_dir: Path, spec: ShimSpec, limits: _Limits, doorbell: Doorbell):
        self.dir = task_dir
        self.spec = spec
        self.limits = limits
        self.doorbell = doorbell
        self.output = CappedLog(task_dir / OUTPUT_LOG, spec.logCapBytes)
        self.errors = CappedLog(task_dir / STDERR_LOG, spec.logCapBytes)
        self.task_pid = 0
        self.main_status: int | None = None
        self.no_children = False
        self.term_requested = False
        self.kill_reason: str | None = None
        self.kill_deadline: float | None = None
        self.kill_grace = 0.0
        self.escalated = False
        self.started_at: float | None = None

    def run(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        # A stop order may have come since the claim: it is delivered now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        local_procs.set_child_subreaper()
        work = self.dir / WORK
        work.mkdir(exist_ok=True)
        os.chdir(work)  # the task inherits it (posix_spawn cannot chdir)
        try:
            out_r, err_r = self._spawn()
        except OSError as exc:
            self._finish(
                ExitRecord(
                    exitCode=UNKNOWN_EXIT_CODE,
                    platformReason="LaunchFailed",
                    platformMessage=f"cannot start {BASH}: {exc}",
                    finishedAt=time.time(),
                )
            )
            return
        self.doorbell.ring(RUNNING_BELL + f"{self.spec.slug}\n{self.limits.detail}".encode())
        if (self.dir / KILL).exists():
            self.term_requested = True  # the order came before we could be signalled
        self._supervise(out_r, err_r, wake_r)
        self._finish(self._exit_record())

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM:
            self.term_requested = True

    def _spawn(self) -> tuple[int, int]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        script = self.limits.prelude + "\n".join(self.spec.commands) + "\n"
        argv = [BASH, "--noprofile", "--norc", "-e", "-c", script, f"pai-task-{self.spec.slug}"]
        self.started_at = time.time()
        try:
            self.task_pid = os.posix_spawn(
                BASH,
                argv,
                self.spec.env,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, err_w, 2),
                ],
                setsid=True,  # its own session and process group, led by the task
                setsigdef=_SIGNALS_RESET_FOR_TASK,
                setsigmask=(),
            )
        finally:
            os.close(out_w)
            os.close(err_w)
        return out_r, err_r

    # -- watch ---------------------------------------------------------------

    def _supervise(self, out_r: int, err_r: int, wake_r: int) -> None:
        selector = selectors.DefaultSelector()
        selector.register(out_r, selectors.EVENT_READ, (self.output,))
        selector.register(err_r, selectors.EVENT_READ, (self.output, self.errors))
        selector.register(wake_r, selectors.EVENT_READ, None)
        open_pipes = 2
        next_sweep = 0.0
        drain_deadline: float | None = None
        while True:
            self._reap()
            now = time.monotonic()
            if self.term_requested:
                self.term_requested = False
                self._begin_stop(now)
            stopping_in_grace = self.kill_deadline is not None and now < self.kill_deadline
            leftovers = self.main_status is not None and not self.no_children
            # After a normal exit leftovers are killed at once; after a stop
            # order everything gets the grace period, then SIGKILL.
            must_kill = leftovers or self.kill_deadline is not None
            if must_kill and not self.no_children and not stopping_in_grace and now >= next_sweep:
                self._signal_task(signal.SIGKILL)
                self.escalated = self.escalated or self.kill_deadline is not None
                next_sweep = now + _RESWEEP_SECONDS
            if self.main_status is not None and self.no_children:
                if open_pipes == 0:
                    break
                drain_deadline = drain_deadline or now + _DRAIN_SECONDS
                if now >= drain_deadline:
                    break
            deadlines = [d for d in (drain_deadline,) if d is not None]
            if must_kill and not self.no_children:
                deadlines.append(max(next_sweep, self.kill_deadline or 0.0))
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in selector.select(timeout):
                if key.data is None:
                    _drain(key.fd)
                    continue
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    open_pipes -= 1
                    continue
                for log in key.data:
                    log.write(chunk)
        selector.close()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.no_children = True
                return
            if pid == 0:
                return
            if pid == self.task_pid:
                self.main_status = status

    def _begin_stop(self, now: float) -> None:
        if self.kill_reason is not None:
            return
        order = read_record(self.dir / KILL, KillRequest) or KillRequest(
            reason="Killed", graceSeconds=self.spec.graceSeconds
        )
        self.kill_reason = order.reason
        self.kill_grace = order.graceSeconds
        self.kill_deadline = now + max(0.0, order.graceSeconds)
        self._signal_task(signal.SIGTERM)

    def _signal_task(self, sig: int) -> None:
        local_procs.signal_group(self.task_pid, sig)
        self.limits.signal(sig)
        local_procs.signal_each(local_procs.descendants(os.getpid()), sig)

    # -- end -----------------------------------------------------------------

    def _exit_record(self) -> ExitRecord:
        status = self.main_status or 0
        signal_number = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        # Shell convention (and OpenPAI's exit spec): death by signal N reads 128+N.
        exit_code = 128 + signal_number if signal_number else os.waitstatus_to_exitcode(status)
        cgroup = self.limits.cgroup
        peak = local_limits.peak_memory_mb(cgroup) if cgroup else None
        if peak is None:
            # The largest single process. The kernel counts the spawning shim's
            # pages at exec, so a task smaller than the shim reads as its size.
            peak = -(-resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
        reason, message = "", ""
        if self.kill_reason is not None:
            reason = self.kill_reason
            message = (
                f"stopped: SIGTERM, then SIGKILL after {self.kill_grace:g}s"
                if self.escalated
                else "stopped: SIGTERM"
            )
        elif cgroup is not None and local_limits.oom_killed(cgroup):
            reason = "OOMKilled"
            message = f"memory.max {self.spec.memoryMB} MiB exceeded"
        return ExitRecord(
            exitCode=exit_code,
            signal=signal_number,
            platformReason=reason,
            platformMessage=message,
            memoryPeakMB=peak,
            startedAt=self.started_at,
            finishedAt=time.time(),
            logDroppedBytes=self.output.dropped_bytes,
        )

    def _finish(self, record: ExitRecord) -> None:
        self.output.close()
        self.errors.close()
        write_replacing(self.dir / EXIT, encode(record))
        if self.limits.cgroup is not None:
            local_limits.remove_cgroup(self.limits.cgroup)
        self.doorbell.ring(FINISHED_BELL + self.spec.slug.encode())


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def run_shim(task_dir: Path, doorbell_name: str) -> None:
    """Body of a forked shim; never returns."""
    doorbell = Doorbell(doorbell_name)
    try:
        os.setsid()  # out of the launcher's session: its ^C or hangup is not ours
        _detach_stdio()
        spec = read_record(task_dir / SPEC, ShimSpec)
        if spec is None:
            os._exit(0)  # not a task directory (the backend reports such a one)
        # The claim names our pid, so a stop order can come at once: it waits
        # until our handler is in place.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        limits = _Limits(spec)
        record = ShimRecord(
            shimPid=os.getpid(),
            shimStartTicks=local_procs.start_ticks(os.getpid()) or 0,
            detail=limits.detail,
            claimedAt=time.time(),
        )
        if not claim(task_dir / SHIM, encode(record)):
            os._exit(0)  # another shim, or a stop that cancelled it, came first
        try:
            Shim(task_dir, spec, limits, doorbell).run()
        except BaseException:  # noqa: BLE001 - the backend must hear of any failure
            (task_dir / "shim.error").write_text(traceback.format_exc())
            if not (task_dir / EXIT).exists():
                write_replacing(
                    task_dir / EXIT,
                    encode(
                        ExitRecord(
                            exitCode=UNKNOWN_EXIT_CODE,
                            platformReason="LaunchFailed",
                            platformMessage=traceback.format_exc(limit=1),
                            finishedAt=time.time(),
                        )
                    ),
                )
            doorbell.ring(FINISHED_BELL + task_dir.name.encode())
    finally:
        os._exit(0)


def serve(doorbell_name: str) -> None:
    """The fork server: one task directory per line on stdin, until EOF."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # shims are never waited for
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when we stop
    for line in sys.stdin.buffer:
        task_dir = Path(line.decode().rstrip("\n"))
        if (task_dir / SHIM).exists():
            continue
        if os.fork() == 0:
            run_shim(task_dir, doorbell_name)


if __name__ == "__main__":
    serve(sys.argv[1])
