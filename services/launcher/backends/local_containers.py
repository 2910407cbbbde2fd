"""The local backend's container mode: each task instance a container of its job's image.

Used by `LocalBackend` when a container engine is configured (`container_engine`,
engine.py) and the task's role names an image; the process mode stays for the rest.
The engine is driven through its Docker-compatible REST API; nothing shells out per task.

A task's life (each step durable before the next, so a launcher killed anywhere
finds where it was):
- `start` claims `<data_dir>/containers/<slug>.json` (O_EXCL: a key runs at most
  once, also across restarts; a second start only watches), makes sure the image is
  there (pulled with the job's registry credentials as X-Registry-Auth, else used as
  present), creates the container under a name of its own (the engine refuses a
  second container of that name) with PAI's labels, starts it and reports it running.
- A watcher per task waits for it (`POST /wait`), then reads its state (exit code,
  `OOMKilled`), copies its output into the same log files as the process mode
  (`<slug>.output.log`, `<slug>.stderr.log`, capped to the newest `log_cap_bytes`),
  records the exit in the record, and only then removes the container (never
  AutoRemove: the wait would lose the exit code).
- `kill` records the stop's reason in the record, then asks the engine to stop the
  container with the grace period (SIGTERM, SIGKILL after it).
- `recover` lists the containers carrying this data dir's owner label: a running one
  is adopted (watched again, not restarted), one created but never started is
  started (it never ran), an exited one is collected; a record whose container is
  gone without a recorded exit is reported Lost; a container without a live record
  is removed. Nothing is lost, nothing runs twice, no container stays behind.

What each container gets: the role's image; `sh -c` running the commands joined by
newlines with errexit (bash when the image has it, as the process mode); the
environment the process mode gives (launch.env: PAI_*, CUDA_VISIBLE_DEVICES, ...)
with PAI_WORK_DIR and HOME at /pai/work (a directory of the task's own, bound in);
the job's uid (as the process mode) when tasks run as users of their own; the host
network (ports are the scheduler's, as OpenPAI's hostNetwork); memory (no swap),
cpu and pids limits; /dev/shm of the role's shmMB (OpenPAI's 512 MB when unset);
its GPUs (NVIDIA_VISIBLE_DEVICES and, where the host has them, only their device
nodes); the bind mounts it is given (storages); where its role runs the ssh plugin,
PAI's own OpenSSH read-only at /pai/ssh (ssh_bundle.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from libs.common.errors import NotFound, Transient
from services.launcher.backends import terminals
from services.launcher.backends.engine import Engine, EngineError, registry_auth_header
from services.launcher.backends.local_layout import write_replacing
from services.launcher.backends.local_limits import OOM_REASON
from services.launcher.backends.local_logs import read_log
from services.launcher.backends.ssh_bundle import Bundles as SshBundles
from services.launcher.core.tasks import BackendEvent, TaskFinished, TaskKey, TaskLaunch, TaskRunning

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# OpenPAI's /dev/shm when a role sets no extraContainerOptions.shmMB.
DEFAULT_SHM_MB = 512
CONTAINERS_DIR = "containers"
CONTAINER_WORK_DIR = "/pai/work"
RUNTIME_MODE = "container"
USER_LOG_TAIL_BYTES = 64 * 1024
LOST_EXIT_CODE = -1
# The platform reason of an image the engine could not pull: Kubernetes' own, which the
# runtime's rules already explain.
IMAGE_PULL_FAILED = "ErrImagePull"
# How long a watcher waits before asking an engine that did not answer again.
ENGINE_RETRY_SECONDS = 1.0
# How long past the grace period `kill` waits for the container's exit to be recorded.
STOP_MARGIN_SECONDS = 10.0
# How long `close` lets tasks whose exit is recorded finish removing their containers.
CLOSE_REMOVAL_SECONDS = 10.0
LABEL = "ai.pai"
# The commands run by bash where the image has it (as the process mode), else sh.
_RUN = 'if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc -e -c "$1"; fi; exec sh -e -c "$1"'
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")
_GPU_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# cgroup v1: podman (4.3, cgroupfs) never reports OOMKilled there, and the container's
# own cgroup is gone by the time its exit is read. So the memory limit is set on a
# parent cgroup of PAI's own per task, which outlives the container: a SIGKILL exit
# after that parent reached its limit (memory.failcnt, or its peak at the limit) is
# the kernel's OOM kill.
CGROUP_V1_ROOT = Path("/sys/fs/cgroup")
# Those parents lie under `pai-containers-<owner>` in each v1 hierarchy podman uses.
PARENTS_PREFIX = "pai-containers-"


class Mount(msgspec.Struct, frozen=True):
    """A host path bound into a task's container."""

    host: str
    container: str
    readOnly: bool = False


class ContainerRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`<slug>.json`: what a restart needs (never the job's secrets)."""

    key: TaskKey
    node: str
    image: str
    name: str
    killReason: str | None = None
    killGrace: float | None = None
    # The exit, once collected; the container is removed only after this is written.
    exitCode: int | None = None
    signal: int | None = None
    platformReason: str = ""
    platformMessage: str = ""
    startedAt: float | None = None
    finishedAt: float | None = None
    reported: bool = False  # `forget` was called: the core has the exit


class _Task:
    __slots__ = ("record", "path", "finished", "runner", "running_reported")

    def __init__(self, record: ContainerRecord, path: Path):
        self.record = record
        self.path = path
        self.finished = asyncio.Event()
        self.runner: asyncio.Task[None] | None = None
        self.running_reported = False


class ContainerTasks:
    """The container tasks of one data dir; reports go to `report` (the backend's queue)."""

    def __init__(
        self,
        engine: Engine,
        data_dir: Path,
        *,
        report: Callable[[BackendEvent], None],
        log_cap_bytes: int,
        pids_max: int,
        identity: Callable[[str], tuple[int, int] | None] = lambda job: None,
        mounts: Callable[[TaskLaunch], list[Mount]] = lambda launch: [],
        clock: Callable[[], float] = time.time,
    ):
        """`identity`: the job's (uid, gid), None to keep the image's user;
        `mounts`: the bind mounts of a launch (its storages)."""
        self.engine = engine
        self.dir = Path(data_dir) / CONTAINERS_DIR
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.work_dir = self.dir / "work"
        self.work_dir.mkdir(mode=0o711, exist_ok=True)
        # Containers of this data dir (another PAI on the machine has its own).
        self.owner = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
        self._report = report
        self.log_cap_bytes = log_cap_bytes
        self.pids_max = pids_max
        self._identity = identity
        self._mounts = mounts
        self._clock = clock
        self._tasks: dict[str, _Task] = {}
        # The ssh plugin's server, brought into the tasks that run it (ssh_bundle.py).
        self._ssh = SshBundles(self.dir)
        self._engine_name = ""
        self._v1_memory = CGROUP_V1_ROOT / "memory" if (CGROUP_V1_ROOT / "memory" / "memory.failcnt").exists() else None
        if self._v1_memory is not None:
            remove_empty_parent_roots(CGROUP_V1_ROOT)  # left by launchers gone before (any data dir's)

    # -- what LocalBackend delegates --------------------------------------------

    def owns(self, slug: str) -> bool:
        return slug in self._tasks or (self.dir / f"{slug}.json").exists()

    async def start(self, launch: TaskLaunch, *, secret_commands: list[str] | None = None) -> None:
        slug = launch.key.slug
        if slug in self._tasks:
            return
        assert launch.dockerImageUri, "container mode runs tasks with an image"
        path = self.dir / f"{slug}.json"
        record = ContainerRecord(
            key=launch.key, node=launch.placement.node, image=launch.dockerImageUri, name=self._name(slug),
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            await self._watch_existing(path)  # started before: watch, never rerun
            return
        try:
            os.write(fd, msgspec.json.encode(record))
        finally:
            os.close(fd)
        task = self._tasks[slug] = _Task(record, path)
        task.runner = asyncio.create_task(self._run(task, launch, secret_commands or launch.commands))

    async def kill(self, key: TaskKey, *, grace_seconds: float, reason: str) -> None:
        task = self._tasks.get(key.slug)
        if task is None:
            path = self.dir / f"{key.slug}.json"
            if not path.exists():
                return
            task = await self._watch_existing(path)
            if task is None:
                return
        if task.finished.is_set():
            return
        task.record.killReason = task.record.killReason or reason or "Killed"
        task.record.killGrace = grace_seconds
        self._write(task)
        try:
            await self.engine.stop(task.record.name, grace_seconds)
        except EngineError as exc:
            log.error("stopping container %s: %s", task.record.name, exc)
        try:
            await asyncio.wait_for(task.finished.wait(), grace_seconds + STOP_MARGIN_SECONDS)
        except TimeoutError:
            log.error("container %s did not end within its grace period", task.record.name)

    async def recover(self) -> list[TaskKey]:
        listed = await self.engine.list({f"{LABEL}.owner": self.owner})
        containers = {c.get("Labels", {}).get(f"{LABEL}.slug", ""): c for c in listed}
        known = []
        for path in sorted(self.dir.glob("*.json")):
            task = await self._watch_existing(path, containers)
            if task is not None:
                known.append(task.record.key)
        for slug, container in containers.items():
            task = self._tasks.get(slug)
            if task is None or (task.record.exitCode is not None and task.finished.is_set()):
                log.warning("removing container %s: no task of this launcher runs in it", container.get("Id"))
                await self._remove(str(container.get("Id")))
        return known

    async def read_log(self, key: TaskKey, *, tail_bytes: int | None = None) -> bytes:
        output = self.dir / f"{key.slug}.output.log"
        if output.exists():
            return await asyncio.to_thread(read_log, output, cap_bytes=self.log_cap_bytes, tail_bytes=tail_bytes)
        task = self._tasks.get(key.slug)
        if task is None:
            raise NotFound(f"no local task {key.slug}")
        try:
            both, _ = await self.engine.logs(task.record.name)
        except EngineError:
            return b""
        both = both[-self.log_cap_bytes:]
        return both if tail_bytes is None else both[-tail_bytes:] if tail_bytes else b""

    async def open_terminal(self, key: TaskKey, *, cols: int, rows: int) -> terminals.EngineExecTerminal:
        """A shell in the task's running container, through the engine's exec (its user,
        working directory and environment are the container's)."""
        task = self._tasks.get(key.slug)
        if task is None or task.finished.is_set():
            raise NotFound(f"no running container of task {key.role}[{key.index}] of {key.job}")
        try:
            return await terminals.EngineExecTerminal.open(self.engine, task.record.name, cols=cols, rows=rows)
        except EngineError as exc:
            raise Transient(f"the container engine did not open a shell in {task.record.name}: {exc.message}") from exc

    async def forget(self, key: TaskKey) -> None:
        task = self._tasks.pop(key.slug, None)
        path = self.dir / f"{key.slug}.json"
        record = task.record if task is not None else _load(path)
        if record is not None and record.exitCode is not None and not record.reported:
            record.reported = True
            write_replacing(path, msgspec.json.encode(record))

    async def prune(self, key: TaskKey) -> bool:
        path = self.dir / f"{key.slug}.json"
        record = _load(path)
        if record is None:
            return False
        if key.slug in self._tasks or not record.reported:
            log.warning("not pruning %s: its exit is not recorded", key.slug)
            return False
        for name in (f"{key.slug}.output.log", f"{key.slug}.stderr.log", f"{key.slug}.json"):
            (self.dir / name).unlink(missing_ok=True)
        await asyncio.to_thread(shutil.rmtree, self.work_dir / key.slug, True)
        return True

    async def close(self) -> None:
        # A task whose exit is recorded is only removing its container and parent cgroup:
        # let it (bounded), so a clean stop leaves nothing of it behind.
        ending = [t.runner for t in self._tasks.values()
                  if t.runner is not None and not t.runner.done() and t.finished.is_set()]
        if ending:
            await asyncio.wait(ending, timeout=CLOSE_REMOVAL_SECONDS)
        for task in self._tasks.values():
            if task.runner is not None:
                task.runner.cancel()  # containers go on; a restarted launcher adopts them
        await self.engine.close()
        if self._v1_memory is not None:
            remove_empty_parent_roots(CGROUP_V1_ROOT, self.owner)

    # -- a task's life ---------------------------------------------------------

    async def _run(self, task: _Task, launch: TaskLaunch, commands: list[str]) -> None:
        record = task.record
        try:
            # The job's storages first: one this node cannot give fails the launch naming it.
            mounts = self._mounts(launch)
        except (OSError, ValueError) as exc:
            self._record_exit(task, LOST_EXIT_CODE, "LaunchFailed", str(exc))
            return
        try:
            if not await self.engine.image_exists(record.image):
                try:
                    await self._pull(launch)
                except EngineError as exc:
                    # Kubernetes' reason for the same end: the runtime's ContainerImageNotExists rule
                    # explains it (a wrong name or tag, a registry that needs credentials or
                    # cannot be reached) and does not retry it.
                    self._record_exit(task, LOST_EXIT_CODE, IMAGE_PULL_FAILED,
                                      f"image {record.image} could not be pulled: {exc.message} (a machine "
                                      "that reaches no registry: build or load the image into the engine, or "
                                      "run tasks as processes with container_engine: none)")
                    return
            if record.killReason is not None:
                self._record_exit(task, LOST_EXIT_CODE, record.killReason, "stopped before it started")
                return
            try:
                await self.engine.create(record.name, self._spec(launch, commands, mounts))
            except EngineError as exc:
                if exc.status != 409:
                    raise
            if record.killReason is not None:
                await self._remove(record.name)
                self._record_exit(task, LOST_EXIT_CODE, record.killReason, "stopped before it started")
                return
            await self.engine.start(record.name)
        except EngineError as exc:
            await self._remove(record.name)
            self._record_exit(task, LOST_EXIT_CODE, "LaunchFailed", f"image {record.image}: {exc.message}")
            return
        await self._report_running(task)
        await self._watch(task)

    async def _pull(self, launch: TaskLaunch) -> None:
        auth = launch.dockerImageAuth
        header = None
        if auth:
            header = registry_auth_header(auth.get("username", ""), auth.get("password", ""),
                                          auth.get("registryuri", ""))
        await self.engine.pull(task_image(launch), auth=header)

    async def _watch(self, task: _Task) -> None:
        """Wait for the container's end, then collect it (the engine may restart meanwhile)."""
        while True:
            try:
                await self.engine.wait(task.record.name)
                break
            except EngineError as exc:
                if exc.status == 404:
                    break
                log.warning("waiting for container %s: %s; asking again", task.record.name, exc)
                await asyncio.sleep(ENGINE_RETRY_SECONDS)
        while True:
            try:
                await self._collect(task)
                return
            except EngineError as exc:
                log.warning("collecting container %s: %s; trying again", task.record.name, exc)
                await asyncio.sleep(ENGINE_RETRY_SECONDS)

    async def _collect(self, task: _Task) -> None:
        record = task.record
        info = await self.engine.inspect(record.name)
        if info is None:
            self._record_exit(task, LOST_EXIT_CODE, record.killReason or "Lost",
                              "the task's container was gone before its exit was recorded")
            return
        state = info.get("State", {})
        if state.get("Running"):
            raise EngineError(0, f"{record.name} still runs")
        both, errors = await self.engine.logs(record.name)
        await asyncio.to_thread(self._write_logs, task, both, errors)
        code = int(state.get("ExitCode", LOST_EXIT_CODE))
        oom = bool(state.get("OOMKilled")) or (code == 137 and record.killReason is None and self._hit_limit(record))
        signal = code - 128 if (oom or record.killReason) and 128 < code < 160 else None
        if oom:
            reason, message = OOM_REASON, f"the task's container exceeded its memory limit and was killed (exit {code})"
        elif record.killReason is not None:
            reason, message = record.killReason, f"the task's container was stopped (exit {code})"
        else:
            reason, message = "", ""
        record.startedAt = _timestamp(state.get("StartedAt"))
        self._record_exit(task, code, reason, message, signal=signal, finished_at=_timestamp(state.get("FinishedAt")))
        await self._remove(record.name)
        self._remove_parent(record.key.slug)

    def _record_exit(self, task: _Task, code: int, reason: str, message: str, *, signal: int | None = None,
                     finished_at: float | None = None) -> None:
        record = task.record
        record.exitCode, record.signal = code, signal
        record.platformReason, record.platformMessage = reason, message
        record.finishedAt = finished_at or self._clock()
        self._write(task)
        self._report_finished(task)

    async def _report_running(self, task: _Task) -> None:
        if task.running_reported:
            return
        task.running_reported = True
        if not self._engine_name:
            try:
                version = await self.engine.version()
                self._engine_name = f"{version.get('Components', [{}])[0].get('Name', 'engine')} {version.get('Version', '')}"
            except (EngineError, IndexError, AttributeError):
                self._engine_name = "engine"
        self._report(TaskRunning(
            key=task.record.key, node=task.record.node, runtimeMode=RUNTIME_MODE, at=task.record.startedAt,
            detail=f"container of image {task.record.image} ({self._engine_name.strip()}): {task.record.name}",
        ))

    def _report_finished(self, task: _Task) -> None:
        if task.finished.is_set():
            return
        record = task.record
        if not task.running_reported and record.startedAt is not None:
            task.running_reported = True
            self._report(TaskRunning(key=record.key, node=record.node, runtimeMode=RUNTIME_MODE,
                                     at=record.startedAt, detail=f"container of image {record.image}"))
        output = self.dir / f"{record.key.slug}.output.log"
        tail = b""
        if output.exists():
            tail = read_log(output, cap_bytes=self.log_cap_bytes, tail_bytes=USER_LOG_TAIL_BYTES)
        task.finished.set()
        self._report(TaskFinished(
            key=record.key, exitCode=record.exitCode if record.exitCode is not None else LOST_EXIT_CODE,
            signal=record.signal, platformReason=record.platformReason, platformMessage=record.platformMessage,
            userLogTail=tail.decode(errors="replace"), logPath=str(output) if output.exists() else "",
        ))

    async def _watch_existing(
        self, path: Path, containers: dict[str, dict[str, Any]] | None = None
    ) -> _Task | None:
        """Take up a task found on disk: report its recorded exit, or adopt its
        container (`containers`: the engine's list, else the engine is asked)."""
        record = _load(path)
        if record is None or record.reported:
            return None
        slug = record.key.slug
        if slug in self._tasks:
            return self._tasks[slug]
        task = self._tasks[slug] = _Task(record, path)
        if record.exitCode is not None:
            self._report_finished(task)
            return task
        if containers is not None:
            container = containers.get(slug)
            status = str(container.get("State", "")) if container else None
        else:
            info = await self.engine.inspect(record.name)
            status = str(info.get("State", {}).get("Status", "")) if info else None
        if status is None:
            self._record_exit(task, LOST_EXIT_CODE, record.killReason or "Lost",
                              "the task's container was never created or is gone; nothing of it runs")
            return task
        if status in ("created", "configured", "initialized"):
            if record.killReason is not None:
                await self._remove(record.name)
                self._record_exit(task, LOST_EXIT_CODE, record.killReason, "stopped before it started")
                return task
            await self.engine.start(record.name)  # created, never started: it never ran
        if status == "running":
            await self._report_running(task)
        task.runner = asyncio.create_task(self._watch(task))
        return task

    # -- pieces ------------------------------------------------------------------

    def _spec(self, launch: TaskLaunch, commands: list[str], mounts: list[Mount]) -> dict[str, Any]:
        slug = launch.key.slug
        identity = self._identity(launch.key.job)
        work = self.work_dir / slug
        work.mkdir(mode=0o700, exist_ok=True)
        if identity is not None:
            os.chown(work, *identity)
        env = dict(launch.env)
        env.update(PAI_WORK_DIR=CONTAINER_WORK_DIR, HOME=CONTAINER_WORK_DIR, PAI_TASK_KEY=slug)
        gpus = launch.placement.gpus
        devices = []
        if gpus:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
            nodes = [f"/dev/nvidia{g}" for g in gpus]
            if all(os.path.exists(n) for n in nodes):
                # Only its GPUs' device nodes: inside, CUDA numbers them from 0.
                devices = [{"PathOnHost": p, "PathInContainer": p, "CgroupPermissions": "rwm"}
                           for p in nodes + [d for d in _GPU_CONTROL_DEVICES if os.path.exists(d)]]
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
        else:
            env.setdefault("NVIDIA_VISIBLE_DEVICES", "void")
        binds = [f"{work}:{CONTAINER_WORK_DIR}:rw"]
        binds += [f"{m.host}:{m.container}:{'ro' if m.readOnly else 'rw'}" for m in mounts]
        binds += self._ssh.binds(env)  # read-only, at /pai/ssh, where the role runs the ssh plugin
        shm_mb = launch.shmMB if launch.shmMB is not None else DEFAULT_SHM_MB
        parent = self._make_parent(slug, launch.memoryMB * MIB)
        host_config: dict[str, Any] = {
            "NetworkMode": "host",
            "Memory": launch.memoryMB * MIB,
            "MemorySwap": launch.memoryMB * MIB,  # no swap: the limit is the memory's
            "NanoCpus": launch.cpu * 1_000_000_000,
            "PidsLimit": self.pids_max,
            "ShmSize": shm_mb * MIB,
            "Binds": binds,
            "Devices": devices,
        }
        if parent is not None:  # the limit is the parent's (CGROUP_V1_ROOT)
            host_config["CgroupParent"] = parent
            del host_config["Memory"], host_config["MemorySwap"]
        key = launch.key
        spec: dict[str, Any] = {
            "Image": launch.dockerImageUri,
            "Entrypoint": ["/bin/sh", "-c", _RUN, "pai-task", "\n".join(commands)],
            "Cmd": [],
            "Env": [f"{k}={v}" for k, v in env.items()],
            "WorkingDir": CONTAINER_WORK_DIR,
            "Labels": {
                f"{LABEL}.owner": self.owner, f"{LABEL}.slug": slug, f"{LABEL}.job": key.job,
                f"{LABEL}.attempt": str(key.attempt), f"{LABEL}.role": key.role, f"{LABEL}.index": str(key.index),
                f"{LABEL}.taskAttempt": str(key.taskAttempt),
            },
            "HostConfig": host_config,
        }
        if identity is not None:
            spec["User"] = f"{identity[0]}:{identity[1]}"
        return spec

    def _parent_name(self, slug: str) -> str:
        return f"{PARENTS_PREFIX}{self.owner}/{_NAME_UNSAFE.sub('_', slug)}"

    def _make_parent(self, slug: str, limit: int) -> str | None:
        """The task's parent cgroup (v1) with its memory limit, as podman's CgroupParent; None on v2."""
        if self._v1_memory is None:
            return None
        name = self._parent_name(slug)
        path = self._v1_memory / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(limit))
        if (path / "memory.memsw.limit_in_bytes").exists():
            try:
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no swap
            except OSError:
                pass
        return "/" + name

    def _hit_limit(self, record: ContainerRecord) -> bool:
        if self._v1_memory is None:
            return False
        path = self._v1_memory / self._parent_name(record.key.slug)
        try:
            # failcnt stays 0 on some kernels (6.x seen); the peak reaching the limit does not.
            limit = int((path / "memory.limit_in_bytes").read_text())
            peak = int((path / "memory.max_usage_in_bytes").read_text())
            return int((path / "memory.failcnt").read_text()) > 0 or peak >= limit - 64 * 1024
        except (OSError, ValueError):
            return False

    def _remove_parent(self, slug: str) -> None:
        """The task's parent cgroups in every v1 hierarchy podman made them in."""
        if self._v1_memory is None:
            return
        name = self._parent_name(slug)
        for hierarchy in CGROUP_V1_ROOT.iterdir():
            path = hierarchy / name
            if path.is_dir():
                for child in sorted(path.glob("**/"), key=lambda p: len(p.parts), reverse=True):
                    try:
                        child.rmdir()
                    except OSError:
                        pass

    def _name(self, slug: str) -> str:
        safe = _NAME_UNSAFE.sub("_", slug)
        if safe != slug:
            safe += "-" + hashlib.sha256(slug.encode()).hexdigest()[:8]
        return f"pai-{self.owner}-{safe}"

    def _write(self, task: _Task) -> None:
        write_replacing(task.path, msgspec.json.encode(task.record))

    def _write_logs(self, task: _Task, both: bytes, errors: bytes) -> None:
        slug = task.record.key.slug
        for name, data in ((f"{slug}.output.log", both), (f"{slug}.stderr.log", errors)):
            if len(data) > self.log_cap_bytes:
                data = data[-self.log_cap_bytes:]
            write_replacing(self.dir / name, data)

    async def _remove(self, ref: str) -> None:
        try:
            await self.engine.remove(ref)
        except EngineError as exc:
            log.error("removing container %s: %s", ref, exc)


def remove_empty_parent_roots(cgroup_root: Path, owner: str = "") -> None:
    """Remove each `pai-containers-<owner>` directory (every owner's when `owner` is
    empty) that holds no task's parent any more, in every v1 hierarchy under
    `cgroup_root`. The kernel refuses to remove one that still does (a container
    running, or created and waiting to start under its parent's limit): those stay."""
    try:
        hierarchies = [h for h in cgroup_root.iterdir() if h.is_dir()]
    except OSError:
        return
    for hierarchy in hierarchies:
        for root in hierarchy.glob(f"{PARENTS_PREFIX}{owner or '*'}"):
            try:
                root.rmdir()
            except OSError:
                pass


def task_image(launch: TaskLaunch) -> str:
    assert launch.dockerImageUri is not None
    return launch.dockerImageUri


def _load(path: Path) -> ContainerRecord | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=ContainerRecord)
    except (OSError, msgspec.DecodeError):
        return None


def _timestamp(text: object) -> float | None:
    """An engine's RFC 3339 time (nanoseconds cut to microseconds) as a Unix time; None when unset."""
    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        return None
    fraction = (match.group(2) or ".0")[:7]
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    try:
        return datetime.fromisoformat(match.group(1) + fraction + zone).timestamp()
    except ValueError:
        return None
