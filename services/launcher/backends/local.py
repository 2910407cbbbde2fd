"""The local backend: every task instance is a process group on this machine.

How a task runs (local_layout: the files; local_forkserver, local_shim: the processes):
- `start` sends the task's spec to a fork server (our child), which forks a
  shim for it (or one for several, under a burst). The shim claims the task by
  creating its record `<data_dir>/tasks/<slug>` (O_EXCL: it fails if it exists,
  so a key runs at most once, also across launcher restarts, and a second
  `start` only watches; local_layout), then runs
  the commands, joined by newlines, as `bash --noprofile --norc -e -c` in a new
  session: one command after another, stopping at the first that fails
  (bash's errexit rules, like a CI step), in its working directory
  `<data_dir>/work/<slug>/` (new, or the bare one of a task that ended,
  renamed: local_layout), stdin from /dev/null. Commands that are one
  simple command (`true`, `python3 train.py --epochs=3`: words only, no
  builtin, no shell syntax, no secrets) are exec'd by the shim itself, with
  the argv, environment, directory and bounds bash would have given them,
  which saves bash's start; what bash alone can do (a missing or unrunnable
  program, a script without #!) still goes to bash, so its messages and exit
  codes (127, 126) are the ones users see (local_direct).
- Users (local_users): when the launcher runs as root, each job's tasks run
  under a uid of the job's own, never root; the shim stays privileged and
  drops privileges only for the task's shell. The task reaches its working
  directory (0700, its own) and nothing else of the data dir: `tasks/` (specs,
  logs, exits) is 0700 and its files 0600.
- Secrets: `start(launch, secret_commands=...)` gives the commands with the
  job's secrets filled in; they travel to the shim over the fork server's pipe
  and to the task's shell through an in-memory file, never into spec.json
  (which keeps the references) or any other file.
- Environment: PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ and
  TMPDIR from the launcher (PATH defaults to the usual system one, SHELL to
  the bash that runs the task: without SHELL, bash looks its user up in the
  user database at every start, a third of a millisecond; a task
  that runs as another user gets HOME = its working directory and USER,
  LOGNAME = the task user), then
  `launch.env` (PAI_*, CUDA_VISIBLE_DEVICES), then PAI_WORK_DIR (the task's
  working directory) and PAI_TASK_KEY (the task's slug, which marks its
  processes).
- Logs: `<slug>.output.log` (stdout and stderr interleaved as they arrive) and
  `<slug>.stderr.log`, beside the record, each capped at `log_cap_bytes`
  keeping the newest output (local_logs). TaskFinished carries the last 64 KiB
  of the output log.
- Bounds: cgroup v2 where allowed, else RLIMIT_DATA, else none (local_limits);
  TaskRunning.detail says which ("limits: ..."). Without a container engine,
  `dockerImageUri` is recorded and reported there as ignored.
- Containers: with a container engine (`container_engine`, engine.py), a task
  whose role names an image runs in a container of it instead
  (local_containers); TaskRunning.runtimeMode says which mode ran a task.
- Stop: `kill` leaves an order (reason, grace) beside the record and signals the
  shim, which sends SIGTERM to every process of the task (its group, its
  cgroup, and the descendants that carry its marker, including those that
  called setsid), and SIGKILL to whatever is left after the grace period; the
  order survives a launcher crash. The TaskFinished carries the given reason
  ("Killed" if none) as platformReason. A stop that comes before any shim
  claimed the task cancels it: it never starts. `kill` returns once the exit
  is recorded.
- Events: shims ring an abstract unix datagram socket (local_doorbell) when a
  task runs and when it ended; a sweep (every `sweep_interval_seconds`)
  catches a missed ring, sends again what a dead fork server never handed
  out, and notices dead shims.
- Restart: shims do not depend on the launcher. `recover` re-adopts tasks
  whose shim lives (sending their TaskRunning again), reports tasks that ended
  meanwhile with their real exit, and reports a task whose shim died without
  recording its exit as platformReason "Lost" after killing what is left of it
  (nobody could report its exit otherwise). Until `forget`, a task is reported
  again after every restart. One launcher per data dir: a second one is refused.
- Exit codes: a task killed by signal N exits 128+N with `signal` set; a task
  that never ran or was lost has exit code -1 and a platformReason
  ("LaunchFailed", "Lost", or the stop reason).
- Peak memory: with cgroup v2 the task's `memory.peak`; otherwise the largest
  resident size of a single process (getrusage), reported only when it is
  larger than the shim (the kernel counts the spawning shim's pages at exec).
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
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from libs.common.errors import NotFound
from libs.common.protocol.tensorboard import PORT_LABEL as TENSORBOARD_PORT
from services.launcher import metrics
from services.launcher.backends import (
    engine as engine_api,
    local_containers,
    local_forkserver,
    local_limits,
    local_namespaces,
    local_procs,
    local_shim,
    local_uids,
    local_users,
    terminals,
)
from services.launcher.backends.local_doorbell import (
    BELL_SEPARATOR,
    CREDENTIALS_SPACE,
    FINISHED_BELL,
    RUNNING_BELL,
    doorbell_address,
    doorbell_name,
    listen_with_credentials,
    sender_of,
)
from services.launcher.backends.local_layout import (
    DEFAULT_PIDS_MAX,
    DEFAULT_WORK_DIR_MB,
    KILL,
    LIMITS_CGROUP,
    LIMITS_CGROUP_V1,
    LIMITS_NONE,
    LIMITS_RLIMIT,
    OUTPUT_LOG,
    PRIVATE_DIR_MODE,
    SECRET_SEPARATOR,
    TASK_KEY_ENV,
    TASKS_DIR,
    TRAVERSE_ONLY_MODE,
    UNKNOWN_EXIT_CODE,
    WORK_DIR_ENV,
    ExitRecord,
    KillRequest,
    ShimRecord,
    ShimSpec,
    TaskFiles,
    append_exit,
    choose_work_root,
    claim,
    decode_record,
    encode,
    is_record_name,
    make_own_dir,
    mark_reported,
    read_task,
    read_task_exit,
    read_task_spec,
    remove_task_files,
    with_sent_at,
    write_and_close,
    write_replacing,
)
from services.launcher.backends.local_logs import read_log
from services.launcher.backends.local_shim import BASH
from services.launcher.core.tasks import (
    BackendEvent,
    TaskFinished,
    TaskKey,
    TaskLaunch,
    TaskRunning,
)

log = logging.getLogger(__name__)

MIB = 1024 * 1024
USER_LOG_TAIL_BYTES = 64 * 1024
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIMIT_CHOICES = ("auto", LIMITS_CGROUP, LIMITS_RLIMIT, LIMITS_NONE)
# How long past the grace period `kill` trusts the shim to finish a stop.
STOP_MARGIN_SECONDS = 5.0
_STOP_POLL_SECONDS = 0.05
# Starts between two turns of the event loop (`start`).
STARTS_PER_YIELD = 8
# A task record still without its spec this long after it was created belongs
# to a claimer that died in between.
CLAIM_WRITE_SECONDS = 10.0
# A task sent to the fork server but claimed by no shim this long after is sent
# again (a shim that died, or was stopped, before it read its feed; a second
# copy is harmless: only one shim can claim the task, and a copy read more than
# local_layout.STALE_LINE_SECONDS after it was sent is dropped, so that it
# cannot find the task's directory pruned long after it ran).
RESEND_SECONDS = 10.0
# At most one log line per this many seconds about doorbell datagrams dropped
# because no shim sent them (their count is a metric).
FORGED_BELL_LOG_SECONDS = 60.0
# How often, at most, /proc is read for the processes of jobs whose uids wait for release.
UID_RELEASE_SECONDS = 10.0
# Ended tasks' working directories remembered to be offered to new tasks; a
# burst's worth (those past it simply stay, as every used one does).
ENDED_WORK_DIRS_KEPT = 1024
_PROJECT_ROOT = Path(__file__).resolve().parents[3]
_encoder = msgspec.json.Encoder()


class TaskSpec(ShimSpec, frozen=True, kw_only=True, omit_defaults=True):
    """A task's spec as the backend writes it: the shim's part plus what recovery needs."""

    key: TaskKey
    node: str
    gpu: int = 0
    ports: dict[str, list[int]] = {}
    dockerImageUri: str | None = None
    submittedAt: float = 0.0


class _Task:
    __slots__ = (
        "key", "files", "node", "image", "spec_line", "sent_generation", "sent_at",
        "claim", "running_reported", "finished",
    )

    def __init__(self, key: TaskKey, files: TaskFiles, node: str, image: str | None):
        self.key = key
        self.files = files
        self.node = node
        self.image = image
        self.spec_line: bytes | None = None  # kept until a shim claims the task
        self.sent_generation = -1
        self.sent_at = 0.0  # time.monotonic() of the last send
        self.claim: ShimRecord | None = None
        self.running_reported = False
        self.finished = asyncio.Event()


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
        task_user: str | None = None,
        shim_feed_seconds: float = local_forkserver.SHIM_FEED_SECONDS,
        pids_max: int = DEFAULT_PIDS_MAX,
        work_dir_mb: int = DEFAULT_WORK_DIR_MB,
        announce: bool = True,
        container_engine: str = "none",
        container_mounts: Callable[[TaskLaunch], list[local_containers.Mount]] | None = None,
    ):
        """`shim_feed_seconds`: how long a shim is sent more tasks after it was
        forked (local_forkserver; 0: a shim per batch of tasks waiting together).
        `pids_max`: processes and threads per task (cgroup pids.max);
        `work_dir_mb`: the bound on a task's working directory (local_limits);
        `announce`: log how tasks are isolated (not for a backend made only to stop them);
        `container_engine`: "none", "auto" or an engine's socket (engine.connect): tasks
        with an image run in containers when there is one; `container_mounts`: the bind
        mounts of a launch's container (default: its storages, core/mounts.py)."""
        if limits not in LIMIT_CHOICES:
            raise ValueError(f"limits must be one of {LIMIT_CHOICES}, not {limits!r}")
        self.data_dir = Path(data_dir).resolve()
        self.tasks_dir = self.data_dir / TASKS_DIR
        self._tasks_path = str(self.tasks_dir)
        # task_user None: tasks run as the launcher's user (tests, tools);
        # otherwise, when root, as users of their own (local_users).
        self.task_users = local_users.resolve(task_user)
        if announce and self.task_users is not None:
            log.info("tasks run as users of their own; started with %s", local_shim.SPAWN_AS)
        elif announce:
            log.warning(
                "tasks run as the launcher's own user (uid %d): their reports to it cannot be told from "
                "their shims' (the doorbell's sender check needs tasks under other uids: run PAI as root "
                "with task_user set)", os.getuid(),
            )
        # Outside the data dir when a directory above it bars the tasks' users (local_layout).
        self.work_root = choose_work_root(self.data_dir, tasks_are_other_users=self.task_users is not None)
        self._work_root_path = str(self.work_root)
        # Working directories of tasks whose shims reported their end, newest
        # last: each is offered to one task started next, which takes it over
        # if it was left bare (local_shim._provide_work_dir). Only those a shim
        # reported: it had ended every process of the task first.
        self._ended_work_dirs: deque[str] = deque(maxlen=ENDED_WORK_DIRS_KEPT)
        # Traverse-only on the way to a task's working directory; the rest private.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tasks_dir.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        make_own_dir(self.work_root, TRAVERSE_ONLY_MODE)
        for path, mode in ((self.data_dir, TRAVERSE_ONLY_MODE), (self.tasks_dir, PRIVATE_DIR_MODE)):
            os.chmod(path, mode)
        # Each job's uid, allocated and recorded (local_uids); None: tasks run as we do.
        self.uids = local_uids.open_registry(self.data_dir, self.tasks_dir) if self.task_users is not None else None
        # Jobs whose files retention removed: their uids go back once no process runs under them.
        self._uids_to_release: set[str] = set()
        self._prune_refused: set[str] = set()  # jobs with a task attempt prune left in place
        self._uids_checked_at = -UID_RELEASE_SECONDS
        # Every declared node maps onto this machine; placements name any of them.
        self.node_names = list(node_names or [socket.gethostname()])
        self.log_cap_bytes = log_cap_bytes
        self.grace_seconds = grace_seconds
        self.sweep_interval_seconds = sweep_interval_seconds
        self.shim_feed_seconds = shim_feed_seconds
        self._clock = clock
        self.limits_mode, self._cgroup_parent, self._cgroup_parents_v1 = _choose_limits(
            limits, cgroup_root, cgroup_parent, local_limits.v1_parent_name(self.data_dir)
        )
        self.pids_max = pids_max
        self.work_dir_mb = work_dir_mb
        # A mount namespace per task (local_namespaces): for tasks under uids of their own.
        self.private_mounts = self.task_users is not None and local_namespaces.probe() is None
        self._dead_cgroups = False  # a task was declared lost: its cgroups wait for removal
        if announce:
            _warn_if_unisolated(self.limits_mode, self.task_users is not None, self.private_mounts)
        self._doorbell = doorbell_name(self.data_dir)
        self._tasks: dict[str, _Task] = {}
        # Reports not taken yet (`event_batches`): a list and a wake-up rather than
        # an asyncio.Queue, whose put and get cost a future and a task step per report.
        self._reports: deque[BackendEvent] = deque()
        self._reported = asyncio.Event()
        self._reports_end = False
        self._base_env = _inherited_env()
        # What a task running the platform's TensorBoard must see of the platform.
        self._platform_dirs = _platform_dirs(self._base_env)
        self._bell: socket.socket | None = None
        # Whom the doorbell believes: shims are forks of our fork server and keep
        # our real uid (what SCM_CREDENTIALS carries when a sender claims none).
        self._shim_uid = os.getuid()
        self._forged_unlogged = 0
        self._forged_logged_at = -FORGED_BELL_LOG_SECONDS
        self._server: asyncio.subprocess.Process | None = None
        self._server_generation = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        # Task lines for the fork server not written yet (one write per turn of the loop).
        self._outgoing: list[bytes] = []
        self._starts_unyielded = 0
        self._container_engine = container_engine
        self._container_mounts = container_mounts
        # Set up by _ensure_running once the engine answered; None: process mode only.
        self.containers: local_containers.ContainerTasks | None = None
        self._containers_checked = False

    # -- Backend -------------------------------------------------------------

    async def recover(self) -> list[TaskKey]:
        await self._ensure_running()
        known = await self.containers.recover() if self.containers is not None else []
        for entry in sorted(os.scandir(self.tasks_dir), key=lambda e: e.name):
            if not is_record_name(entry.name):
                continue
            task = self._tasks.get(entry.name) or self._adopt(TaskFiles(entry.path, in_dir=entry.is_dir()))
            if task is not None:
                known.append(task.key)
                self._check(task)
        self._remove_dead_cgroups()
        return known

    async def start(self, launch: TaskLaunch, *, secret_commands: list[str] | None = None) -> None:
        """Start a task once; `secret_commands`: its commands with the job's
        secrets filled in (launch.commands keep the references), given to the
        task through memory only."""
        await self._ensure_running()
        slug = launch.key.slug
        if slug in self._tasks:
            return
        if self.containers is not None and launch.dockerImageUri:
            await self.containers.start(launch, secret_commands=secret_commands)
            return
        task_path = os.path.join(self._tasks_path, slug)
        node = launch.placement.node or self.node_names[0]
        found = TaskFiles.found(task_path)
        task = _Task(launch.key, found or TaskFiles(task_path), node, launch.dockerImageUri)
        self._tasks[slug] = task
        if found is not None:
            return  # started before, perhaps by an earlier launcher: watch, never rerun
        identity = (None, None)
        if self.task_users is not None and self.uids is not None:
            identity = (self.uids.uid_of(launch.key.job), self.task_users.gid)
        work_dir = os.path.join(self._work_root_path, slug)
        spec = TaskSpec(
            taskPath=task_path,
            workDir=work_dir,
            takeOverWorkDir=self._ended_work_dirs.pop() if self._ended_work_dirs else "",
            uid=identity[0],
            gid=identity[1],
            key=launch.key,
            slug=slug,
            node=node,
            commands=launch.commands,
            env=self._task_env(launch, work_dir, slug),
            cpu=launch.cpu,
            memoryMB=launch.memoryMB,
            gpu=launch.gpu,
            ports=launch.ports,
            limits=self.limits_mode,
            cgroupParent=str(self._cgroup_parent or ""),
            cgroupParents=self._cgroup_parents_v1,
            pidsMax=self.pids_max,
            privateMounts=self.private_mounts,
            storages=launch.storages,
            # Only a task the tensorboard plugin gave its port runs the platform's
            # TensorBoard: the others keep _spawn_as's vfork where PAI lies under /tmp.
            platformDirs=list(self._platform_dirs) if TENSORBOARD_PORT in launch.ports else [],
            workDirMB=self.work_dir_mb,
            graceSeconds=self.grace_seconds,
            logCapBytes=self.log_cap_bytes,
            dockerImageUri=launch.dockerImageUri,
            submittedAt=self._clock(),
        )
        task.spec_line = encode(spec) + b"\n"
        if secret_commands is not None:
            task.spec_line = encode(spec) + SECRET_SEPARATOR + _encoder.encode(secret_commands) + b"\n"
        self._send(task)
        # Let the doorbell be read between starts: shims wait while its queue
        # (net.unix.max_dgram_qlen, often 10) is full. Every few starts, not
        # after each: each turn of the loop costs a poll, and the lines sent
        # meanwhile leave in one write.
        self._starts_unyielded += 1
        if self._starts_unyielded >= STARTS_PER_YIELD:
            self._starts_unyielded = 0
            await asyncio.sleep(0)

    async def kill(self, key: TaskKey, *, grace_seconds: float, reason: str) -> None:
        await self._ensure_running()
        reason = reason or "Killed"
        if self.containers is not None and self.containers.owns(key.slug):
            await self.containers.kill(key, grace_seconds=grace_seconds, reason=reason)
            return
        task = self._tasks.get(key.slug)
        if task is None:
            files = self._files_on_disk(key.slug)
            # Unknown, finished and recorded, or claimed but not written: nothing runs.
            task = self._adopt(files, quietly=True) if files is not None else None
            if task is None:
                return
        if task.finished.is_set():
            return
        claimed = claim(task.files.path)
        if claimed is not None:
            self._cancel(task, reason, claimed)  # no shim took it yet: it never starts
            return
        claim_record = await self._wait_for_claim(task)
        if claim_record is None or task.finished.is_set() or read_task_exit(task.files) is not None:
            self._check(task)
            return
        write_replacing(task.files.beside(KILL), encode(KillRequest(reason=reason, graceSeconds=grace_seconds)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds + STOP_MARGIN_SECONDS
        if _alive(claim_record):  # checked first: a reused pid must not get our signal
            local_procs.signal_each([claim_record.shimPid], signal.SIGUSR1)
        while not task.finished.is_set():
            if read_task_exit(task.files) is not None or not _alive(claim_record):
                self._check(task, stop_reason=reason)
            elif loop.time() > deadline:
                # The shim did not end the task in time: end its processes
                # ourselves; the shim (which may run other tasks) records the exit.
                log.error("stop of %s overran its grace period; killing it directly", key.slug)
                self._kill_orphans(task)
                try:
                    await asyncio.wait_for(task.finished.wait(), STOP_MARGIN_SECONDS)
                except TimeoutError:
                    log.error("shim %d did not record the stop of %s", claim_record.shimPid, key.slug)
                return
            try:
                await asyncio.wait_for(task.finished.wait(), _STOP_POLL_SECONDS)
            except TimeoutError:
                pass

    def events(self) -> AsyncIterator[BackendEvent]:
        return self._event_stream()

    async def event_batches(self, most: int) -> AsyncIterator[list[BackendEvent]]:
        """The reports in lists: every one already there, up to `most`, else the next
        one waited for; whatever arrives while a list is handled makes the next.
        Ends once the backend is closed and every report is taken."""
        reports = self._reports
        while True:
            if not reports:
                if self._reports_end:
                    return
                self._reported.clear()
                await self._reported.wait()
                continue
            if len(reports) <= most:
                batch = list(reports)
                reports.clear()
            else:
                batch = [reports.popleft() for _ in range(most)]
            yield batch

    async def read_log(self, key: TaskKey, *, tail_bytes: int | None = None) -> bytes:
        if self.containers is not None and self.containers.owns(key.slug):
            return await self.containers.read_log(key, tail_bytes=tail_bytes)
        files = self._files_on_disk(key.slug)
        if files is None:
            raise NotFound(f"no local task {key.slug}")
        return await asyncio.to_thread(
            read_log, Path(files.beside(OUTPUT_LOG)), cap_bytes=self.log_cap_bytes, tail_bytes=tail_bytes
        )

    async def open_terminal(self, key: TaskKey, *, cols: int, rows: int) -> terminals.TerminalChannel:
        """A shell in the running task `key` for a browser terminal: the engine's exec in
        a container task; in a process task a pty entered as the task is (terminal_enter:
        its cgroups, mount namespace, uid, working directory and environment)."""
        await self._ensure_running()
        if self.containers is not None and self.containers.owns(key.slug):
            return await self.containers.open_terminal(key, cols=cols, rows=rows)
        task = self._tasks.get(key.slug)
        spec = read_task_spec(task.files, TaskSpec) if task is not None and not task.finished.is_set() else None
        # Any process of the task: they share its cgroups and mount namespace.
        pids = local_procs.marked(key.slug, TASK_KEY_ENV) if spec is not None else []
        if spec is None or not pids:
            raise NotFound(f"task {key.role}[{key.index}] of {key.job} has no running process here")
        return await terminals.PtyTerminal.open(
            pid=min(pids), uid=spec.uid, gid=spec.gid, cwd=spec.workDir or os.path.join(spec.taskPath, "work"),
            env=spec.env, mounts=spec.privateMounts, cols=cols, rows=rows)

    async def forget(self, key: TaskKey) -> None:
        slug = key.slug
        task = self._tasks.get(slug)
        # A task this backend runs as a process is never a container's (start sends each
        # to one or the other): only an unknown one is looked for among the containers'
        # records, a file lookup per task otherwise.
        if task is None and self.containers is not None and self.containers.owns(slug):
            await self.containers.forget(key)
            return
        files = task.files if task is not None else self._files_on_disk(slug)
        if files is not None:
            mark_reported(files)
        self._tasks.pop(slug, None)

    async def prune(self, key: TaskKey) -> bool:
        """Remove a finished task attempt's record, logs and working directory
        (retention). A task whose exit is not recorded is left alone, whatever the
        caller thinks. True when something was removed."""
        if self.containers is not None and self.containers.owns(key.slug):
            return await self.containers.prune(key)
        files = self._files_on_disk(key.slug)
        if key.slug in self._tasks or (files is not None and not read_task(files).reported):
            log.warning("not pruning %s: its exit is not recorded", key.slug)
            self._prune_refused.add(key.job)
            return False
        removed = files is not None and await asyncio.to_thread(remove_task_files, files)
        work_dir = self.work_root / key.slug
        if work_dir.exists():
            await asyncio.to_thread(shutil.rmtree, work_dir, True)
            removed = True
        return removed

    def ports_in_use(self, launch: TaskLaunch) -> list[int]:
        """The launch's ports that something on this machine (every node of the
        local backend is this machine) already holds: each is tried with a bind,
        TCP and UDP, on every address (the shell holds the start back and the
        core picks others; core/ports.py). A port bound right after it was tried
        is not seen: the task then fails to bind it, as anywhere."""
        return [port for ports in launch.ports.values() for port in ports if not _port_free(port)]

    def release_job(self, job: str) -> None:
        """Retention removed the files of every task attempt of `job`: its uid goes
        back to the registry once no process runs under it (the sweep looks, for
        every such job at once); kept for good if prune left a task attempt of it.
        A crash before then leaves the uid allocated: never reused, the safe way."""
        if job in self._prune_refused:
            self._prune_refused.discard(job)
            log.warning("keeping the uid of %s: a task attempt of it was not pruned", job)
        elif self.uids is not None and self.uids.get(job) is not None:
            self._uids_to_release.add(job)

    async def _release_uids(self) -> None:
        assert self.uids is not None
        self._uids_checked_at = time.monotonic()
        jobs = {job: uid for job in list(self._uids_to_release) if (uid := self.uids.get(job)) is not None}
        busy = await asyncio.to_thread(local_uids.processes_of, set(jobs.values()))
        for job, uid in jobs.items():
            if uid not in busy:
                self.uids.release(job)
                self._uids_to_release.discard(job)
        self._uids_to_release.difference_update(job for job in list(self._uids_to_release) if self.uids.get(job) is None)

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
        if self.uids is not None:
            self.uids.close()
        if self.containers is not None:
            await self.containers.close()
        if self._server is not None:
            self._write_outgoing()
            await _stop_fork_server(self._server)
        # The free cgroups of the pool (local_limits), once the fork server is
        # gone: a shim that ends after it removes those it pools itself.
        local_limits.remove_pooled(self._cgroup_parents_v1)
        for parent in self._cgroup_parents_v1:  # kept (the kernel refuses) while a task's cgroup is there
            try:
                os.rmdir(parent)
            except OSError:
                pass
        self._reports_end = True
        self._reported.set()

    # -- plumbing ------------------------------------------------------------

    async def _ensure_running(self) -> None:
        if self._closed:
            raise RuntimeError("the local backend is closed")
        if not self._containers_checked:
            await self._connect_engine()
        if self._bell is None:
            bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                listen_with_credentials(bell)  # before bind: no datagram comes without its sender
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
                "services.launcher.backends.local_forkserver",
                self._doorbell,
                str(self.shim_feed_seconds),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                env=_fork_server_env(),
            )
            self._server_generation += 1
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="local-backend-sweep")

    def _send(self, task: _Task) -> None:
        """The task's line to the fork server, with the others sent in this turn of the loop."""
        assert self._server is not None and self._server.stdin is not None
        if task.spec_line is None:
            return
        task.sent_generation = self._server_generation
        task.sent_at = time.monotonic()
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._write_outgoing)
        self._outgoing.append(with_sent_at(task.spec_line, time.time()))

    def _write_outgoing(self) -> None:
        lines, self._outgoing = self._outgoing, []
        if not lines or self._server is None or self._server.stdin is None:
            return
        try:
            self._server.stdin.write(b"".join(lines))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sweep restarts the server and sends again

    def _on_bell(self) -> None:
        """Reports from shims; any other sender's are dropped (local_doorbell: who rang)."""
        assert self._bell is not None
        receive, shim_uid = self._bell.recvmsg, self._shim_uid
        while True:
            try:
                message, ancillary, _flags, _address = receive(65536, CREDENTIALS_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            sender = sender_of(ancillary)
            if sender is None or sender[1] != shim_uid:
                self._drop_forged(message, sender)
                continue
            for part in message.split(BELL_SEPARATOR):  # a shim sends what it rang together
                kind, body = part[:1], part[1:]
                slug, _, detail = body.partition(b"\n")
                task = self._tasks.get(slug.decode(errors="replace"))
                if task is None:
                    continue  # forgotten, or not yet recovered: recover() will see it
                if kind == RUNNING_BELL:
                    task.spec_line = None
                    self._report_running(task, detail.decode(errors="replace"))
                elif kind == FINISHED_BELL:
                    self._report_finished(task, told=detail)

    def _drop_forged(self, message: bytes, sender: tuple[int, int] | None) -> None:
        """A datagram no shim sent (a task's, or one without credentials): counted,
        and logged at most once a FORGED_BELL_LOG_SECONDS (a task may send many)."""
        metrics.FORGED_BELLS.inc()
        self._forged_unlogged += 1
        now = time.monotonic()
        if now - self._forged_logged_at < FORGED_BELL_LOG_SECONDS:
            return
        pid, uid = sender if sender is not None else (-1, -1)
        log.warning(
            "dropped %d doorbell datagram(s) not sent by a shim; the last from pid %d, uid %d, naming %r",
            self._forged_unlogged, pid, uid, message[1:].partition(b"\n")[0][:200].decode(errors="replace"),
        )
        self._forged_unlogged = 0
        self._forged_logged_at = now

    async def _connect_engine(self) -> None:
        """Container mode when `container_engine` gives an engine that answers. A socket
        named outright that does not answer is an error; "auto" without one, process mode."""
        self._containers_checked = True
        engine = await engine_api.connect(self._container_engine)
        if engine is None:
            if self._container_engine != "none":
                log.info("no container engine here: tasks run as processes, their images unused")
            return
        uids, users = self.uids, self.task_users

        def identity(job: str) -> tuple[int, int] | None:
            return (uids.uid_of(job), users.gid) if uids is not None and users is not None else None

        def storage_mounts(launch: TaskLaunch) -> list[local_containers.Mount]:
            # The job's storages at their mount paths, as a process task gets them: a missing
            # hostPath directory made for the tasks' group, one the node lacks raising (named).
            binds = local_namespaces.storage_binds(launch.storages, users.gid if users is not None else None)
            return [local_containers.Mount(b.host_path, b.container_path, b.read_only) for b in binds]

        self.containers = local_containers.ContainerTasks(
            engine, self.data_dir, report=self._report, log_cap_bytes=self.log_cap_bytes, pids_max=self.pids_max,
            identity=identity, mounts=self._container_mounts or storage_mounts, clock=self._clock,
        )
        log.info("tasks with an image run in containers (engine at %s)", engine.socket_path)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_seconds)
            try:
                if self._server is not None and self._server.returncode is not None:
                    await self._ensure_running()
                # One look at each shim per sweep: under a burst one shim runs many tasks.
                shims_alive: dict[tuple[int, int], bool] = {}
                for task in list(self._tasks.values()):
                    if not task.finished.is_set():
                        self._check(task, shims_alive=shims_alive)
                if self._uids_to_release and time.monotonic() - self._uids_checked_at >= UID_RELEASE_SECONDS:
                    await self._release_uids()
                if self._dead_cgroups:
                    self._remove_dead_cgroups()
            except Exception:  # noqa: BLE001 - a sweep must not die; the next one retries
                log.exception("local backend sweep failed")

    def _check(
        self, task: _Task, *, stop_reason: str | None = None, shims_alive: dict[tuple[int, int], bool] | None = None
    ) -> None:
        """Look at a task's directory: report what changed, send it again, or
        declare it lost (reason `stop_reason` if we were stopping it).
        `shims_alive`: shims already looked at in this sweep."""
        if task.finished.is_set() or self._report_finished(task):
            return
        claim = task.claim or self._read_claim(task)
        if claim is None:
            if not os.path.exists(task.files.path):
                if (
                    task.sent_generation != self._server_generation  # the server that had it is gone
                    or time.monotonic() - task.sent_at > RESEND_SECONDS  # or the shim it went to
                ):
                    self._send(task)  # claims dedupe
            elif _age(task.files.path) > CLAIM_WRITE_SECONDS:
                # Claimed, but its spec never written: the claimer died at once.
                self._declare_lost(task, stop_reason)
            return
        if claim.cancelled:
            return  # the stop that cancelled it records the exit
        self._report_running(task, claim.detail)
        if not _alive(claim, shims_alive):
            if self._report_finished(task):
                return  # it ended between our two looks
            self._declare_lost(task, stop_reason)

    def _files_on_disk(self, slug: str) -> TaskFiles | None:
        """The files of the task attempt `slug` as they are on disk, in either layout."""
        return TaskFiles.found(os.path.join(self._tasks_path, slug))

    def _read_claim(self, task: _Task) -> ShimRecord | None:
        spec = read_task_spec(task.files, ShimSpec)
        if spec is not None and spec.shim is not None:
            task.claim = spec.shim
            task.spec_line = None
        return task.claim

    async def _wait_for_claim(self, task: _Task) -> ShimRecord | None:
        """The claim of a record a shim just created (its spec comes right after)."""
        for _ in range(int(CLAIM_WRITE_SECONDS / _STOP_POLL_SECONDS)):
            claim = task.claim or self._read_claim(task)
            if claim is not None or task.finished.is_set():
                return claim
            await asyncio.sleep(_STOP_POLL_SECONDS)
        return None

    def _cancel(self, task: _Task, reason: str, claimed: int) -> None:
        """Record a task this stop claimed (`claimed`: its record, open) as never started."""
        record = ShimRecord(shimPid=0, shimStartTicks=0, cancelled=True, claimedAt=self._clock())
        spec = TaskSpec(
            taskPath=task.files.path, key=task.key, slug=task.key.slug, node=task.node,
            commands=[], env={}, cpu=0, memoryMB=0, shim=record,
        )
        write_and_close(claimed, encode(spec))
        task.claim = record
        task.spec_line = None
        self._record_exit(task, reason, "stopped before it started")

    def _declare_lost(self, task: _Task, stop_reason: str | None) -> None:
        self._kill_orphans(task)
        if stop_reason is not None:
            self._record_exit(task, stop_reason, "its shim was gone; its processes were killed")
        else:
            self._record_exit(
                task, "Lost", "the task's shim died before recording its exit; its processes were killed"
            )

    def _adopt(self, files: TaskFiles, *, quietly: bool = False) -> _Task | None:
        """Watch a task found on disk; None when there is nothing to watch: its end
        is recorded and reported, or its spec is not written. A record claimed by
        a shim or a stop that died before writing the spec (nothing ran) is
        removed once that is sure, unless `quietly`."""
        found = read_task(files)
        if found.reported:
            return None
        spec = decode_record(found.spec_line, TaskSpec) if found.spec_line else None
        if spec is None:
            if not quietly and _age(files.path) > CLAIM_WRITE_SECONDS:
                log.warning("removing %s: its claimer died before writing its spec", files.path)
                remove_task_files(files)
            return None
        task = _Task(spec.key, files, spec.node, spec.dockerImageUri)
        task.claim = spec.shim
        self._tasks[spec.key.slug] = task
        return task

    def _report_running(self, task: _Task, detail: str, *, at: float | None = None) -> None:
        """`at`: when it started, if known better than now (its exit record says)."""
        if task.running_reported or task.finished.is_set():
            return
        task.running_reported = True
        if task.image:
            detail = f"{detail}; dockerImage {task.image} ignored by the local backend"
        self._report(TaskRunning(key=task.key, node=task.node, detail=detail, at=at or self._clock(), runtimeMode="process"))

    def _report_finished(self, task: _Task, *, told: bytes = b"") -> bool:
        """Report the task's end from its exit record: `told`, the record as its
        shim's bell carried it, else the one in its record (the bell rings only once
        the record is there, so both are the same). False: no exit recorded yet."""
        if task.finished.is_set():
            return True
        record = decode_record(told, ExitRecord) if told else None
        if record is not None and record.startedAt is not None:
            self._ended_work_dirs.append(os.path.join(self._work_root_path, task.key.slug))
        if record is None:
            record = read_task_exit(task.files)
        if record is None:
            return False
        if not task.running_reported and record.startedAt is not None:
            claim = task.claim or self._read_claim(task)
            self._report_running(task, claim.detail if claim else "", at=record.startedAt)
        output = task.files.beside(OUTPUT_LOG)
        tail = b""
        if record.outputBytes:
            tail = read_log(Path(output), cap_bytes=self.log_cap_bytes, tail_bytes=USER_LOG_TAIL_BYTES)
        task.finished.set()
        task.spec_line = None
        self._report(
            TaskFinished(
                key=task.key,
                exitCode=record.exitCode,
                signal=record.signal,
                platformReason=record.platformReason,
                platformMessage=record.platformMessage,
                userLogTail=tail.decode(errors="replace"),
                logPath=output,
                memoryPeakMB=record.memoryPeakMB,
            )
        )
        return True

    def _record_exit(self, task: _Task, reason: str, message: str) -> None:
        """The exit of a task nobody saw end; written only when no shim can be alive
        (none claimed the task, or its shim is dead), so it never races a shim's."""
        record = ExitRecord(
            exitCode=UNKNOWN_EXIT_CODE,
            platformReason=reason,
            platformMessage=message,
            finishedAt=self._clock(),
        )
        append_exit(task.files, encode(record))
        self._report_finished(task)

    def _kill_orphans(self, task: _Task) -> None:
        """End what is left of a task without its shim: its cgroup, and marked processes."""
        if self._cgroup_parent is not None:
            local_limits.kill_cgroup(self._cgroup_parent / task.key.slug, signal.SIGKILL)
        if self._cgroup_parents_v1:
            cgroup = local_limits.TaskCgroup(1, [f"{parent}/{task.key.slug}" for parent in self._cgroup_parents_v1])
            cgroup.kill(signal.SIGKILL)
        local_procs.sweep_marked(task.key.slug, TASK_KEY_ENV)
        self._dead_cgroups = True  # removed by the next sweep, once its processes are gone

    def _remove_dead_cgroups(self) -> None:
        """Remove the v1 cgroups of tasks whose shim is gone (after a crash):
        those of a task that is known and ended, or whose record says it ended
        or is not there; a live task's (re-adopted, or just claimed by a shim
        of the last launcher) are kept. One with processes left is killed
        first and removed by a later call (the kernel refuses it until then)."""
        self._dead_cgroups = False
        if not self._cgroup_parents_v1:
            return
        for slug, cgroup in local_limits.leftover_cgroups([Path(p) for p in self._cgroup_parents_v1]).items():
            task = self._tasks.get(slug)
            if task is not None:
                if not task.finished.is_set():
                    continue
            else:
                files = self._files_on_disk(slug)
                if files is not None and read_task_exit(files) is None:
                    continue
            cgroup.kill(signal.SIGKILL)
            cgroup.remove()

    def _task_env(self, launch: TaskLaunch, work_dir: str, slug: str) -> dict[str, str]:
        env = dict(self._base_env)
        if self.task_users is not None:
            env.update(HOME=work_dir, USER=self.task_users.name, LOGNAME=self.task_users.name)
        env.update(launch.env)
        env[WORK_DIR_ENV] = work_dir
        env[TASK_KEY_ENV] = slug
        return env

    def _report(self, event: BackendEvent) -> None:
        self._reports.append(event)
        self._reported.set()

    async def _event_stream(self) -> AsyncIterator[BackendEvent]:
        async for batch in self.event_batches(1):
            yield batch[0]


