"""The on-disk record of one local task, shared by the local backend and its shims.

Each task attempt owns the file `<data_dir>/tasks/<key.slug>`, its record, and
the files beside it named `<slug>.<name>` (a slug ends with the attempt's
number and holds no other name's dots, so no such name is another task's
record). The record *is* the durable state, so a launcher that restarts learns
everything from it:

    <slug>             what to run, the identity of the shim running it, and, once
                       it ended, how (an exit record appended as a line of its own),
                       and, once the launcher recorded that end, REPORTED_LINE; the
                       file is created (O_EXCL: it fails if the name exists) by the
                       shim that claims the task, or by a stop that cancels it first,
                       which writes the spec through the same descriptor, so a task
                       never starts twice
    <slug>.kill.json   a stop order (reason, grace) left for the shim
    <slug>.output.log  stdout and stderr interleaved in arrival order (what `read_log` gives)
    <slug>.stderr.log  stderr alone, so errors stay findable when stdout is chatty
    <slug>.*.log.1     the previous segment of a capped log (see local_logs)
    <slug>.shim.error  the shim's traceback, for a task it could not start

The record is lines: the spec first (one JSON object, no line break inside), then
each line appended after a line break of its own (`append_exit`,
`mark_reported`). A task has one exit writer at a time (its shim, or the backend
once no shim can be alive), so there is one exit record; an append cut short by
a crash leaves a line that does not decode, which readers skip, and the next
writer's line break sets its line apart.

Why one file: creating an inode is the costly part of a record. On ext4 without
a journal (this kind of machine's root filesystem) each creation steps over
every inode freed in the last one to six minutes, so on a platform that prunes
as fast as it starts tasks, each costs up to a millisecond; the exit and the
reported mark are appended for the same reason, rather than kept in files of
their own. A quiet task creates its record and nothing else (and its working
directory, when it takes over none).

Launchers before this layout kept each task in a directory `tasks/<slug>/`
(spec.json, renamed reported.json once reported; kill.json, the logs and, before
exits were appended, exit.json inside it). `TaskFiles.found` tells the two
apart; a task such a launcher left is read, stopped, reported and pruned where
it is. The same name fences both: a directory's `mkdir` and a file's `O_EXCL`
each fail while the other's entry exists, so an old shim and a new one never
both claim a task.

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
takes the tasks with it anyway.

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

from libs.common.storages import Storage
from services.launcher.backends.local_logs import LOG_FILE_SUFFIXES

TASKS_DIR = "tasks"
WORK_ROOT = "work"
# In the data dir: the name of its working directories' place outside it, when
# they are moved there (choose_work_root).
WORK_ROOT_ID = "work-root-id"
# Files beside a task's record, as `<slug>.<name>` (module doc).
KILL = "kill.json"
OUTPUT_LOG = "output.log"
STDERR_LOG = "stderr.log"
SHIM_ERROR = "shim.error"
SIDE_FILES = (KILL, SHIM_ERROR, *(log + suffix for log in (OUTPUT_LOG, STDERR_LOG) for suffix in LOG_FILE_SUFFIXES))
_SIDE_SUFFIXES = tuple("." + name for name in SIDE_FILES)
# The last line of a record the launcher has reported (`mark_reported`).
REPORTED_LINE = b'{"reported":true}'
# A task directory of a launcher before records were single files: the record
# in it, that record once reported, and where shims before exits were appended
# wrote the exit.
LEGACY_SPEC = "spec.json"
LEGACY_REPORTED = "reported.json"
LEGACY_EXIT = "exit.json"

# Every process of a task carries this variable: it tells which task a process
# that started its own session belongs to (local_procs).
TASK_KEY_ENV = "PAI_TASK_KEY"
WORK_DIR_ENV = "PAI_WORK_DIR"

# Exit code for a task whose real exit code cannot be known (it never started, or
# its shim died); the reason says which.
UNKNOWN_EXIT_CODE = -1

LIMITS_CGROUP = "cgroup"  # cgroup v2
LIMITS_CGROUP_V1 = "cgroup1"  # cgroup v1: memory, cpu and pids hierarchies
LIMITS_RLIMIT = "rlimit"
LIMITS_NONE = "none"
# At most this many processes and threads per task (cgroup pids.max), unless
# the backend is given another cap: a fork bomb ends there, not at pid_max.
DEFAULT_PIDS_MAX = 4096
# Each task's private /dev/shm and /tmp (tmpfs in its own mount namespace) hold
# at most its memoryMB each; what they hold is charged to its memory cgroup, so
# together with everything else the task uses they stay within memoryMB.
# Its working directory holds at most DEFAULT_WORK_DIR_MB (local_limits: how).
DEFAULT_WORK_DIR_MB = 10 * 1024

# A task line sent to the fork server is its spec JSON, then, for a task whose
# commands use secrets, this byte and the JSON list of its commands with the
# secrets filled in. That part is never written to spec.json or any file: the
# shim hands it to the task's shell through an in-memory file (local_shim).
# JSON escapes every control character, so the byte cannot occur inside.
SECRET_SEPARATOR = b"\x1f"

# Modes of what the platform keeps (the launcher may run as root and its tasks
# as other users): private files and directories, traverse-only directories on
# the way to a task's working directory.
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

    # `tasks/<slug>`: the task's record (module doc); named taskDir on the wire,
    # as in the records of launchers that kept a directory there.
    taskPath: str = msgspec.field(name="taskDir")
    slug: str
    workDir: str = ""  # "": `<taskPath>/work` (specs written before it was apart)
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
    # cgroup v1: the parents of the task's cgroups, memory, cpu and pids in this order.
    cgroupParents: list[str] = []
    pidsMax: int = 0  # 0: DEFAULT_PIDS_MAX
    # Whether the task gets a mount namespace of its own (its /proc hidepid=2,
    # private /dev/shm and /tmp): the backend found the kernel allows it.
    privateMounts: bool = False
    # The job's storages (libs/common/storages.py): the shim binds each into the
    # task's mount namespace at its mount path (core/mounts.py, local_namespaces).
    storages: list[Storage] = []
    # The platform's directories the task runs from (its TensorBoard:
    # local._platform_dirs); those its private /tmp or /dev/shm would hide are
    # bound back read-only (local_namespaces.plan).
    platformDirs: list[str] = []
    workDirMB: int = 0  # the bound on its working directory's size; 0: none
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
        return self.workDir or os.path.join(self.taskPath, "work")


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


class TaskFiles:
    """Where one task attempt's files are: its record `tasks/<slug>` and the files
    beside it, or (`in_dir`) the directory of a launcher before records were
    single files (module doc)."""

    __slots__ = ("in_dir", "path")

    def __init__(self, path: str, *, in_dir: bool = False):
        self.path = path  # `tasks/<slug>`, a file or (in_dir) a directory
        self.in_dir = in_dir

    @classmethod
    def found(cls, path: str) -> TaskFiles | None:
        """The task's files as they are on disk; None when there is nothing at `path`."""
        try:
            return cls(path, in_dir=stat.S_ISDIR(os.stat(path).st_mode))
        except (FileNotFoundError, NotADirectoryError):
            return None

    @property
    def record(self) -> str:
        return f"{self.path}/{LEGACY_SPEC}" if self.in_dir else self.path

    def beside(self, name: str) -> str:
        """The path of the task's file `name` (KILL, OUTPUT_LOG, ...)."""
        return f"{self.path}/{name}" if self.in_dir else f"{self.path}.{name}"


