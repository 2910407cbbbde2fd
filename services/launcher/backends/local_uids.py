"""Which uid a job's tasks run as: allocated, recorded, never derived from the job.

A job's uid must be its alone: two jobs under one uid read each other's working
directories and environments and signal each other's processes. A uid computed
from the job id (as PAI once did: a hash, modulo the range) can be aimed at:
job ids are public, and a name whose hash lands on another job's uid is found by
trying names. So uids are handed out in turn, by the launcher alone, and
nothing a user chooses picks one.

The registry is a directory of the launcher's data dir, `uids/` (0700, the
platform's), holding one log, `uids/log` (0600): a line per allocation
(`+<uid> "<job id>"`), per release (`-<uid>`) and per reservation
(`^<uid>`, below). At start the backend reads it back (job -> uid): a job's
later attempts and retried tasks get the uid its first task got, across
restarts. One launcher writes it (it holds `uids/lock`, flock, from before it
reads the log until it exits: a second one, say a standby that took over while
the first still ran, is refused rather than hand out uids from a stale read),
and it hands out a uid only if no line holds it, so no uid is ever recorded for
two jobs. Why a log and not a file per uid (whose O_EXCL creation would make the
same guarantee): creating an inode costs up to a millisecond on a disk that
frees many (local_layout), and a line costs a write. A uid is released only
once retention removed the job's files and no process runs under it (the
backend checks /proc, `processes_of`); until then no other job can get it.
When released lines outnumber the live ones, the log is rewritten with the live
ones alone (a new file, fsynced, renamed over).

Crash safety: a uid's line is written (one write: a process killed at any
moment leaves it whole or absent) before the task that runs under it is handed
to a shim, so a launcher killed at any moment leaves no task under a uid the
registry does not hold. A machine crash could lose lines written shortly before
it (like every record of the local backend, they are not fsynced one by one:
an fsync per job would halve the launch rate on a disk); so the next uids to
hand out are also reserved ahead, RESERVE_BLOCK at a time, by a `^` line that
is fsynced (with everything before it), and a restarted launcher starts past
the last reservation: a uid handed out before a crash is never handed out
again in the same pass over the range.

The range, 0x70000000 to 0x7FFFFFFF (1879048192 to 2147483647), lies above
the ranges systemd hands out (to 0x6FFFFFFF) and below 2^31 (which some tools
read as signed), and is reserved for PAI on a machine that runs it: 2^28 uids,
days of allocation at the local backend's top launch rate before a pass wraps
around, and then only released uids are taken again.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

import msgspec

from services.launcher.backends.local_layout import TaskFiles, decode_record, is_record_name, read_task, write_all

log = logging.getLogger(__name__)

JOB_UID_BASE = 0x70000000
JOB_UID_COUNT = 1 << 28
UIDS_DIR = "uids"
LOG_FILE = "log"
LOCK_FILE = "lock"
# Uids reserved ahead by one fsynced line.
RESERVE_BLOCK = 1024
# The log is rewritten when it holds more than this many lines and more than
# twice as many as there are live allocations.
COMPACT_AFTER_LINES = 4096


class RegistryInUse(RuntimeError):
    """Another launcher holds the registry (and so the data dir)."""


class RangeExhausted(RuntimeError):
    """Every uid of the range is held by a job whose files or processes remain."""


class UidRegistry:
    """The job -> uid allocations of one data dir; see the module docstring."""

    def __init__(self, directory: Path, *, base: int = JOB_UID_BASE, count: int = JOB_UID_COUNT):
        self.directory = Path(directory)
        self.base, self.end = base, base + count
        self.directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self._path = str(self.directory / LOG_FILE)
        self._lock = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise RegistryInUse(f"{self.directory} is in use by another PAI launcher") from None
        self._fd = -1
        self._uid_of: dict[str, int] = {}
        self._job_of: dict[int, str] = {}
        # Everything before the last reservation may have been handed out before a crash: start there.
        self._cursor = self.base
        self._lines = 0
        self._replay()
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._reserved_from = self._reserved_to = self._cursor

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock >= 0:
            os.close(self._lock)  # (and the lock with it)
            self._lock = -1

    def __len__(self) -> int:
        return len(self._job_of)

    def get(self, job: str) -> int | None:
        return self._uid_of.get(job)

    def job_of(self, uid: int) -> str | None:
        return self._job_of.get(uid)

    def uid_of(self, job: str) -> int:
        """The job's uid, allocated now if it has none."""
        uid = self._uid_of.get(job)
        return uid if uid is not None else self._allocate(job)

    def adopt(self, job: str, uid: int) -> bool:
        """Record a uid a job already runs under (tasks started before the
        registry existed); False if another job holds it, or the job another uid."""
        if self._job_of.get(uid, job) != job or self._uid_of.get(job, uid) != uid:
            return False
        if uid not in self._job_of:
            self._append(b"+%d %s\n" % (uid, _encode(job)))
            self._remember(uid, job)
        return True

    def release(self, job: str) -> int | None:
        """Forget the job's uid (its files are gone and no process runs under it); the uid released."""
        uid = self._uid_of.pop(job, None)
        if uid is None:
            return None
        del self._job_of[uid]
        self._append(b"-%d\n" % uid)
        if self._lines > COMPACT_AFTER_LINES and self._lines > 2 * len(self._job_of):
            self._compact()
        return uid

    # -- plumbing ------------------------------------------------------------

    def _remember(self, uid: int, job: str) -> None:
        self._job_of[uid] = job
        self._uid_of.setdefault(job, uid)

    def _allocate(self, job: str) -> int:
        encoded = _encode(job)
        for _ in range(self.end - self.base):
            uid = self._next_candidate()
            if uid in self._job_of:
                continue  # held since an earlier pass over the range
            self._append(b"+%d %s\n" % (uid, encoded))
            self._remember(uid, job)
            return uid
        raise RangeExhausted(
            f"every job uid in [{self.base}, {self.end}) is held by a job whose files or processes remain"
        )

    def _next_candidate(self) -> int:
        uid = self._cursor
        if uid >= self.end:
            uid = self.base  # the next pass over the range
        if not self._reserved_from <= uid < self._reserved_to:
            self._reserved_from, self._reserved_to = uid, min(uid + RESERVE_BLOCK, self.end)
            self._append(b"^%d\n" % self._reserved_to)
            os.fsync(self._fd)  # the reservation, and every line before it, on disk before a uid it covers is used
        self._cursor = uid + 1
        return uid

    def _append(self, line: bytes) -> None:
        written = os.write(self._fd, line)
        if written != len(line):  # a full disk: the rest of the line, or the error
            write_all(self._fd, line[written:])
        self._lines += 1

    def _replay(self) -> None:
        try:
            with open(self._path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        complete = data.rfind(b"\n") + 1
        if complete < len(data):  # a line cut short (a machine crash): not a record, and cut away
            os.truncate(self._path, complete)
        for line in data[:complete].splitlines():
            try:
                kind, rest = line[:1], line[1:]
                if kind == b"+":
                    uid_text, _, job = rest.partition(b" ")
                    self._remember(int(uid_text), msgspec.json.decode(job, type=str))
                elif kind == b"-":
                    uid = int(rest)
                    job = self._job_of.pop(uid, None)
                    if job is not None and self._uid_of.get(job) == uid:
                        del self._uid_of[job]
                elif kind == b"^":
                    self._cursor = int(rest)
            except (ValueError, msgspec.DecodeError):
                log.warning("skipping a line of %s that does not decode: %r", self._path, line[:200])
            self._lines += 1

    def _compact(self) -> None:
        """The log rewritten with the live allocations alone, then the reservation in force."""
        lines = [b"+%d %s\n" % (uid, _encode(job)) for uid, job in self._job_of.items()]
        lines.append(b"^%d\n" % self._reserved_to)
        tmp = self._path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, b"".join(lines))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._lines = len(lines)


