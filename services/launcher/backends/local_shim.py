"""Shims: small processes that run local tasks and outlive the launcher.

A shim (forked by local_forkserver) takes a batch of task specs, usually one,
and then more from its feed (a pipe from the fork server) until the fork
server closes it (local_forkserver: a shim takes tasks for a while, then
another is forked). For each it claims the task's record (created with O_EXCL: a task never
starts twice; local_layout),
starts `bash --noprofile --norc -e -c <commands>` in a new session (or, for
one simple command, execs its program directly: local_direct), pipes its
output into capped logs, obeys stop orders (SIGTERM to every process of the
task, SIGKILL after the grace period), and when the task ends appends its
exit record (exit code, signal, CPU time, peak memory) to its record. When a task's
main process exits, whatever it left running is killed, as when a container's
main process exits. The shim is a child subreaper, so even a grandchild that
called setsid and lost its parent stays its descendant (and is told apart by
its PAI_TASK_KEY): nothing of a task outlives it. The shim exits when its feed
is closed and its last task has ended.

Tasks are spawned with vfork + exec: no copy of the shim's pages, which on a
small virtual machine costs more than running the task. A task that runs as
the shim's user is spawned with posix_spawn. One that runs as another user
(the platform runs as root; see local_users) must have its child drop every
group and its uid before the exec, which posix_spawn cannot do: the shim
itself stays privileged (it must write the platform's records, signal the
task, read its cgroup), the task's shell never is. That child is the small C
extension _spawn_as (vfork, raw system calls for the credentials, exec: see
its source for why subprocess cannot use vfork there), which also joins the
task's cgroup while still root and sets a program's RLIMIT_DATA (a program
exec'd without bash under rlimit bounds: bash's `ulimit -d` is not there).
Where the extension was not built (no C compiler at install), subprocess's
own C fork + exec does it, a real fork of the shim, and a task that joins a
cgroup or gets a data limit runs those steps in Python in the child; the
launcher's log says which (SPAWN_AS).

Secrets: a task whose commands use secrets gets its script, secrets filled in,
through an in-memory file (memfd) on an fd of its own, which its shell reads and closes
before running it (script_loader). The script is then in no file on disk, not
in spec.json, and not in the shell's argv, which any user may read in
/proc/<pid>/cmdline; only processes of the task's own user (and root) can see
its memory or environment.

A shim rings the backend's doorbell (local_doorbell) when a task runs and when
its exit is recorded. SIGUSR1 means "a stop order waits" (the shim reads
the kill orders of its tasks); SIGTERM stops all its tasks, and it takes no more
(a task sent meanwhile is sent again by the backend: local.RESEND_SECONDS).
"""

from __future__ import annotations

import _posixsubprocess  # the C fork + exec behind subprocess.Popen; see _fork_exec_as
import contextlib
import errno
import os
import resource
import select
import shutil
import signal
import stat
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import msgspec

from services.launcher.backends import local_direct, local_limits, local_namespaces, local_procs
from services.launcher.backends.local_doorbell import (
    FINISHED_BELL,
    MAX_TOLD_RECORD_BYTES,
    RUNNING_BELL,
    Doorbell,
)
from services.launcher.backends.local_layout import (
    DEFAULT_PIDS_MAX,
    KILL,
    LIMITS_CGROUP,
    LIMITS_CGROUP_V1,
    LIMITS_RLIMIT,
    OUTPUT_LOG,
    PRIVATE_DIR_MODE,
    SECRET_SEPARATOR,
    SHIM_ERROR,
    STALE_LINE_SECONDS,
    STDERR_LOG,
    TASK_KEY_ENV,
    UNKNOWN_EXIT_CODE,
    ExitRecord,
    KillRequest,
    ShimRecord,
    ShimSpec,
    TaskFiles,
    append_exit,
    claim,
    decoder,
    encode,
    read_record,
    with_claim,
    write_all,
)
from services.launcher.backends.local_logs import DISK_FULL_PLATFORM_REASON, CappedLog

try:  # built from _spawn_as.c when a compiler was there at install (setup.py)
    from services.launcher.backends import _spawn_as
except ImportError:
    _spawn_as = None
if _spawn_as is not None and not hasattr(_spawn_as, "MOUNTS"):
    _spawn_as = None  # a build of an older _spawn_as.c left in place: its arguments differ