def is_record_name(name: str) -> bool:
    """Whether an entry of `tasks/` is a task's record (or old directory), not a
    file beside one or a temporary file."""
    return not name.startswith(".") and not name.endswith(_SIDE_SUFFIXES)


def claim(path: str) -> int | None:
    """Create the task's record at `path`, returning a descriptor to write its spec
    through (`write_and_close`); None if someone (a shim or a stop) already
    claimed the task, in this layout or the one before."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        return None


def write_and_close(fd: int, data: bytes) -> None:
    """Write all of `data` through `fd`, then close it (also when the write fails)."""
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


class TaskRead(msgspec.Struct, frozen=True):
    """What a task's record says, from one read."""

    spec_line: bytes  # b"": not (yet) written
    exit: ExitRecord | None
    reported: bool


def read_task(files: TaskFiles) -> TaskRead:
    """The task's record: its spec line, its exit (the first whole exit record after
    the spec line; for a task whose shim ran under an older launcher, the one in
    LEGACY_EXIT) and whether the launcher recorded that end."""
    data, reported = _read_record(files)
    spec_line, _, after = data.partition(b"\n")
    exit_record = None
    for line in after.split(b"\n"):
        if line == REPORTED_LINE:
            reported = True
        elif line and exit_record is None:
            exit_record = decode_record(line, ExitRecord)
    if exit_record is None and files.in_dir:
        exit_record = read_record(f"{files.path}/{LEGACY_EXIT}", ExitRecord)
    return TaskRead(spec_line, exit_record, reported)


