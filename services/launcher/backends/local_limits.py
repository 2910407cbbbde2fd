"""CPU, memory and process bounds for a local task: cgroups where allowed, else rlimits.

- cgroup v2 (when the cgroup2 filesystem is mounted and we may enable the cpu
  and memory controllers under our own cgroup, or under a delegated parent an
  admin names): one cgroup per task with `cpu.max` (the task's cpus),
  `memory.max` (its memoryMB, the whole task together), no swap, and
  `memory.oom.group` so an OOM kill takes the whole task, like a container.
  The cgroup also lists every process of the task, however it detached.
- cgroup v1 (machines that mount only the v1 hierarchies), as root: a cgroup per
  task in each of the memory, cpu and pids hierarchies, under a parent of
  this data dir's own (`pai-<data dir id>`) below the launcher's own cgroup
  there. memory: `memory.limit_in_bytes` = memoryMB for the whole task, with
  what the kernel charges to it (anonymous memory, page cache, tmpfs and so
  the task's /dev/shm and /tmp, kernel memory), and `memory.memsw.limit_in_bytes`
  the same where swap is accounted (no swap); the kernel's OOM killer then
  kills a process of the task (`memory.oom_control`'s oom_kill counts it),
  and the shim ends the rest (OOMKilled). cpu: `cpu.cfs_quota_us` = cpus x
  `cpu.cfs_period_us`, so `cpu: 1` gets one CPU in all however many processes
  it runs. pids: `pids.max` (the backend's cap, DEFAULT_PIDS_MAX). The task's
  child joins all three (cgroup.procs) while still root, before its exec
  (_spawn_as), so nothing of the task ever runs outside them. Peak memory is
  `memory.max_usage_in_bytes`.
- rlimit otherwise: RLIMIT_DATA = memoryMB for each process of the task. Not
  RLIMIT_AS: that counts address space merely reserved (CUDA, the JVM, Go and
  glibc thread arenas reserve far more than they use) and breaks such programs.
  RLIMIT_DATA counts heap and private writable mappings, i.e. memory actually
  asked for, so allocation beyond it fails (MemoryError, bad_alloc, ENOMEM).
  It bounds each process, not their sum. CPU stays unbounded (RLIMIT_CPU
  limits seconds used, not a share).
- none: nothing enforced.

The working directory's size: this kernel has no disk quota (CONFIG_QUOTA is
off: ext4 refuses `usrquota`), and a filesystem per task (a loop-mounted
image) costs far more than a trivial task. So, the best bound at hand: every
task gets RLIMIT_FSIZE = its bound (no file it writes anywhere grows past it:
SIGXFSZ, or EFBIG where the program ignores that), and its shim adds up the
directory's disk use every WORK_DIR_LOOK_SECONDS and ends the task when it
passes the bound. Between two looks a task may write more than its bound by
what it writes in that time. Either way its exit says WorkDirQuotaExceeded.

Which one is in force is reported in TaskRunning.detail ("limits: ...").

A pool of v1 task cgroups: making and removing three cgroups per task (a
memory cgroup above all: the kernel sets up and later tears down its per-cpu
and per-node state) cost more than the rest of the bounds together. So a
task's cgroups, once empty, are reset and renamed `.pool-...` in each
hierarchy rather than removed, and the next task's shim renames a pooled set
to its own slug instead of making one. A cgroup is always named by what it
is: a task's slug while the task holds it (so the launcher's crash paths,
which find a task's cgroups by slug, are unchanged), `.pool-...` while free
(never listed as a task's: leftover_cgroups skips dot names). Renaming is
atomic: of two shims that take the same pooled cgroup, one gets ENOENT and
takes another. See claim_task_cgroups_v1 and TaskCgroup.release for what is
reset, and when a cgroup is removed rather than pooled.
"""

from __future__ import annotations

import errno
import itertools
import os
import shlex
import signal
from pathlib import Path

from services.launcher.backends.local_layout import LIMITS_CGROUP, LIMITS_CGROUP_V1, LIMITS_RLIMIT

