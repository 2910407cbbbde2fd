"""CPU and memory bounds for a local task: cgroup v2 where allowed, else rlimits.

- cgroup v2 (when the cgroup2 filesystem is mounted and we may enable the cpu
  and memory controllers under our own cgroup, or under a delegated parent an
  admin names): one cgroup per task with `cpu.max` (the task's cpus),
  `memory.max` (its memoryMB, the whole task together), no swap, and
  `memory.oom.group` so an OOM kill takes the whole task, like a container.
  The cgroup also lists every process of the task, however it detached.
- rlimit otherwise: RLIMIT_DATA = memoryMB for each process of the task. Not
  RLIMIT_AS: that counts address space merely reserved (CUDA, the JVM, Go and
  glibc thread arenas reserve far more than they use) and breaks such programs.
  RLIMIT_DATA counts heap and private writable mappings, i.e. memory actually
  asked for, so allocation beyond it fails (MemoryError, bad_alloc, ENOMEM).
  It bounds each process, not their sum. CPU stays unbounded (RLIMIT_CPU
  limits seconds used, not a share).
- none: nothing enforced.

Which one is in force is reported in TaskRunning.detail ("limits: ...").
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

from services.launcher.backends.local_layout import LIMITS_CGROUP, LIMITS_RLIMIT

CGROUP_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("cpu", "memory")
_CPU_PERIOD_US = 100_000
MIB = 1024 * 1024


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


def describe(mode: str, cpu: int, memory_mb: int) -> str:
    if mode == LIMITS_CGROUP:
        return f"limits: cgroup v2 (cpu.max {cpu} cpu, memory.max {memory_mb} MiB, whole task)"
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


def prelude(mode: str, cgroup: Path | None, memory_mb: int) -> str:
    """Shell lines the task runs before its commands, to enter its bounds.

    The task is spawned (vfork + exec, far cheaper than fork from Python), so
    nothing runs in the child before exec: the task's shell applies its own
    bounds first, before it can start anything. `ulimit -d` sets the soft and
    hard limit, so the commands cannot raise it again.
    """
    if mode == LIMITS_CGROUP and cgroup is not None:
        return f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))}\n"
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


def remove_cgroup(cgroup: Path) -> None:
    try:
        cgroup.rmdir()
    except OSError:
        pass