def _read_record(files: TaskFiles) -> tuple[bytes, bool]:
    """The record's bytes (b"" when there is none), and whether an old directory
    says it was reported (its spec.json renamed)."""
    try:
        return read_file(files.record), False
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass
    if files.in_dir:
        try:
            return read_file(f"{files.path}/{LEGACY_REPORTED}"), True
        except (FileNotFoundError, NotADirectoryError):
            pass
    return b"", False


def read_task_spec(files: TaskFiles, spec_type: type[T]) -> T | None:
    """The task's spec (the first line of its record), or None while it is not
    (yet) written whole."""
    spec_line = _read_record(files)[0].partition(b"\n")[0]
    return decode_record(spec_line, spec_type) if spec_line else None


def read_task_exit(files: TaskFiles) -> ExitRecord | None:
    """The task's exit, or None while none is recorded (`read_task`)."""
    return read_task(files).exit


def append_exit(files: TaskFiles, record: bytes) -> None:
    """Record a task's exit: `record` (encoded, one line) appended to its record
    after a line break. A record not written yet (its claimer died first) is
    created holding an empty spec line and the exit."""
    _append_line(files.record, record, create=True)


def mark_reported(files: TaskFiles) -> None:
    """Say in the task's record that the launcher recorded its end: a restarted
    launcher does not report it again, and retention may remove it. A record
    claimed but never written is marked too (it never ran). The name stays
    taken: a copy of the task's start sent long ago cannot claim it again."""
    if files.in_dir:
        try:
            os.rename(files.record, f"{files.path}/{LEGACY_REPORTED}")
        except FileNotFoundError:
            if os.path.isdir(files.path):  # claimed, its spec not written: never report it
                write_file(f"{files.path}/{LEGACY_REPORTED}", b"")
        return
    try:
        _append_line(files.record, REPORTED_LINE, create=False)
    except FileNotFoundError:
        pass  # never claimed: nothing to report


def remove_task_files(files: TaskFiles) -> bool:
    """Remove the task's record and every file beside it (retention). True when
    something was there."""
    if files.in_dir:
        import shutil  # not at the top: see the module docstring

        shutil.rmtree(files.path, ignore_errors=True)
        return True
    removed = False
    for path in (files.path, *(files.beside(name) for name in SIDE_FILES)):
        try:
            os.unlink(path)
            removed = True
        except FileNotFoundError:
            pass
    return removed


def _append_line(path: str, line: bytes, *, create: bool) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    write_and_close(os.open(path, flags, 0o666), b"\n" + line + b"\n")


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
    write_and_close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666), data)


def write_all(fd: int, data: bytes) -> None:
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