CGROUP_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("cpu", "memory")
# cgroup v1: the hierarchies a task joins, in the order of ShimSpec.cgroupParents.
V1_CONTROLLERS = ("memory", "cpu", "pids")
_CPU_PERIOD_US = 100_000
MIB = 1024 * 1024
# Platform reasons of a task the shim ended for a bound it passed.
OOM_REASON = "OOMKilled"
WORK_DIR_FULL_REASON = "WorkDirQuotaExceeded"
# How often a shim looks at its running tasks' cgroups (v1: an OOM kill ends
# the whole task) and their working directories' size (a walk: less often).
WATCH_SECONDS = 0.5
WORK_DIR_LOOK_SECONDS = 2.0
# A look at a working directory stops after this many entries (a task that
# makes millions of files is not walked whole every few seconds).
WORK_DIR_LOOK_ENTRIES = 200_000
# Free v1 task cgroups: `.pool-<memoryMB>m-<cpu>c-<pids>p-o<oom kills>-<unique>`
# (the bounds they hold, so that a task with the same bounds rewrites none,
# and their oom_kill count, the next task's baseline).
POOL_PREFIX = ".pool-"
# An ended task's memory cgroup still charged with more than this (page cache
# of files it wrote, beyond the kernel's per-cpu charge batches of 64 pages)
# is removed, not pooled: the next task would start with that charge, and its
# peak would count it.
POOL_MAX_CHARGED_BYTES = 1 * MIB + (os.cpu_count() or 1) * 64 * 4096


def own_cgroup(cgroup_root: Path = CGROUP_ROOT) -> Path | None:
    """This process's cgroup v2 directory (the `0::<path>` line), if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return cgroup_root / line[3:].lstrip("/")
    return None


def _enable_controllers(cgroup: Path) -> None:
    (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in _CONTROLLERS))


def _controllers_enabled(cgroup: Path) -> bool:
    enabled = (cgroup / "cgroup.subtree_control").read_text().replace("+", " ").split()
    return all(c in enabled for c in _CONTROLLERS)


def prepare_cgroup_parent(
    cgroup_root: Path = CGROUP_ROOT, parent: Path | None = None
) -> Path | None:
    """A cgroup whose children get cpu and memory controllers, or None if we may not.

    Without an explicit (delegated) `parent`, uses `<own cgroup>/pai-tasks`. That
    needs the controllers enabled in our own cgroup, which the kernel refuses
    while it holds processes (the no-internal-processes rule) unless it is the
    root: then the caller falls back to rlimits rather than move processes it
    does not own.
    """
    try:
        if parent is None:
            if not (cgroup_root / "cgroup.controllers").is_file():
                return None  # cgroup v1 or no cgroup filesystem
            own = own_cgroup(cgroup_root)
            if own is None:
                return None
            if not _controllers_enabled(own):
                _enable_controllers(own)
            parent = own / "pai-tasks"
        parent.mkdir(exist_ok=True)
        if not _controllers_enabled(parent):
            _enable_controllers(parent)
        return parent if _controllers_enabled(parent) else None
    except OSError:
        return None


def describe(mode: str, cpu: int, memory_mb: int, pids_max: int = 0) -> str:
    if mode == LIMITS_CGROUP:
        return f"limits: cgroup v2 (cpu.max {cpu} cpu, memory.max {memory_mb} MiB, whole task)"
    if mode == LIMITS_CGROUP_V1:
        return (
            f"limits: cgroup v1 (cpu.cfs_quota_us {cpu} cpu, memory.limit_in_bytes {memory_mb} MiB, "
            f"pids.max {pids_max}, whole task)"
        )
    if mode == LIMITS_RLIMIT:
        return f"limits: rlimit (RLIMIT_DATA {memory_mb} MiB per process; cpu not bounded)"
    return "limits: none"


def create_task_cgroup(parent: Path, slug: str, cpu: int, memory_mb: int) -> Path:
    cgroup = parent / slug
    cgroup.mkdir(exist_ok=True)
    if cpu > 0:
        (cgroup / "cpu.max").write_text(f"{cpu * _CPU_PERIOD_US} {_CPU_PERIOD_US}")
    if memory_mb > 0:
        (cgroup / "memory.max").write_text(str(memory_mb * MIB))
    for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
        try:
            (cgroup / name).write_text(value)
        except OSError:
            pass  # older kernels or no swap accounting: the bound above still holds
    return cgroup


def prelude(mode: str, procs_files: list[str] | None, memory_mb: int) -> str:
    """Shell lines the task runs before its commands, to enter its bounds.

    The task is spawned (vfork + exec, far cheaper than fork from Python), so
    nothing runs in the child before exec: the task's shell applies its own
    bounds first, before it can start anything. `ulimit -d` sets the soft and
    hard limit, so the commands cannot raise it again.
    """
    if mode in (LIMITS_CGROUP, LIMITS_CGROUP_V1) and procs_files:
        return "".join(f"echo $$ > {shlex.quote(procs)}\n" for procs in procs_files)
    if mode == LIMITS_RLIMIT and memory_mb > 0:
        return f"ulimit -d {memory_mb * 1024}\n"
    return ""


def cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_cgroup(cgroup: Path, sig: int) -> None:
    if sig == signal.SIGKILL:
        try:
            (cgroup / "cgroup.kill").write_text("1")  # Linux 5.14+: atomic, no fork race
        except OSError:
            pass
    for pid in cgroup_pids(cgroup):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _read_key(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def oom_killed(cgroup: Path) -> bool:
    return (_read_key(cgroup / "memory.events", "oom_kill") or 0) > 0


def peak_memory_mb(cgroup: Path) -> int | None:
    try:
        return -(-int((cgroup / "memory.peak").read_text()) // MIB)
    except (OSError, ValueError):
        return None


# -- cgroup v1 ---------------------------------------------------------------------


def _v1_mounts(cgroup_root: Path) -> dict[str, Path]:
    """controller -> where its v1 hierarchy is mounted, under `cgroup_root`
    (a hierarchy may carry several: `cpu,cpuacct`)."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return found
    root = str(cgroup_root).rstrip("/") + "/"
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[2] != "cgroup":
            continue
        mount_point = fields[1].replace("\\040", " ")
        if not mount_point.startswith(root):
            continue
        for option in fields[3].split(","):
            if option in V1_CONTROLLERS:
                found.setdefault(option, Path(mount_point))
    return found


