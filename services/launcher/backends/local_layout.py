"""The on-disk record of one local task, shared by the local backend and its shims.

Each task attempt owns `<data_dir>/tasks/<key.slug>/`; the directory *is* the
durable record, so a launcher that restarts learns everything from it:

    spec.json      what to run, the identity of the shim running it, and, once
                   it ended, how (an exit record appended as a line of its own);
                   the directory is created (mkdir, which fails if it exists) by
                   the shim that claims the task, or by a stop that cancels it
                   first, and spec.json is written right after, so a task never
                   starts twice
    kill.json      a stop order (reason, grace) left for the shim
    output.log     stdout and stderr interleaved in arrival order (what `read_log` gives)
    stderr.log     stderr alone, so errors stay findable when stdout is chatty
    *.log.1        the previous segment of a capped log (see local_logs)
    reported.json  spec.json, renamed once the launcher recorded the exit
                   (`forget`; a rename costs far less than creating a file); logs stay

spec.json is lines: the spec first (one JSON object, no line break inside), then
each exit record written after a line break of its own (`append_exit`). A task
has one exit writer at a time (its shim, or the backend once no shim can be
alive), so there is one record; an append cut short by a crash leaves a line
that does not decode, which readers skip, and the next writer's line break sets
its record apart. The exit is appended rather than kept in a file of its own
because creating a file costs many times what an append does (on ext4 without a
journal, a creation soon after many deletions steps over each recently freed
inode: half a millisecond), and a task already creates its directory and
spec.json (and its working directory, when it takes over none). Launchers before this layout wrote the exit to `exit.json`
(LEGACY_EXIT); a task left running by one is still read from there.

The task's working directory (PAI_WORK_DIR) is apart, `<data_dir>/work/<key.slug>/`,
so that a task, which may run as another user (local_users), can reach it and
nothing else: `tasks/` and everything in it are the platform's alone (0700 and
0600: specs, logs, exit records), `work/` is traverse-only (0711: no listing) and
each working directory 0700, owned by the task's user. A task's working
directory is usually not new: the backend offers each task the one of a task
that ended moments before, and the shim renames it over if that task left it
bare (no entry, no extended attribute), made the new task's (local_shim's
_provide_work_dir); one a task wrote to stays its own until retention.

No fsync: these records must survive a launcher crash, and a machine crash
takes the tasks with it anyway. Every file operation counts (hundreds of tasks a
second on a small machine), so a quiet task creates one directory and one file
(and its working directory, when none was there to take over).

This module and the shim's import only the standard library and msgspec: shims
are forks of a process that imported them, and a smaller process forks faster
(hashlib, which maps OpenSSL, and tempfile are imported where the backend uses
them, not here: together a tenth of the fork server's memory).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TypeVar

import msgspec

TASKS_DIR = "tasks"
WORK_ROOT = "work"
# In the data dir: the name of its working directories' place outside it, when
# they are moved there (choose_work_root).
WORK_ROOT_ID = "work-root-id"
SPEC = "spec.json"
KILL = "kill.json"
REPORTED = "reported.json"
# Where shims of launchers before the exit was appended to spec.json wrote it.
LEGACY_EXIT = "exit.json"
OUTPUT_LOG = "output.log"
STDERR_LOG = "stderr.log"

# Every process of a task carries this variable: it tells which task a process
# that started its own session belongs to (local_procs).
TASK_KEY_ENV = "PAI_TASK_KEY"
WORK_DIR_ENV = "PAI_WORK_DIR"

# Exit code for a task whose real exit code cannot be known (it never started, or
# its shim died); the reason says which.
UNKNOWN_EXIT_CODE = -1

LIMITS_CGROUP = "cgroup"
LIMITS_RLIMIT = "rlimit"
LIMITS_NONE = "none"

# A task line sent to the fork server is its spec JSON, then, for a task whose
# commands use secrets, this byte and the JSON list of its commands with the
# secrets filled in. That part is never written to spec.json or any file: the
# shim hands it to the task's shell through an in-memory file (local_shim).
# JSON escapes every control character, so the byte cannot occur inside.
SECRET_SEPARATOR = b"\x1f"

# Modes of what the platform keeps (the launcher may run as root and its tasks
# as other users): private files and directories, traverse-only directories on
# the way to a task's working directory.
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
TRAVERSE_ONLY_MODE = 0o711


class ShimRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Who claimed a task; pid + kernel start time name the shim even after its
    pid is reused."""

    shimPid: int
    shimStartTicks: int
    detail: str = ""  # the bounds in force ("limits: ...")
    claimedAt: float = 0.0
    cancelled: bool = False  # a stop claimed it first: it never starts


class ShimSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The part of spec.json a shim reads (the backend writes more: local.TaskSpec).

    Defaults are omitted when encoding: the claim adds `shim` in front of the
    backend's JSON (`with_claim`), which must not carry a `shim` of its own.
    """

    taskDir: str
    slug: str
    workDir: str = ""  # "": `<taskDir>/work` (specs written before it was apart)
    # The working directory of a task that ended, offered to this one: taken
    # over (renamed) if the ended task left it bare, rather than a new one made
    # (local_shim._provide_work_dir).
    takeOverWorkDir: str = ""
    commands: list[str]
    env: dict[str, str]  # complete: inherited basics + launch env + PAI markers
    cpu: int
    memoryMB: int
    limits: str = LIMITS_NONE  # the mode asked for; the shim reports what it got
    cgroupParent: str = ""
    graceSeconds: float = 10.0
    logCapBytes: int = 64 * 1024 * 1024
    # Who the task runs as (the shim drops to it; see local_users); None: the
    # shim's own user (the platform does not run as root).
    uid: int | None = None
    gid: int | None = None
    shim: ShimRecord | None = None  # added by whoever claims the task
    # When the backend sent this copy (time.time(); `with_sent_at`). The backend
    # sends a task again while no shim claimed it (local.RESEND_SECONDS); a copy
    # read later than STALE_LINE_SECONDS is not taken: had it been, the task
    # could have ended and been pruned (its directory, the claim, gone)
    # meanwhile, and would run a second time.
    sentAt: float = 0.0

    @property
    def work_dir(self) -> str:
        return self.workDir or os.path.join(self.taskDir, "work")


def with_claim(spec_json: bytes, record: ShimRecord) -> bytes:
    """The spec as sent by the backend, with `shim` added, without decoding it
    whole (the shim knows only its part of it)."""
    if not spec_json.startswith(b"{") or spec_json == b"{}":
        raise ValueError("a task spec is a non-empty JSON object")
    return b'{"shim":' + encode(record) + b"," + spec_json[1:]


STALE_LINE_SECONDS = 3600.0


def with_sent_at(spec_line: bytes, at: float) -> bytes:
    """A task line (spec JSON first) with `sentAt` added, without decoding it."""
    if not spec_line.startswith(b"{"):
        raise ValueError("a task spec is a JSON object")
    return b'{"sentAt":' + _encoder.encode(at) + b"," + spec_line[1:]


class KillRequest(msgspec.Struct, frozen=True, kw_only=True):
    reason: str
    graceSeconds: float


class ExitRecord(msgspec.Struct, frozen=True, kw_only=True):
    exitCode: int
    signal: int | None = None
    platformReason: str = ""
    platformMessage: str = ""
    memoryPeakMB: int | None = None
    startedAt: float | None = None
    finishedAt: float = 0.0
    logDroppedBytes: int = 0
    outputBytes: int = 0  # all the task wrote to stdout and stderr
    cpuSeconds: float | None = None  # user + system time of the task's processes


T = TypeVar("T")

_encoder = msgspec.json.Encoder()
# One decoder per record type, built once: building one is costly, and in a
# forked shim it would also copy the pages it touches.
_decoders: dict[type, msgspec.json.Decoder] = {}


def encode(record: msgspec.Struct) -> bytes:
    return _encoder.encode(record)


def decoder(record_type: type[T]) -> msgspec.json.Decoder[T]:
    found = _decoders.get(record_type)
    if found is None:
        found = _decoders[record_type] = msgspec.json.Decoder(record_type)
    return found


def read_record(path: Path | str, record_type: type[T]) -> T | None:
    """The record at `path`, or None when it is absent or not (yet) whole."""
    try:
        data = read_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return decode_record(data, record_type)


def decode_record(data: bytes, record_type: type[T]) -> T | None:
    """The record `data` holds, or None when it is not a whole one."""
    try:
        return decoder(record_type).decode(data)
    except msgspec.DecodeError:
        return None


def read_task_spec(task_dir: str, spec_type: type[T]) -> T | None:
    """The task's spec (the first line of its spec.json), or None while it is
    not (yet) written whole."""
    spec_line = _read_task_file(task_dir)[0]
    return decode_record(spec_line, spec_type) if spec_line else None


def read_task_exit(task_dir: str, file: str = SPEC) -> ExitRecord | None:
    """The task's exit: the first whole record after the spec line; for a task
    whose shim ran under an older launcher, the one in LEGACY_EXIT. `file`:
    REPORTED to read it once the launcher recorded the exit."""
    for line in _read_task_file(task_dir, file)[1].split(b"\n"):
        if line and (record := decode_record(line, ExitRecord)) is not None:
            return record
    return read_record(f"{task_dir}/{LEGACY_EXIT}", ExitRecord)


def _read_task_file(task_dir: str, file: str = SPEC) -> tuple[bytes, bytes]:
    """spec.json (or `file`) split into the spec line and what follows it."""
    try:
        data = read_file(f"{task_dir}/{file}")
    except (FileNotFoundError, NotADirectoryError):
        return b"", b""
    spec_line, _, after = data.partition(b"\n")
    return spec_line, after


def append_exit(task_dir: str, record: bytes) -> None:
    """Record a task's exit: `record` (encoded, one line) appended to its spec.json
    after a line break. A spec.json not written yet (its claimer died first) is
    created holding an empty spec line and the exit."""
    fd = os.open(f"{task_dir}/{SPEC}", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        _write_all(fd, b"\n" + record + b"\n")
    finally:
        os.close(fd)


def _tmp_name(path: Path | str, pid: int) -> str:
    directory, slash, name = os.fspath(path).rpartition("/")
    return f"{directory}{slash}.{name}.{pid}.tmp"


def write_replacing(path: Path | str, data: bytes, *, pid: int | None = None) -> None:
    """Replace `path` atomically with `data` (a file named after the writer's
    `pid`, default ours, then a rename); a shim passes the pid it knows
    (os.getpid() is a system call each time)."""
    tmp = _tmp_name(path, os.getpid() if pid is None else pid)
    write_file(tmp, data)
    os.replace(tmp, path)


# A record is a few hundred bytes written or read whole, several times per task:
# plain fd calls, without the buffered file object that open() builds around
# them (and its fstat, isatty ioctl and lseek).


def write_file(path: Path | str, data: bytes) -> None:
    """Create or truncate `path` (mode 0666 less the umask) holding `data`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_file(path: Path | str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def claim_dir(task_dir: Path | str) -> bool:
    """Create the task directory; False if someone (shim or stop) already did."""
    try:
        os.mkdir(task_dir)
        return True
    except FileExistsError:
        return False


# --- where working directories live ----------------------------------------------------------


def traversable_by_anyone(path: Path) -> bool:
    """Whether a user with no rights of its own may pass through `path` and every
    directory above it (each has the others' x bit; one not made yet will be, 0755)."""
    for each in (path, *path.parents):
        try:
            if not os.stat(each).st_mode & stat.S_IXOTH:
                return False
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


def choose_work_root(data_dir: Path, *, tasks_are_other_users: bool, temp_dirs: list[Path] | None = None) -> Path:
    """Where tasks' working directories go: `<data_dir>/work`, unless tasks run as
    users of their own and a directory above the data dir bars them (e.g. /root or
    /tmp/pytest-of-root, 0700). A task inside its working directory can still use
    relative paths there, but a program that makes them absolute first -- `python3
    script.py` does -- is refused its own files (EACCES). Then the working
    directories go in a directory of the platform's own under the first temporary
    directory anyone can pass through, named after the data dir (`data_dir_id`: a
    restart finds them again). With none of those, `<data_dir>/work` as before."""
    default = data_dir / WORK_ROOT
    if not tasks_are_other_users or traversable_by_anyone(data_dir.parent):
        return default
    import tempfile  # not at the top: see the module docstring

    for temp in temp_dirs if temp_dirs is not None else [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp")]:
        if traversable_by_anyone(temp):
            return temp / f"pai-work-{data_dir_id(data_dir)}"
    return default


def data_dir_id(data_dir: Path) -> str:
    """This data dir's name for things kept outside it: made once and kept in it
    (WORK_ROOT_ID), so a restart finds them again, while a data dir removed and
    made anew at the same path gets a name of its own -- else its first task of
    an old name and attempt would find its working directory taken.

    A data dir that tasks used before the name was kept goes on with the name
    it had then: a digest of its path."""
    import hashlib  # not at the top: see the module docstring
    import secrets

    path = data_dir / WORK_ROOT_ID
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    used_before = (data_dir / TASKS_DIR).exists()
    made = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16] if used_before else secrets.token_hex(8)
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path, os.getpid())
    write_file(tmp, made.encode())
    try:
        os.link(tmp, path)  # the first to make one wins; the others read it
    except FileExistsError:
        made = path.read_text().strip()
    finally:
        os.unlink(tmp)
    return made


def make_own_dir(path: Path, mode: int) -> None:
    """Create `path` with `mode`, or accept it when it is already ours: a real
    directory (not a link) owned by this user, writable by nobody else. In a shared
    temporary directory anyone may have made the name first; that is refused."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(f"{path} exists but is not a directory of this user's alone; "
                                  "remove it or choose another data directory") from None
    os.chmod(path, mode)