def _encode(job: str) -> bytes:
    return msgspec.json.encode(job)  # quoted and escaped: no line break inside


def processes_of(uids: set[int], proc: str = "/proc") -> set[int]:
    """Which of `uids` some process of this machine runs under (real, effective,
    saved or filesystem uid), from /proc/<pid>/status."""
    found: set[int] = set()
    if not uids:
        return found
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/status", "rb") as file:
                status = file.read()
        except OSError:
            continue  # gone meanwhile
        start = status.find(b"\nUid:")
        if start < 0:
            continue
        line = status[start + 5 : status.find(b"\n", start + 1)]
        found.update(uid for uid in map(int, line.split()) if uid in uids)
        if found == uids:
            break
    return found


def open_registry(data_dir: Path, tasks_dir: Path) -> UidRegistry:
    """The data dir's registry; made on first use with the uids that tasks
    already on record run under (launchers before it derived them from job
    ids), so that none of those is handed to another job. Made aside and
    renamed into place: a crash while it is filled leaves no half registry."""
    final = data_dir / UIDS_DIR
    if not final.exists():
        import shutil

        new = data_dir / (UIDS_DIR + ".new")
        shutil.rmtree(new, ignore_errors=True)
        registry = UidRegistry(new)
        adopted = sum(registry.adopt(job, uid) for job, uid in recorded_uids(tasks_dir))
        os.fsync(registry._fd)
        registry.close()
        os.rename(new, final)
        if adopted:
            log.info("job uid registry made in %s, with the %d uid(s) tasks on record ran under", final, adopted)
    return UidRegistry(final)


class _RecordedKey(msgspec.Struct):
    job: str


class _Recorded(msgspec.Struct):
    key: _RecordedKey
    uid: int | None = None


def recorded_uids(tasks_dir: Path) -> list[tuple[str, int]]:
    """(job, uid) of every task record in `tasks_dir` that names a uid of the range."""
    found: list[tuple[str, int]] = []
    if not tasks_dir.exists():
        return found
    for entry in os.scandir(tasks_dir):
        if not is_record_name(entry.name):
            continue
        read = read_task(TaskFiles(entry.path, in_dir=entry.is_dir()))
        spec = decode_record(read.spec_line, _Recorded) if read.spec_line else None
        if spec is not None and spec.uid is not None and JOB_UID_BASE <= spec.uid < JOB_UID_BASE + JOB_UID_COUNT:
            found.append((spec.key.job, spec.uid))
    return found