def _own_v1_paths() -> dict[str, str]:
    """controller -> this process's cgroup in its v1 hierarchy (relative)."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in V1_CONTROLLERS:
                paths[controller] = path.lstrip("/")
    return paths


def v1_parent_name(data_dir: Path) -> str:
    """The name of this data dir's parent cgroups (v1): launchers of other data
    dirs on the machine keep their tasks' cgroups apart."""
    import hashlib

    return "pai-" + hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]


def prepare_v1_parents(name: str, cgroup_root: Path = CGROUP_ROOT) -> list[Path] | None:
    """The parents of tasks' v1 cgroups, memory, cpu and pids (V1_CONTROLLERS),
    made as `<own cgroup>/<name>` in each hierarchy; None when a hierarchy is
    missing or we may not make cgroups there (not root)."""
    mounts = _v1_mounts(cgroup_root)
    own = _own_v1_paths()
    if any(controller not in mounts for controller in V1_CONTROLLERS):
        return None
    parents = [mounts[c] / own.get(c, "") / name for c in V1_CONTROLLERS]
    try:
        for parent in parents:
            parent.mkdir(exist_ok=True)
            # Probe: a cgroup may be made and removed here.
            (parent / ".probe").mkdir(exist_ok=True)
            (parent / ".probe").rmdir()
    except OSError:
        return None
    return parents