def _alive(claim: ShimRecord, seen: dict[tuple[int, int], bool] | None = None) -> bool:
    """Whether the claim's shim lives; `seen`: shims already looked at (and what was seen)."""
    if seen is None:
        return local_procs.is_alive(claim.shimPid, claim.shimStartTicks)
    shim = (claim.shimPid, claim.shimStartTicks)
    if shim not in seen:
        seen[shim] = local_procs.is_alive(*shim)
    return seen[shim]


def _port_free(port: int) -> bool:
    for family, kind, address in (
        (socket.AF_INET, socket.SOCK_STREAM, "0.0.0.0"),
        (socket.AF_INET, socket.SOCK_DGRAM, "0.0.0.0"),
        (socket.AF_INET6, socket.SOCK_STREAM, "::"),
    ):
        try:
            probe = socket.socket(family, kind)
        except OSError:
            continue  # no IPv6 here
        try:
            # SO_REUSEADDR as servers set it: a port left in TIME_WAIT by an
            # ended task is free to them, and so to us; one listened on is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
        finally:
            probe.close()
    return True


def _age(path: str) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


def _inherited_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.update({name: value for name, value in os.environ.items() if name.startswith("LC_")})
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("SHELL", BASH)
    env.update(_platform_tensorboard())
    return env