BASH = shutil.which("bash") or "/bin/bash"
_READ_CHUNK = 65536
# How often leftovers are looked for again while a task is being ended.
_RESWEEP_SECONDS = 0.05
# How long to wait for log pipes to close once no process of the task is left
# (a descendant could have handed its pipe to a process outside the task).
_DRAIN_SECONDS = 1.0
# Dispositions a task must not inherit: Python ignores SIGPIPE and SIGXFSZ, the
# fork server ignores SIGINT, a launcher started under nohup ignores SIGHUP;
# handlers do not survive exec, but be explicit.
# SIGQUIT too: a shell starting a command in the background (`cmd &`, no job control)
# leaves it ignored with SIGINT, and so would every task of a launcher started that way;
# and the stop and timer signals a parent may have left ignored.
_SIGNALS_RESET_FOR_TASK = frozenset(
    {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ,
     signal.SIGUSR2, signal.SIGALRM, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
)
_SHIM_SIGNALS = (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM)
# The fd on which a task with secrets finds its script, and the shell text that
# reads it whole, closes it and runs it (errexit applies inside eval as in -c).
# Only subprocess's fork (where _spawn_as is not built) cannot move fds: there
# the task finds it on the shim's own number (_script_fd_in_task).
SCRIPT_FD = 3
# How tasks that run as another user are started, for the launcher's log.
SPAWN_AS = (
    "vfork + exec (the C extension _spawn_as)"
    if _spawn_as is not None
    else "fork + exec (subprocess; the C extension _spawn_as is not built: more CPU per task)"
)


def script_loader(fd: int = SCRIPT_FD) -> str:
    return f"IFS= read -r -d '' __pai_script <&{fd} || true; exec {fd}<&-; eval \"$__pai_script\"\n"


# The umask tasks start with (the shim's own is 077: what it writes is private).
TASK_UMASK = 0o022


class _Limits:
    """The bounds actually obtained for one task (cgroup creation may fail)."""

    def __init__(self, spec: ShimSpec):
        # First, before anything is made for the task: a storage it cannot have
        # fails its launch, naming the storage (UnmountableStorage, StorageUnavailable).
        binds = local_namespaces.storage_binds(spec.storages, spec.gid)
        if binds and not (spec.privateMounts and spec.uid is not None):
            raise local_namespaces.StorageUnavailable(
                "the job mounts storages, which a task gets in a mount namespace of its own: this machine "
                "gives tasks none (run PAI as root on a kernel with mount namespaces)")
        self.mode = spec.limits
        self.cgroup: local_limits.TaskCgroup | None = None
        # A task that changes user joins its cgroup before it does (it could
        # not move itself afterwards); the others do it in their prelude.
        self.join_in_child = spec.uid is not None
        self.pids_max = spec.pidsMax or DEFAULT_PIDS_MAX
        fell_back = ""
        if self.mode == LIMITS_CGROUP:
            try:
                made = local_limits.create_task_cgroup(Path(spec.cgroupParent), spec.slug, spec.cpu, spec.memoryMB)
                self.cgroup = local_limits.TaskCgroup(2, [str(made)])
            except OSError as exc:
                self.mode, fell_back = LIMITS_RLIMIT, f" (its cgroup could not be made: {exc.strerror})"
        elif self.mode == LIMITS_CGROUP_V1:
            try:
                self.cgroup = local_limits.claim_task_cgroups_v1(
                    spec.cgroupParents, spec.slug, spec.cpu, spec.memoryMB, self.pids_max
                )
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                self.mode, fell_back = LIMITS_RLIMIT, f" (its cgroups could not be made: {why})"
        self.detail = local_limits.describe(self.mode, spec.cpu, spec.memoryMB, self.pids_max) + fell_back
        procs = self.cgroup.procs_files if self.cgroup is not None else None
        self.prelude = local_limits.prelude(self.mode, None if self.join_in_child else procs, spec.memoryMB)
        # The cgroup.procs files the child joins while still root.
        self.join = procs if self.join_in_child else None
        # RLIMIT_DATA as the prelude's `ulimit -d` sets it (soft and hard), for a
        # task that changes user and so can set it in the child instead.
        self.data_limit = spec.memoryMB * local_limits.MIB if self.mode == LIMITS_RLIMIT and spec.memoryMB > 0 else None
        # The bound on its working directory (the local_limits docstring says how it holds).
        self.work_dir_bytes = spec.workDirMB * local_limits.MIB if spec.workDirMB > 0 else None
        if self.work_dir_bytes is not None:
            self.detail += f", work dir {spec.workDirMB} MiB"
        # A mount namespace of its own (local_namespaces): only for a task that
        # changes user (one that runs as the shim's user, root, could undo it).
        self.mounts = (
            local_namespaces.plan(spec.work_dir, spec.uid, spec.gid if spec.gid is not None else spec.uid, spec.memoryMB,
                                  binds, spec.platformDirs)
            if spec.privateMounts and spec.uid is not None
            else None
        )
        if self.mounts is not None:
            self.detail += "; " + local_namespaces.describe(True, None)
            if binds:
                self.detail += "; storages: " + ", ".join(f"{b.container_path}{' (read-only)' if b.read_only else ''}"
                                                          for b in binds)
            if self.mounts.platform:
                self.detail += "; the platform's " + ", ".join(self.mounts.platform) + " (read-only)"
        else:
            why_not = "it runs as the launcher's own user" if spec.uid is None else "none on this machine"
            self.detail += "; " + local_namespaces.describe(False, why_not)


class SpawnRequest(msgspec.Struct, frozen=True, kw_only=True):
    """How one task's process is started, built in one place (Shim._start) and
    read by each way of starting it (_posix_spawn, _spawn_as, subprocess's fork).

    `uid`/`gid` None: as the shim's own user (_posix_spawn), which reads neither
    them nor the bounds below them (the task's shell prelude enters its bounds)."""

    program: str
    argv: list[str]
    env: dict[str, str]
    work_dir: str
    out_w: int  # the write ends of its log pipes: its stdout and stderr
    err_w: int
    script_fd: int | None = None  # its script with secrets (_script_file), moved to SCRIPT_FD
    uid: int | None = None
    gid: int | None = None
    cgroup_procs: list[str] | None = None  # cgroup.procs files joined while still root
    data_limit: int | None = None  # RLIMIT_DATA, soft and hard (a program exec'd without bash)
    mounts: local_namespaces.MountPlan | None = None  # a mount namespace of its own
    fsize_limit: int | None = None  # RLIMIT_FSIZE: the bound on its working directory


class _Run:
    """One task under a shim."""

    def __init__(self, files: TaskFiles, spec: ShimSpec, limits: _Limits, secret_commands: list[str] | None = None):
        self.files = files
        self.spec = spec
        self.limits = limits
        # The commands with secrets filled in (spec.commands keeps references).
        self.secret_commands = secret_commands
        self.marker = local_procs.marker_entry(TASK_KEY_ENV, spec.slug)
        # Paths as strings here and below: pathlib's parsing is a noticeable
        # part of the shim's CPU per task.
        self.output = CappedLog(files.beside(OUTPUT_LOG), spec.logCapBytes)
        self.errors = CappedLog(files.beside(STDERR_LOG), spec.logCapBytes)
        self.output_bytes = 0
        self.pid = 0  # also its process group and session
        self.pipe_fds: tuple[int, ...] = ()  # the read ends of its output pipes
        self.open_pipes = 0
        self.started_at = 0.0
        self.shim_peak_kb = 0  # our own peak RSS when it was spawned
        self.status: int | None = None
        self.usage: resource.struct_rusage | None = None
        self.kill_reason: str | None = None
        self.kill_message = ""  # set when the shim itself ended it (a bound it passed)
        self.kill_grace = 0.0
        self.kill_deadline: float | None = None
        self.escalated = False
        self.next_sweep = 0.0
        self.drain_deadline: float | None = None  # set once no process is left


class Shim:
    def __init__(self, doorbell: Doorbell, feed: int | None = None):
        """`feed`: the read end of a pipe on which more task lines come, one per
        line, until EOF; None: only the tasks given to `take`."""
        self.doorbell = doorbell
        self.pid = os.getpid()
        self.fork_server = os.getppid()  # while it lives, the pool of task cgroups does (local_limits)
        self.ticks = local_procs.start_ticks(self.pid) or 0
        self.runs: dict[int, _Run] = {}  # by main pid
        # The runs _advance must look at: reaped, or ordered to stop (a running
        # task waits for its exit or an order, and is not looked at on every
        # wakeup). By main pid, in the order they got there.
        self.ending: dict[int, _Run] = {}
        self.pipes: dict[int, tuple[_Run, tuple[CappedLog, ...]]] = {}
        self.lookups = local_direct.PathLookups()
        # epoll itself, not the selectors module: a task registers two pipes,
        # and selectors' bookkeeping around each call costs about as much as
        # the call.
        self.poller = select.epoll()
        self.orders_waiting = False
        self.stop_everything = False
        # When running tasks are next looked at for bounds the kernel does not
        # enforce whole (_watch); the first look comes a period after the
        # shim's first task started, so a quick task is never looked at.
        self.next_watch = time.monotonic() + local_limits.WATCH_SECONDS
        self.next_disk_look = time.monotonic() + local_limits.WORK_DIR_LOOK_SECONDS
        self.cgroups_left: list[local_limits.TaskCgroup] = []  # ended tasks' cgroups not yet empty
        self.children_changed = True  # a SIGCHLD came since the last _reap: reap again
        self.childless = False
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.wakeup = wake_r
        self.poller.register(wake_r, select.EPOLLIN)
        self.feed = feed
        self._feed_rest = b""  # a line not yet complete
        if feed is not None:
            os.set_blocking(feed, False)
            self.poller.register(feed, select.EPOLLIN)
        for sig in _SHIM_SIGNALS:
            signal.signal(sig, self._on_signal)
        _catch_ignored_signals()
        local_procs.set_child_subreaper()
        local_procs.set_process_name("pai-shim")

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGCHLD:
            self.children_changed = True
        elif signum == signal.SIGUSR1:
            self.orders_waiting = True
        elif signum == signal.SIGTERM:
            self.stop_everything = True

    # -- start ---------------------------------------------------------------

    def take(self, line: bytes) -> None:
        """Claim and start one task; a task someone else claimed is skipped.

        `line` is the spec JSON, then, for a task with secrets, SECRET_SEPARATOR
        and its commands with the secrets filled in (kept in memory only)."""
        spec_json, separator, secret_part = line.partition(SECRET_SEPARATOR)
        spec = decoder(ShimSpec).decode(spec_json)
        if spec.sentAt and time.time() - spec.sentAt > STALE_LINE_SECONDS:
            return  # a copy sent long ago: the task has been sent again since
        claimed = claim(spec.taskPath)
        if claimed is None:
            return
        files = TaskFiles(spec.taskPath)
        limits: _Limits | None = None
        try:
            try:
                limits = _Limits(spec)  # may make the task's cgroup: only once the task is ours
                record = ShimRecord(
                    shimPid=self.pid, shimStartTicks=self.ticks, detail=limits.detail, claimedAt=time.time()
                )
                write_all(claimed, with_claim(spec_json, record))
            finally:
                os.close(claimed)
            _provide_work_dir(spec)
            secret_commands = decoder(list[str]).decode(secret_part) if separator else None
            run = _Run(files, spec, limits, secret_commands)
            self._spawn(run)
        except Exception as exc:  # noqa: BLE001 - recorded as the task's exit
            with open(files.beside(SHIM_ERROR), "w") as error:
                error.write(traceback.format_exc())
            self._write_exit(
                files,
                spec.slug,
                ExitRecord(
                    exitCode=UNKNOWN_EXIT_CODE,
                    platformReason="LaunchFailed",
                    platformMessage=f"{type(exc).__name__}: {exc}",
                    finishedAt=time.time(),
                ),
            )
            if limits is not None and limits.cgroup is not None and not limits.cgroup.release():
                self.cgroups_left.append(limits.cgroup)
            return
        self.doorbell.ring(RUNNING_BELL + f"{spec.slug}\n{limits.detail}".encode())

    def _spawn(self, run: _Run) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            run.started_at = time.time()
            direct = self._direct_run(run)
            if direct is not None:
                try:
                    run.pid = self._start(run, direct.program, direct.argv, direct.env, out_w, err_w)
                except OSError:
                    direct = None  # e.g. a script without #!: bash runs it, or says why it cannot
            if direct is None:
                self._start_in_bash(run, out_w, err_w)
        except OSError:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        # Read after the spawn: the exec happened inside it, so this bounds
        # what the kernel put in the task's peak from our pages.
        run.shim_peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.runs[run.pid] = run
        self.childless = False
        run.pipe_fds = (out_r, err_r)
        run.open_pipes = 2
        self.pipes[out_r] = (run, (run.output,))
        self.pipes[err_r] = (run, (run.output, run.errors))
        self.poller.register(out_r, select.EPOLLIN)
        self.poller.register(err_r, select.EPOLLIN)

    def _direct_run(self, run: _Run) -> local_direct.DirectRun | None:
        """The task's one simple command, to exec without bash (local_direct);
        None when bash must run it: the commands need a shell, the task has
        secrets (the command line is readable by anyone), or its bounds are
        entered by a shell line (local_limits.prelude) that the child cannot
        enter itself."""
        spec = run.spec
        if run.secret_commands is not None:
            return None
        # A task that changes user gets its rlimit from the forked child
        # (_fork_exec_as); one spawned as our user has only its shell to set it.
        if run.limits.prelude and not (spec.uid is not None and run.limits.data_limit is not None):
            return None
        return local_direct.plan(spec.commands, spec.env, spec.work_dir, spec.uid, spec.gid, self.lookups)

    def _start_in_bash(self, run: _Run, out_w: int, err_w: int) -> None:
        script_fd = None
        as_other_user = run.spec.uid is not None and run.spec.gid is not None
        if run.secret_commands is not None:
            script_fd = _script_file(run.limits.prelude + "\n".join(run.secret_commands) + "\n")
            script = script_loader(_script_fd_in_task(script_fd, as_other_user))
        else:
            script = run.limits.prelude + "\n".join(run.spec.commands) + "\n"
        argv = [BASH, "--noprofile", "--norc", "-e", "-c", script, f"pai-task-{run.spec.slug}"]
        try:
            run.pid = self._start(run, BASH, argv, run.spec.env, out_w, err_w, script_fd, in_shell=True)
        finally:
            if script_fd is not None:
                os.close(script_fd)

    def _start(
        self, run: _Run, program: str, argv: list[str], env: dict[str, str], out_w: int, err_w: int,
        script_fd: int | None = None, *, in_shell: bool = False,
    ) -> int:
        """Start `program`; `in_shell`: it is bash with the bounds' prelude, which
        enters the rlimit itself."""
        spec = run.spec
        as_other_user = spec.uid is not None and spec.gid is not None
        request = SpawnRequest(
            program=program, argv=argv, env=env, work_dir=spec.work_dir, out_w=out_w, err_w=err_w, script_fd=script_fd,
            uid=spec.uid if as_other_user else None, gid=spec.gid if as_other_user else None,
            cgroup_procs=run.limits.join, data_limit=None if in_shell else run.limits.data_limit,
            mounts=run.limits.mounts, fsize_limit=run.limits.work_dir_bytes,
        )
        return _fork_exec_as(request) if as_other_user else _posix_spawn(request)

    # -- watch ---------------------------------------------------------------

    def serve(self) -> None:
        """Watch the tasks, and take those the feed brings, until the feed is
        closed and the last task has ended."""
        while self.runs or self.feed is not None:
            if self.children_changed:
                self._reap()
            now = time.monotonic()
            if self.orders_waiting or self.stop_everything:
                self._take_orders(now)
            deadlines = []
            if self.runs or self.cgroups_left:
                if now >= self.next_watch:
                    self._watch(now)
                deadlines.append(self.next_watch)
            for run in list(self.ending.values()):
                deadline = self._advance(run, now)
                if deadline is not None:
                    deadlines.append(deadline)
            if not self.runs and self.feed is None:
                break
            timeout = max(0.0, min(deadlines) - now) if deadlines else -1
            self.doorbell.flush()  # what this turn rang, in one datagram, before we wait
            for fd, _ in self.poller.poll(timeout):
                if fd in self.pipes:
                    self._read_output(fd)
                elif fd == self.wakeup:
                    _drain(fd)
                elif fd == self.feed:
                    self._read_feed()
        self.doorbell.flush()
        self._end_strays()
        for _ in range(20):  # what the kernel kept a moment longer (_finish)
            self.cgroups_left = [cgroup for cgroup in self.cgroups_left if not cgroup.release()]
            if not self.cgroups_left:
                break
            time.sleep(_RESWEEP_SECONDS)
        if os.getppid() != self.fork_server:
            # The fork server has ended (the launcher closed, or died): the
            # launcher has removed the pool, or will not; what we put in it since goes.
            local_limits.remove_own_pooled()

    def _read_feed(self) -> None:
        """Take the tasks whose lines came whole; a line cut short by the
        closing of the feed is dropped (the fork server sends it elsewhere)."""
        if self.feed is None:
            return
        try:
            chunk = os.read(self.feed, _READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self._close_feed()
            return
        *lines, self._feed_rest = (self._feed_rest + chunk).split(b"\n")
        for line in lines:
            if line:
                try:
                    self.take(line)
                except Exception:  # noqa: BLE001 - a bad spec must not cost the others
                    traceback.print_exc()

    def _close_feed(self) -> None:
        if self.feed is not None:
            self.poller.unregister(self.feed)
            os.close(self.feed)
            self.feed = None
            self._feed_rest = b""

    def _read_output(self, fd: int) -> None:
        run, logs = self.pipes[fd]
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            self._close_pipe(fd)
            return
        run.output_bytes += len(chunk)
        for log in logs:
            log.write(chunk)

    def _close_pipe(self, fd: int) -> None:
        run, _ = self.pipes.pop(fd)
        # Closing it takes it out of the epoll set (no unregister: a system call
        # less per pipe): no other fd refers to its pipe by then, as every
        # child that shared our fds has exec'd or been reaped when its spawn
        # returned.
        os.close(fd)
        run.open_pipes -= 1

    def _reap(self) -> None:
        # Cleared first: a SIGCHLD from here on sets it again, and the next
        # turn of `serve` reaps again.
        self.children_changed = False
        self.childless = False
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                self.childless = True  # then no process of any task is left
                return
            if pid == 0:
                return
            run = self.runs.get(pid)
            if run is not None and run.status is None:
                run.status, run.usage = status, usage
                self.ending[pid] = run

    def _take_orders(self, now: float) -> None:
        stop_everything, self.stop_everything, self.orders_waiting = self.stop_everything, False, False
        if stop_everything:
            self._close_feed()  # told to stop: it takes no more tasks
        for run in self.runs.values():
            if run.kill_reason is not None:
                continue
            order = read_record(run.files.beside(KILL), KillRequest)
            if order is None and stop_everything:
                order = KillRequest(reason="Killed", graceSeconds=run.spec.graceSeconds)
            if order is not None:
                run.kill_reason, run.kill_grace = order.reason, order.graceSeconds
                run.kill_deadline = now + max(0.0, order.graceSeconds)
                self.ending[run.pid] = run
                self._signal(run, signal.SIGTERM, self._descendants_of(run))

    def _advance(self, run: _Run, now: float) -> float | None:
        """Move one task towards its end; returns when to look at it again."""
        in_grace = run.kill_deadline is not None and now < run.kill_deadline
        if run.status is None:
            if run.kill_deadline is None:
                return None  # running: its exit or an order wakes us
            if in_grace:
                return run.kill_deadline
            if now >= run.next_sweep:
                self._signal(run, signal.SIGKILL, self._descendants_of(run))
                run.escalated = True
                run.next_sweep = now + _RESWEEP_SECONDS
            return run.next_sweep
        if run.drain_deadline is None:
            if now < run.next_sweep:
                return run.next_sweep
            leftovers = self._leftovers(run)
            if leftovers:
                # Killed at once after a normal exit; after a stop order they
                # get what is left of the grace period.
                run.next_sweep = now + _RESWEEP_SECONDS
                if in_grace:
                    return min(run.next_sweep, run.kill_deadline or run.next_sweep)
                self._signal(run, signal.SIGKILL, leftovers)
                run.escalated = run.escalated or run.kill_deadline is not None
                return run.next_sweep
            run.drain_deadline = now + _DRAIN_SECONDS
        if run.open_pipes and now < run.drain_deadline:
            return run.drain_deadline
        self._finish(run)
        return None

    def _watch(self, now: float) -> None:
        """Every WATCH_SECONDS: a task whose cgroup v1 saw an OOM kill is ended
        whole (v1 kills one process; v2's memory.oom.group does this itself);
        every WORK_DIR_LOOK_SECONDS: a task whose working directory holds more
        than its bound is ended (local_limits.work_dir_bytes)."""
        self.next_watch = now + local_limits.WATCH_SECONDS
        if self.cgroups_left:
            self.cgroups_left = [cgroup for cgroup in self.cgroups_left if not cgroup.release()]
        look_at_disks = now >= self.next_disk_look
        if look_at_disks:
            self.next_disk_look = now + local_limits.WORK_DIR_LOOK_SECONDS
        for run in list(self.runs.values()):
            if run.kill_reason is not None or run.status is not None:
                continue
            cgroup = run.limits.cgroup
            if cgroup is not None and cgroup.version == 1 and cgroup.oom_killed():
                self._end_for(run, now, local_limits.OOM_REASON, _oom_message(run))
            elif look_at_disks and run.limits.work_dir_bytes is not None:
                used = local_limits.disk_usage(run.spec.work_dir, run.limits.work_dir_bytes)
                if used >= run.limits.work_dir_bytes:
                    self._end_for(run, now, local_limits.WORK_DIR_FULL_REASON, _work_dir_message(run))

    def _end_for(self, run: _Run, now: float, reason: str, message: str) -> None:
        """End a task at once (SIGKILL to all of it) for a bound it passed."""
        run.kill_reason, run.kill_message, run.kill_grace = reason, message, 0.0
        run.kill_deadline = now
        self.ending[run.pid] = run
        self._signal(run, signal.SIGKILL, self._descendants_of(run))

    def _leftovers(self, run: _Run) -> list[int]:
        """Live processes of a task whose main process has exited.

        Those still in its group, and our children that carry its marker: any
        of its processes whose parent died was re-parented to us (subreaper),
        so killing what we find uncovers the next generation on the next look.
        """
        if self.childless:
            return []
        found = [
            pid
            for pid in local_procs.children(self.pid)
            if pid not in self.runs and local_procs.has_marker(pid, run.marker)
        ]
        try:
            os.killpg(run.pid, 0)
            found.append(-run.pid)  # the group still has members
        except (ProcessLookupError, PermissionError):
            pass
        if run.limits.cgroup is not None:
            found.extend(pid for pid in run.limits.cgroup.pids() if local_procs.start_ticks(pid) is not None)
        return found

    def _descendants_of(self, run: _Run) -> list[int]:
        return [
            pid
            for pid in local_procs.descendants(self.pid)
            if pid != run.pid and local_procs.has_marker(pid, run.marker)
        ]

    def _signal(self, run: _Run, sig: int, pids: list[int]) -> None:
        local_procs.signal_group(run.pid, sig)
        if run.limits.cgroup is not None:
            run.limits.cgroup.kill(sig)
        local_procs.signal_each((pid for pid in pids if pid > 0), sig)

    # -- end -----------------------------------------------------------------

    def _finish(self, run: _Run) -> None:
        for fd in run.pipe_fds:
            # (a number closed at EOF may be another task's pipe by now)
            if fd in self.pipes and self.pipes[fd][0] is run:
                self._close_pipe(fd)
        run.output.close()
        run.errors.close()
        del self.runs[run.pid]
        del self.ending[run.pid]
        self._write_exit(run.files, run.spec.slug, self._exit_record(run))
        # (_advance has just found no process of the task left in it)
        if run.limits.cgroup is not None and not run.limits.cgroup.release(empty=True):
            # A process of it still on its way out (v1 lists it, or refuses
            # the rmdir, for a moment): tried again on the next look, and
            # before we exit. (v1: back to the pool once empty: local_limits.)
            self.cgroups_left.append(run.limits.cgroup)

    def _exit_record(self, run: _Run) -> ExitRecord:
        status = run.status or 0
        signal_number = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        # Shell convention (and OpenPAI's exit spec): death by signal N reads 128+N.
        exit_code = 128 + signal_number if signal_number else os.waitstatus_to_exitcode(status)
        cgroup = run.limits.cgroup
        usage = run.usage
        peak = cgroup.peak_memory_mb() if cgroup else None
        if peak is None and usage is not None and usage.ru_maxrss > run.shim_peak_kb:
            # The largest single process. The kernel counts the spawning shim's
            # pages at exec, so a task that stayed smaller than the shim has no
            # peak we can tell apart from the shim's (reported as unknown).
            peak = -(-usage.ru_maxrss // 1024)
        reason, message = "", ""
        if run.kill_reason is not None:
            reason = run.kill_reason
            message = run.kill_message or (
                f"stopped: SIGTERM, then SIGKILL after {run.kill_grace:g}s"
                if run.escalated
                else "stopped: SIGTERM"
            )
        elif cgroup is not None and cgroup.oom_killed():
            reason, message = local_limits.OOM_REASON, _oom_message(run)
        elif exit_code != 0 and run.limits.work_dir_bytes is not None and (
            signal_number == signal.SIGXFSZ
            or local_limits.disk_usage(run.spec.work_dir, run.limits.work_dir_bytes) >= run.limits.work_dir_bytes
        ):
            # A failed task that reached its bound (a file stopped at RLIMIT_FSIZE:
            # SIGXFSZ, or EFBIG where the program ignores it) is told as that.
            reason, message = local_limits.WORK_DIR_FULL_REASON, _work_dir_message(run)
        elif run.output.disk_full or run.errors.disk_full:
            reason = DISK_FULL_PLATFORM_REASON
            message = "the task's log was cut short: no space left on device on the launcher's data disk"
        return ExitRecord(
            exitCode=exit_code,
            signal=signal_number,
            platformReason=reason,
            platformMessage=message,
            memoryPeakMB=peak,
            startedAt=run.started_at,
            finishedAt=time.time(),
            logDroppedBytes=run.output.dropped_bytes,
            outputBytes=run.output_bytes,
            cpuSeconds=round(usage.ru_utime + usage.ru_stime, 6) if usage else None,
        )

    def _write_exit(self, files: TaskFiles, slug: str, record: ExitRecord) -> None:
        data = encode(record)
        append_exit(files, data)
        # The record rides on the bell, so the backend need not open the file it
        # just heard of; one too long for a datagram is read from the file.
        told = b"\n" + data if len(data) <= MAX_TOLD_RECORD_BYTES else b""
        self.doorbell.ring(FINISHED_BELL + slug.encode() + told)

    def _end_strays(self) -> None:
        """Every task has ended; any descendant left (one that scrubbed its
        marker) belongs to one of them: none may outlive the shim.

        With no child left (wait4: ECHILD) there is no descendant either: an
        orphaned descendant is re-parented to us (subreaper), so every live one
        has a chain of parents up to a child of ours. Then the walk of all of
        /proc, which costs more than a trivial task, is skipped."""
        self._reap()
        if self.childless:
            return
        for _ in range(20):
            strays = local_procs.descendants(self.pid)
            if not strays:
                break
            local_procs.signal_each(strays, signal.SIGKILL)
            time.sleep(_RESWEEP_SECONDS)
            self._reap()
        self._reap()


def _oom_message(run: _Run) -> str:
    return f"out of memory: the task's memory limit of {run.spec.memoryMB} MiB was exceeded"


def _work_dir_message(run: _Run) -> str:
    return (
        f"disk quota exceeded: the task's working directory reached its bound of {run.spec.workDirMB} MiB "
        "(no file grows past it, and the task is ended when all of them together pass it)"
    )


def _provide_work_dir(spec: ShimSpec) -> None:
    """The task's working directory, 0700, its user's alone: the one of an
    ended task the backend offered (`takeOverWorkDir`), if it was left bare,
    else a new one.

    Creating a directory is the costliest step of a quiet task's start on
    ext4 (without a journal, each creation soon after many deletions steps
    over every inode freed recently: half a millisecond), and removing it at
    retention costs again, while most trivial tasks never write to theirs. A
    bare one renamed is what a new one is: empty, no extended attribute but
    the security module's, 0700, the new task's user's."""
    work = spec.work_dir
    offered = spec.takeOverWorkDir
    if offered and os.path.dirname(offered) == os.path.dirname(work) and _take_over_work_dir(offered, work, spec):
        return
    os.mkdir(work, PRIVATE_DIR_MODE)
    if spec.uid is not None and spec.gid is not None:
        os.chown(work, spec.uid, spec.gid)


def _take_over_work_dir(ended: str, work: str, spec: ShimSpec) -> bool:
    """Rename the working directory of an ended task to `work`, made the new
    task's, if it is bare; False, and `ended` put back as it was, if not.

    It is looked at once it is the new task's alone (0700, its owner): until
    then a process of the old task's user (a stray that scrubbed its marker,
    which the shim ends only when it exits, or another job that drew the same
    uid) could put a file there and keep it open to read what the new task
    writes. Through one descriptor: a look by path costs more than the rename."""
    try:
        os.rename(ended, work)
    except OSError:
        return False  # e.g. removed meanwhile (retention)
    try:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            if _made_own_if_bare(fd, spec):
                return True
        finally:
            os.close(fd)
    try:
        os.rename(work, ended)
    except OSError:
        pass  # then a new directory cannot be made either: the task fails to launch, saying why
    return False


def _made_own_if_bare(fd: int, spec: ShimSpec) -> bool:
    """Make the directory open on `fd` the task's; True if it is bare then,
    else it gets its owner and mode back."""
    try:
        before = os.fstat(fd)
    except OSError:
        return False
    try:
        if spec.uid is not None and spec.gid is not None:
            os.fchown(fd, spec.uid, spec.gid)
        os.fchmod(fd, PRIVATE_DIR_MODE)
        if _bare_dir(fd):
            return True
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.fchown(fd, before.st_uid, before.st_gid)
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IMODE(before.st_mode))
    return False


def _bare_dir(fd: int) -> bool:
    """No entry, and no extended attribute (an ACL, or data) but a security
    module's label, which every file carries where one is in force."""
    with os.scandir(fd) as entries:
        if next(entries, None) is not None:
            return False
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            return True  # a filesystem without extended attributes has none to leave
        raise
    return all(name.startswith("security.") for name in names)


def _script_file(script: str) -> int:
    """An in-memory file holding `script`, positioned at its start (close-on-exec:
    only the fd the task is given survives its exec)."""
    fd = os.memfd_create("pai-task-script", os.MFD_CLOEXEC)
    try:
        data = script.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _posix_spawn(request: SpawnRequest) -> int:
    """Spawn the task as our own user (vfork + exec)."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, request.out_w, 1),
        (os.POSIX_SPAWN_DUP2, request.err_w, 2),
    ]
    if request.script_fd is not None:
        actions.append((os.POSIX_SPAWN_DUP2, request.script_fd, SCRIPT_FD))
    # posix_spawn can neither chdir nor set a umask: the task inherits ours,
    # set just for it.
    os.chdir(request.work_dir)
    umask = os.umask(TASK_UMASK)
    try:
        return os.posix_spawn(
            request.program,
            request.argv,
            request.env,
            file_actions=actions,
            setsid=True,  # its own session and process group, led by the task
            setsigdef=_SIGNALS_RESET_FOR_TASK,
            setsigmask=(),
        )
    finally:
        os.umask(umask)
        os.chdir("/")


def _fork_exec_as(request: SpawnRequest) -> int:
    """Start the request's program as its `uid`:`gid` with no other group, in the task's bounds.

    The child: new session, stdin /dev/null, stdout and stderr the log pipes,
    the script (if any) on _script_fd_in_task, every other fd closed, the
    working directory, the mount namespace of its own (`mounts`:
    local_namespaces), the umask, the cgroups joined (while still root),
    setgroups([]), gid, uid, then `fsize_limit` as its RLIMIT_FSIZE (the bound
    on its working directory: no file grows past it) and `data_limit` as its RLIMIT_DATA (soft and
    hard, as `ulimit -d` sets it: a program exec'd without bash), signals a
    task must not find ignored at default, exec. With _spawn_as (vfork) when
    it was built, else with subprocess's fork.

    A failure before or at the exec is raised here as OSError with its errno
    (the task's LaunchFailed, or bash's turn for a program exec'd directly),
    as posix_spawn would; the failed child has been reaped."""
    assert request.uid is not None and request.gid is not None, "a task as the shim's user: _posix_spawn"
    # _spawn_as takes the mount plan without binds (its five first fields): a task
    # that binds storages, or the platform's directories under /tmp (PAI installed
    # there), is started by subprocess's fork, whose child binds them in Python
    # (local_namespaces.enter). The common case keeps the vfork.
    mounts = request.mounts
    if _spawn_as is not None and not (mounts is not None and mounts.in_python):
        return _spawn_as.spawn_as(
            request.program, request.argv, [f"{name}={value}" for name, value in request.env.items()],
            request.work_dir, _dev_null(), request.out_w, request.err_w,
            -1 if request.script_fd is None else request.script_fd,
            request.uid, request.gid, TASK_UMASK, request.cgroup_procs, request.data_limit, _SIGNALS_RESET_FOR_TASK,
            None if mounts is None else tuple(mounts)[:5], request.fsize_limit,
        )
    return _subprocess_fork_exec_as(request)


def _script_fd_in_task(script_fd: int, as_other_user: bool) -> int:
    """The fd on which a task finds the script the shim put on `script_fd`:
    SCRIPT_FD, where posix_spawn and _spawn_as move it; subprocess's fork (a
    task run as another user without _spawn_as) keeps the shim's number."""
    return script_fd if as_other_user and _spawn_as is None else SCRIPT_FD


def _subprocess_fork_exec_as(request: SpawnRequest) -> int:
    """_fork_exec_as without _spawn_as: subprocess's C child
    (_posixsubprocess.fork_exec), a real fork. It resets only SIGPIPE and
    SIGXFSZ (the shim catches every other signal a task must not find ignored:
    _catch_ignored_signals), and runs its only Python step (preexec_fn) after
    setuid: a task that joins a cgroup or enters a mount namespace, which
    must happen while still root, or gets a data limit, drops its groups and
    uid in that Python step instead, after those. A failure comes back
    through a close-on-exec pipe."""
    uid, gid, work_dir, mounts = request.uid, request.gid, request.work_dir, request.mounts
    assert uid is not None and gid is not None, "a task as the shim's user: _posix_spawn"
    cgroup_procs, data_limit, fsize_limit = request.cgroup_procs, request.data_limit, request.fsize_limit
    report_r, report_w = os.pipe()
    keep = sorted({report_w} | ({request.script_fd} if request.script_fd is not None else set()))
    preexec = None
    in_python = bool(cgroup_procs) or data_limit is not None or mounts is not None or fsize_limit is not None
    if in_python:

        def preexec() -> None:
            if mounts is not None:
                local_namespaces.enter(mounts)
                os.chdir(work_dir)  # the directory at its path in the new namespace
            for procs in cgroup_procs or ():
                with open(procs, "w") as joined:
                    joined.write(str(os.getpid()))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            if fsize_limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
            if data_limit is not None:  # last: the child's own steps must not meet it
                resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    try:
        pid = _c_fork_exec(request, (report_r, report_w), tuple(keep), preexec)
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    try:
        failure = b""
        while chunk := os.read(report_r, 4096):
            failure += chunk
    finally:
        os.close(report_r)
    if failure:
        os.waitpid(pid, 0)
        number, step = _child_failure(failure)
        if number:
            raise OSError(number, f"{os.strerror(number)} ({step}, as uid {uid})", request.program)
        raise OSError(f"the task could not be started as uid {uid}: {step}")
    return pid


# Positional arguments of _posixsubprocess.fork_exec in CPython 3.11 to 3.13
# (subprocess.py is its only documentation), and whether this interpreter
# takes the last one, allow_vfork.
_FORK_EXEC_TAKES_ALLOW_VFORK = True


def _c_fork_exec(
    request: SpawnRequest, report: tuple[int, int], keep: tuple[int, ...], preexec: Callable[[], None] | None,
) -> int:
    """subprocess's C child for `request`, its failure reported on the pipe `report`
    (read end, write end), the fds `keep` left open. With `preexec` the child drops
    its groups and uid in that Python step (after what must happen as root); without
    it, the C child does."""
    global _FORK_EXEC_TAKES_ALLOW_VFORK
    assert request.uid is not None and request.gid is not None, "a task as the shim's user: _posix_spawn"
    env_list = [f"{name}={value}".encode() for name, value in request.env.items()]
    in_python = preexec is not None
    groups: list[int] | None = None if in_python else []  # None: left as they are (preexec drops them)
    args = (
        request.argv, (os.fsencode(request.program),),
        True, keep,  # close_fds, fds_to_keep
        request.work_dir, env_list,
        _dev_null(), -1, -1, request.out_w, -1, request.err_w,  # p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite
        *report,  # errpipe_read, errpipe_write
        True, True, -1,  # restore_signals, call_setsid, pgid_to_set
        -1 if in_python else request.gid,  # gid
        groups,  # extra_groups
        -1 if in_python else request.uid,  # uid
        TASK_UMASK,
        preexec,
    )
    if _FORK_EXEC_TAKES_ALLOW_VFORK:
        try:
            return _posixsubprocess.fork_exec(*args, True)
        except TypeError:
            _FORK_EXEC_TAKES_ALLOW_VFORK = False  # an interpreter without it (3.14+?)
    return _posixsubprocess.fork_exec(*args)


def _child_failure(report: bytes) -> tuple[int, str]:
    """subprocess's child report, `OSError:<hex errno>:[noexec]` or
    `SubprocessError:0:<message>`: the errno (0: none) and the step, in words."""
    kind, _, rest = report.decode(errors="replace").partition(":")
    code, _, detail = rest.partition(":")
    if kind == "OSError":
        try:
            number = int(code, 16)
        except ValueError:
            return 0, report.decode(errors="replace")
        step = "before exec" if detail.startswith("noexec") else "exec"
        return number, step + (": " + detail[7:] if detail[7:] else "")
    return 0, f"{kind}: {detail}"


_null_fd: int | None = None


def _dev_null() -> int:
    """One /dev/null per shim for every task's stdin (close-on-exec: the child
    gets it as fd 0 only)."""
    global _null_fd
    if _null_fd is None:
        _null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _null_fd


def _catch_ignored_signals() -> None:
    """A signal the shim ignores (inherited: SIGINT from the fork server, SIGHUP
    under nohup, SIGQUIT in the background) would stay ignored in its tasks across exec, and the C child
    resets only SIGPIPE and SIGXFSZ. Caught instead, by a handler that does
    nothing, it is still ignored by the shim, and reset to default by the exec."""
    for sig in _SIGNALS_RESET_FOR_TASK - {signal.SIGPIPE, signal.SIGXFSZ}:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, _ignore)


def _ignore(_signum: int, _frame: object) -> None:
    pass


def _drain(fd: int) -> None:
    """Read what woke us (a byte per signal); anything left wakes us again."""
    try:
        os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        pass
