"""Finding and signalling a task's processes through /proc (Linux).

Stdlib only, because the shim imports it. A task's processes are found by:
- its process group (the task leader's pid), for the ordinary case;
- the `PAI_TASK_KEY` marker in /proc/<pid>/environ, for those that started their
  own session. The shim is a child subreaper, so such a process stays a
  descendant of the shim even after its parent exits; with the shim gone, a
  scan of all processes finds them. (A process that scrubs its environment
  escapes the marker; the shim still kills every descendant before it exits,
  and a cgroup, where there is one, holds them all.)
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterable

_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)  # loaded once, before the fork server forks


def set_child_subreaper() -> bool:
    return _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def set_process_name(name: str) -> None:
    """What `ps -o comm` and `top` show (a fork keeps its parent's command line)."""
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].decode().split()


def start_ticks(pid: int) -> int | None:
    """Kernel start time of a live process (None if gone or a zombie).

    Together with the pid it names one process: a reused pid has another start time.
    """
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_alive(pid: int, ticks: int) -> bool:
    return pid > 0 and start_ticks(pid) == ticks


def _parents() -> dict[int, int]:
    parent_of: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and fields[0] not in ("Z", "X"):
                parent_of[int(name)] = int(fields[1])
    return parent_of


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            found.append(child)
            frontier.append(child)
    return found


def children(pid: int) -> list[int]:
    """Direct children of a single-threaded process (needs CONFIG_PROC_CHILDREN,
    which common kernels have; without it, a full `descendants` walk)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as listing:
            return [int(child) for child in listing.read().split()]
    except FileNotFoundError:
        return [child for child, parent in _parents().items() if parent == pid]
    except OSError:
        return []


def has_marker(pid: int, needle: bytes) -> bool:
    """Whether the process's environment holds the entry `needle` (`NAME=value`)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return needle in environ.read().split(b"\0")
    except OSError:
        return False


def marker_entry(marker: str, task_slug: str) -> bytes:
    return f"{marker}={task_slug}".encode()


def marked(task_slug: str, marker: str) -> list[int]:
    """Live processes whose environment carries `marker=task_slug`."""
    needle = marker_entry(marker, task_slug)
    own = os.getpid()
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit()
        and int(name) != own
        and has_marker(int(name), needle)
        and start_ticks(int(name)) is not None
    ]


def signal_group(pgid: int, sig: int) -> None:
    if pgid > 0:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_each(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def sweep_marked(task_slug: str, marker: str) -> None:
    """SIGKILL every process of a task whose shim is gone."""
    for _ in range(5):  # strays may fork while we look; a killed one cannot
        strays = marked(task_slug, marker)
        if not strays:
            return
        signal_each(strays, signal.SIGKILL)