def _platform_tensorboard() -> dict[str, str]:
    """What the tensorboard plugin's step runs where a process task has no `tensorboard`
    on its PATH (libs/common/protocol/tensorboard.py): the TensorBoard installed beside
    the launcher's Python, run by that Python when a task's user may run it, else by
    the system's Python of the same version over the same packages (a Python kept
    under a home directory the task users cannot enter: pyenv's). {} without one."""
    tensorboard = Path(sys.executable).parent / "tensorboard"
    if not tensorboard.is_file():
        return {}
    if _others_may_run(sys.executable) and _others_may_run(str(tensorboard)):
        return {"PAI_TENSORBOARD": str(tensorboard)}
    python = shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}", path="/usr/local/bin:/usr/bin:/bin")
    packages = next((p for p in sys.path if p.endswith("site-packages") and (Path(p) / "tensorboard").is_dir()), None)
    if python is None or packages is None or not _others_may_run(python) or " " in packages:
        return {}
    return {"PAI_TENSORBOARD": f"{python} -m tensorboard.main", "PAI_TENSORBOARD_PYTHONPATH": packages}


def _platform_dirs(given: dict[str, str]) -> tuple[str, ...]:
    """The platform's directories a task reads when it runs the platform's TensorBoard
    (`given`: _platform_tensorboard's, as the task's environment has it): the installation
    its program lies in (a virtualenv: <venv>/bin/tensorboard) and the launcher's
    interpreter's (its standard library), or the packages on its PYTHONPATH and the
    system Python's installation. A task's private /tmp and /dev/shm would hide those
    there (PAI cloned under /tmp): local_namespaces binds them back read-only."""
    if "PAI_TENSORBOARD" not in given:
        return ()
    program = Path(given["PAI_TENSORBOARD"].split()[0])
    packages = given.get("PAI_TENSORBOARD_PYTHONPATH")
    if packages is not None:  # `<system python> -m tensorboard.main` over the platform's packages
        return (packages, str(Path(os.path.realpath(program)).parent.parent))
    return (str(program.parent.parent), sys.base_prefix)