class TaskCgroup:
    """The cgroups of one task: v2, one directory; v1, one per hierarchy
    (memory, cpu, pids: V1_CONTROLLERS)."""

    __slots__ = ("version", "dirs", "oom_base", "oom_count", "bounds")

    def __init__(self, version: int, dirs: list[str], oom_base: int = 0, bounds: str = ""):
        self.version = version
        self.dirs = dirs
        # v1 cannot reset memory.oom_control's oom_kill: a pooled cgroup's
        # count when its task took it (an OOM kill is one past it).
        self.oom_base = oom_base
        self.oom_count: int | None = None  # as last read (oom_killed)
        self.bounds = bounds  # v1: what its limits are set to (_bounds_tag)

    @property
    def procs_files(self) -> list[str]:
        return [f"{d}/cgroup.procs" for d in self.dirs]

    def pids(self) -> list[int]:
        # Every process of the task is in each hierarchy: the first one lists them all.
        try:
            return [int(pid) for pid in _read(f"{self.dirs[0]}/cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    def kill(self, sig: int) -> None:
        if self.version == 2:
            kill_cgroup(Path(self.dirs[0]), sig)
            return
        # v1 has no cgroup.kill: each process listed, again on every sweep of
        # the shim until none is left (pids.max bounds how many a fork race makes).
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def oom_killed(self) -> bool:
        if self.version == 2:
            return oom_killed(Path(self.dirs[0]))
        try:
            self.oom_count = _oom_kills(self.dirs[0])
        except (OSError, ValueError):
            return False
        return self.oom_count > self.oom_base

    def peak_memory_mb(self) -> int | None:
        if self.version == 2:
            return peak_memory_mb(Path(self.dirs[0]))
        try:
            return -(-int(_read(f"{self.dirs[0]}/memory.max_usage_in_bytes")) // MIB)
        except (OSError, ValueError):
            return None

    def remove(self) -> bool:
        """Remove them (each must hold no process); True when none is left."""
        left = False
        for d in self.dirs:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                left = True
        return not left

    def release(self, empty: bool = False) -> bool:
        """Once its task has ended: v1 cgroups go back to the pool (reset,
        renamed `.pool-...`; memory last, so that a set whose memory cgroup is
        pooled is whole), or are removed when they may not be reused. False
        while a process is still in them (the caller tries again later).
        `empty`: the caller has just seen no process left in them (no process
        can join an empty task cgroup: only root may write cgroup.procs)."""
        if self.version != 1 or len(self.dirs) != len(V1_CONTROLLERS) or not self.bounds:
            return self.remove()
        memory = self.dirs[0]
        try:
            if not empty and _read(f"{memory}/cgroup.procs").strip():
                return False
            if int(_read(f"{memory}/memory.usage_in_bytes")) > POOL_MAX_CHARGED_BYTES:
                return self.remove()
            # The next task's peak starts from what is charged now (at most
            # the kernel's per-cpu batches, POOL_MAX_CHARGED_BYTES).
            _write(f"{memory}/memory.max_usage_in_bytes", "0")
            # Its oom_kill count goes in its name: the next task's baseline
            # (it cannot change while no process is in the cgroup).
            kills = self.oom_count if self.oom_count is not None else _oom_kills(memory)
        except (OSError, ValueError):
            return self.remove()
        name = f"{POOL_PREFIX}{self.bounds}-o{kills}-{os.getpid()}.{next(_pool_names)}"
        done: list[str] = []
        for d in (*self.dirs[1:], memory):
            pooled = f"{d.rsplit('/', 1)[0]}/{name}"
            try:
                os.rename(d, pooled)
            except OSError:  # taken away meanwhile (the launcher's cleanup), or the name exists
                left = [x for x in self.dirs if x not in done]
                moved = [f"{x.rsplit('/', 1)[0]}/{name}" for x in done]
                return TaskCgroup(1, left + moved).remove()
            done.append(d)
        _pooled_here.append(name)
        _pooled_parents[:] = [d.rsplit("/", 1)[0] for d in self.dirs]
        if len(_pooled_here) > _POOLED_HERE_KEPT:
            _remove_pooled_set(_pooled_here.pop(0))
        return True


# Names of the cgroups this process put in the pool: tried first by its next
# claims (most likely still free; no listing of the parent needed), and
# removed as it exits if no task took them meanwhile (remove_own_pooled): the
# pool lives while shims do, and nothing is left once the last one is gone.
_pooled_here: list[str] = []
_pooled_parents: list[str] = []  # the parents they are in (the same for every task of a launcher)
_POOLED_HERE_KEPT = 256
_pool_names = itertools.count()


def _bounds_tag(cpu: int, memory_mb: int, pids_max: int) -> str:
    return f"{max(memory_mb, 0)}m-{max(cpu, 0)}c-{max(pids_max, 0)}p"


# Pool names a listing of the parent found and this process has not tried yet, by
# (parent, bounds prefix), the next to try last: claims take them before listing
# again. A name another shim took meanwhile only fails its rename.
_listed: dict[tuple[str, str], list[str]] = {}


def _pool_candidates(parent: str, bounds: str):
    """Names of pooled cgroups to try: this process's own with the same
    bounds (nothing to rewrite; most likely still free), then those its last
    listing of the pool found, then a new listing's, same bounds first."""
    same = POOL_PREFIX + bounds + "-"
    for i in range(len(_pooled_here) - 1, -1, -1):
        if _pooled_here[i].startswith(same):
            yield _pooled_here.pop(i)
    queue = _listed.setdefault((parent, same), [])
    while queue:
        yield queue.pop()
    try:
        # The parent also holds every running task's cgroup: listed only when what
        # the last listing found is used up (at 64 tasks in flight, a listing and
        # sort of every entry per claim was a fifth of a shim's CPU).
        names = os.listdir(parent)
    except OSError:
        return
    alike: list[str] = []
    other: list[str] = []
    for name in names:
        if name.startswith(same):
            alike.append(name)
        elif name.startswith(POOL_PREFIX):
            other.append(name)
    # Shims listing the pool at once start at different places in it.
    for group in (other, alike):  # queued so that pop() gives alike first
        start = os.getpid() % len(group) if group else 0
        queue.extend(reversed(group[start:] + group[:start]))
    while queue:
        yield queue.pop()


def claim_task_cgroups_v1(
    parents: list[str], slug: str, cpu: int, memory_mb: int, pids_max: int
) -> TaskCgroup:
    """A task's cgroups: a pooled set renamed to `slug` (memory first: its
    rename decides between two shims after the same set), its bounds
    rewritten where they differ; or, with none pooled, made anew
    (create_task_cgroups_v1)."""
    bounds = _bounds_tag(cpu, memory_mb, pids_max)
    for name in _pool_candidates(parents[0], bounds):
        memory = f"{parents[0]}/{slug}"
        try:
            os.rename(f"{parents[0]}/{name}", memory)
        except FileExistsError:
            break  # `slug` is there: a shim that claimed the task before died; made anew below
        except OSError:
            continue  # another shim took it first
        dirs = [memory]
        whole = True
        for parent in parents[1:]:
            path = f"{parent}/{slug}"
            try:
                os.rename(f"{parent}/{name}", path)
            except OSError:
                # Removed meanwhile (the launcher's cleanup) or `slug` already
                # there: this hierarchy's cgroup made (or kept) and set anew.
                whole = False
                os.makedirs(path, exist_ok=True)
                _remove_quietly(f"{parent}/{name}")
            dirs.append(path)
        cgroup = TaskCgroup(1, dirs, bounds=bounds)
        try:
            if not whole or not name.startswith(f"{POOL_PREFIX}{bounds}-"):
                _set_bounds_v1(dirs, cpu, memory_mb, pids_max)
            cgroup.oom_base = _oom_kills_in_name(name)
            if cgroup.oom_base is None:
                cgroup.oom_base = _oom_kills(memory)
        except (OSError, ValueError):
            cgroup.remove()
            raise
        return cgroup
    return create_task_cgroups_v1(parents, slug, cpu, memory_mb, pids_max)


def _set_bounds_v1(dirs: list[str], cpu: int, memory_mb: int, pids_max: int) -> None:
    """Rewrite a pooled set's bounds (-1 / max: none)."""
    memory, cpu_dir, pids = dirs
    limit = str(memory_mb * MIB) if memory_mb > 0 else "-1"
    try:
        _write(f"{memory}/memory.limit_in_bytes", limit)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        # Raised past memory.memsw.limit_in_bytes, which may not be below it: that first.
        _write(f"{memory}/memory.memsw.limit_in_bytes", limit)
        _write(f"{memory}/memory.limit_in_bytes", limit)
    try:
        _write(f"{memory}/memory.memsw.limit_in_bytes", limit)
    except FileNotFoundError:
        pass  # swap not accounted
    _write(f"{cpu_dir}/cpu.cfs_quota_us", str(cpu * _CPU_PERIOD_US) if cpu > 0 else "-1")
    _write(f"{pids}/pids.max", str(pids_max) if pids_max > 0 else "max")


def _oom_kills(memory: str) -> int:
    for line in _read(f"{memory}/memory.oom_control").splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    return 0


def _oom_kills_in_name(name: str) -> int | None:
    """The oom_kill count a pooled cgroup's name carries (release)."""
    parts = name[len(POOL_PREFIX):].split("-")
    if len(parts) == 5 and parts[3][:1] == "o" and parts[3][1:].isdigit():
        return int(parts[3][1:])
    return None


def _read(path: str) -> str:
    """A whole cgroup file (one read for the small ones)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _remove_pooled_set(name: str) -> None:
    # (one another shim took meanwhile carries a task's name by now: ENOENT)
    for parent in _pooled_parents:
        _remove_quietly(f"{parent}/{name}")


def remove_own_pooled() -> None:
    """Remove the cgroups this process put in the pool that no task took (a
    shim, as it exits)."""
    while _pooled_here:
        _remove_pooled_set(_pooled_here.pop())


def remove_pooled(parents: list[str]) -> None:
    """Remove the free cgroups of the pool (the launcher, as it closes). A
    shim taking one meanwhile gets ENOENT and takes another or makes one."""
    for parent in parents:
        try:
            names = [entry.path for entry in os.scandir(parent) if entry.name.startswith(POOL_PREFIX)]
        except OSError:
            continue
        for path in names:
            _remove_quietly(path)


def create_task_cgroups_v1(
    parents: list[str], slug: str, cpu: int, memory_mb: int, pids_max: int
) -> TaskCgroup:
    """A task's cgroup in each v1 hierarchy, its bounds set; what was made is
    removed again if a step fails."""
    made: list[str] = []
    try:
        for parent in parents:
            path = f"{parent}/{slug}"
            try:
                os.mkdir(path)
            except FileExistsError:
                pass  # the shim that claimed the task before died here: its bounds are set again
            except FileNotFoundError:  # the launcher removed the empty parent as it closed
                os.makedirs(path, exist_ok=True)
            made.append(path)
        memory, cpu_dir, pids = made
        if memory_mb > 0:
            _write(f"{memory}/memory.limit_in_bytes", str(memory_mb * MIB))
            try:  # no swap: the bound is on memory and swap together
                _write(f"{memory}/memory.memsw.limit_in_bytes", str(memory_mb * MIB))
            except OSError:
                pass  # swap not accounted (swapaccount=0): nothing to bound there
        if cpu > 0:
            _write(f"{cpu_dir}/cpu.cfs_period_us", str(_CPU_PERIOD_US))
            _write(f"{cpu_dir}/cpu.cfs_quota_us", str(cpu * _CPU_PERIOD_US))
        if pids_max > 0:
            _write(f"{pids}/pids.max", str(pids_max))
    except OSError:
        TaskCgroup(1, made).remove()
        raise
    return TaskCgroup(1, made, bounds=_bounds_tag(cpu, memory_mb, pids_max))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def leftover_cgroups(parents: list[Path]) -> dict[str, TaskCgroup]:
    """Task cgroups (v1) found under `parents`, by slug."""
    found: dict[str, list[str]] = {}
    for parent in parents:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                found.setdefault(entry.name, []).append(entry.path)
    return {slug: TaskCgroup(1, dirs) for slug, dirs in found.items()}


def disk_usage(path: str, stop_at: int) -> int:
    """Bytes on disk under `path` (allocated blocks, links not followed, one
    filesystem), stopping once `stop_at` is reached or WORK_DIR_LOOK_ENTRIES
    entries were seen."""
    total = 0
    seen = 0
    pending = [path]
    try:
        device = os.lstat(path).st_dev
    except OSError:
        return 0
    while pending and total < stop_at and seen < WORK_DIR_LOOK_ENTRIES:
        try:
            entries = os.scandir(pending.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_dev != device:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return total
