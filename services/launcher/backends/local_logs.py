"""Task logs with a size cap that keeps the end.

The end of a log is what explains a failure (the runtime's rules match on the
log tail), so a capped log keeps its newest bytes: each file is written in two
segments of half the cap; when the current one is full it becomes `<name>.1`
(replacing the older one) and a new one starts. On disk a log never exceeds the
cap, and at least the last half of the cap is always kept. Reading joins the two
segments and says how much was dropped before them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

DROPPED_NOTE = "[PAI: log capped at {cap} bytes; {dropped} earlier bytes were dropped]\n"


# The files of one log: the log itself and those named after it (below); retention
# removes them all (local_layout.remove_task_files).
SEGMENT_SUFFIX = ".1"
DROPPED_SUFFIX = ".dropped"
DISK_FULL_SUFFIX = ".disk-full"
LOG_FILE_SUFFIXES = ("", SEGMENT_SUFFIX, DROPPED_SUFFIX, DISK_FULL_SUFFIX)


def previous_segment(path: Path | str) -> Path:
    return Path(f"{path}{SEGMENT_SUFFIX}")


def dropped_note(path: Path | str) -> Path:
    """Holds how many bytes the cap dropped; absent while nothing was."""
    return Path(f"{path}{DROPPED_SUFFIX}")


def dropped_bytes(path: Path) -> int:
    try:
        return int(dropped_note(path).read_text())
    except (FileNotFoundError, ValueError):
        return 0


# A write that fails with these means the disk (or the user's quota) is full.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_PLATFORM_REASON = "LogDiskFull"  # the exit's platformReason
DISK_FULL_NOTE = b"[pai: the rest of this log was dropped: no space left on device (ENOSPC) on the launcher's data disk]\n"


def disk_full_marker(path: Path | str) -> Path:
    return Path(f"{path}{DISK_FULL_SUFFIX}")


class CappedLog:
    """Append-only file with rotation; created on first write (most tasks are quiet).

    `path` may be a string: a shim makes two logs per task, and needs a Path
    only when a log rotates or fills the disk."""

    def __init__(self, path: Path | str, cap_bytes: int):
        self.path = path
        self.segment_bytes = max(1, cap_bytes // 2)
        self.dropped_bytes = 0
        self.disk_full = False  # a write met a full disk: the rest of the output is dropped
        self._fd: int | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        if self.disk_full:
            self.dropped_bytes += len(data)
            return
        try:
            self._write(data)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            self._give_back(len(data))

    def _give_back(self, lost: int) -> None:
        """The disk is full: this log gives back what it holds, so the task's exit
        can still be recorded and other tasks go on, and keeps nothing more of
        this task's output; a marker says why (read_log shows it first)."""
        self.disk_full = True
        self.dropped_bytes += lost
        self._drop_all()
        try:
            disk_full_marker(self.path).touch()
        except OSError:
            pass  # read_log still notes what the dropped count says

    def _write(self, data: bytes) -> None:
        if len(data) > self.segment_bytes:
            # Only the end of an oversized chunk survives; all before it is older.
            self._drop_all()
            self._count_dropped(len(data) - self.segment_bytes)
            data = data[-self.segment_bytes :]
        elif self._size + len(data) > self.segment_bytes:
            self._rotate()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self._fd, data)
        self._size += len(data)

    def _rotate(self) -> None:
        self.close()
        previous = previous_segment(self.path)
        if previous.exists():
            self._count_dropped(previous.stat().st_size)
        os.replace(self.path, previous)
        self._size = 0

    def _drop_all(self) -> None:
        self.close()
        for segment in (Path(self.path), previous_segment(self.path)):
            try:
                size = segment.stat().st_size
                segment.unlink()
            except FileNotFoundError:
                continue
            self._count_dropped(size)
        self._size = 0

    def _count_dropped(self, count: int) -> None:
        if count:
            self.dropped_bytes += count
            try:
                dropped_note(self.path).write_text(str(self.dropped_bytes))
            except OSError as exc:
                if exc.errno not in DISK_FULL_ERRNOS:
                    raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_log(path: Path, *, cap_bytes: int, tail_bytes: int | None = None) -> bytes:
    """The log as kept: both segments, with a note first if the cap dropped output.

    `tail_bytes` returns at most that many bytes from the end (no note). When
    the disk filled up, the log ends with a note saying so: it is in every
    tail, where the runtime's DiskFull rule finds "no space left on device".
    """
    if disk_full_marker(path).exists():
        kept = _read_joined(path, None if tail_bytes is None else max(0, tail_bytes - len(DISK_FULL_NOTE)), cap_bytes)
        note = DISK_FULL_NOTE if tail_bytes is None else DISK_FULL_NOTE[-tail_bytes:] if tail_bytes else b""
        return kept + note
    return _read_joined(path, tail_bytes, cap_bytes)


def _read_joined(path: Path, tail_bytes: int | None, cap_bytes: int) -> bytes:
    current = _read_end(path, tail_bytes)
    if tail_bytes is not None and len(current) >= tail_bytes:
        return current
    remaining = None if tail_bytes is None else tail_bytes - len(current)
    kept = _read_end(previous_segment(path), remaining) + current
    dropped = dropped_bytes(path)
    if tail_bytes is None and dropped:
        return DROPPED_NOTE.format(cap=cap_bytes, dropped=dropped).encode() + kept
    return kept


def _read_end(path: Path, count: int | None) -> bytes:
    try:
        with open(path, "rb") as log:
            if count is not None:
                size = os.fstat(log.fileno()).st_size
                log.seek(max(0, size - count))
            return log.read()
    except FileNotFoundError:
        return b""