def _others_may_run(path: str) -> bool:
    """Whether a user other than the file's owner can reach and run `path` (o+x all the way)."""
    real = Path(os.path.realpath(path))
    try:
        return all(os.stat(p).st_mode & 0o001 for p in (real, *real.parents))
    except OSError:
        return False


def _choose_limits(
    limits: str, cgroup_root: Path, cgroup_parent: Path | None, v1_name: str
) -> tuple[str, Path | None, list[str]]:
    """The limits mode, the cgroup v2 parent, the cgroup v1 parents: v2 where we
    may, else v1 (memory, cpu, pids), else rlimits."""
    if limits in (LIMITS_RLIMIT, LIMITS_NONE):
        return limits, None, []
    parent = local_limits.prepare_cgroup_parent(cgroup_root, cgroup_parent)
    if parent is not None:
        return LIMITS_CGROUP, parent, []
    parents = None if cgroup_parent is not None else local_limits.prepare_v1_parents(v1_name, cgroup_root)
    if parents is not None:
        return LIMITS_CGROUP_V1, None, [str(p) for p in parents]
    if limits == LIMITS_CGROUP:
        raise RuntimeError(
            f"cgroup limits were asked for, but no cgroup v2 with cpu and memory controllers nor cgroup v1 "
            f"memory, cpu and pids hierarchies where we may make cgroups are under {cgroup_parent or cgroup_root}"
        )
    return LIMITS_RLIMIT, None, []


def _warn_if_unisolated(limits_mode: str, other_users: bool, private_mounts: bool) -> None:
    """Say plainly at start what tasks are not kept from (also in each TaskRunning.detail)."""
    if limits_mode not in (LIMITS_CGROUP, LIMITS_CGROUP_V1):
        log.warning(
            "no cgroups for tasks (limits: %s): a task's memory is bounded per process at best, its cpu "
            "and process count not at all; run the launcher as root on a machine with cgroup v2 or the "
            "cgroup v1 memory, cpu and pids hierarchies", limits_mode,
        )
    if not private_mounts:
        why = local_namespaces.probe() if other_users else "tasks run as the launcher's own user"
        log.warning(
            "tasks get no mount namespace of their own (%s): they can see each other's processes in /proc "
            "and share /dev/shm and /tmp", why,
        )


def _fork_server_env() -> dict[str, str]:
    # Its shims and their tasks must not hold the launcher's NATS login (busauth).
    env = {name: value for name, value in os.environ.items() if not name.startswith("PAI_NATS_")}
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
