"""The on-disk record of one local task, shared by the local backend and its shim.

Each task attempt owns `<data_dir>/tasks/<key.slug>/`; the directory *is* the
durable record, so a launcher that restarts learns everything from it:

    spec.json    what to run, commands included (written by the backend right
                 after creating the directory, before anything can start)
    work/        the working directory (PAI_WORK_DIR)
    shim.json    the claim: created exclusively (O_EXCL) by the shim that runs the
                 task, or by a stop that cancels it first, so a task never starts
                 twice
    kill.json    a stop order (reason, grace) left for the shim
    output.log   stdout and stderr interleaved in arrival order (what `read_log` gives)
    stderr.log   stderr alone, so errors stay findable when stdout is chatty
    *.log.1      the previous segment of a capped log (see local_logs)
    exit.json    how the task ended, replaced atomically (tmp + rename) by its one
                 writer: the shim, or the backend once no shim can be alive
    reported     the launcher recorded the exit (`forget`); logs stay

No fsync: these records must survive a launcher crash, and a machine crash
takes the tasks with it anyway. Every file operation counts here (a few hundred
tasks a second on a small machine), hence no staging directories.

This module and the shim's import only the standard library and msgspec: every
shim is a fork of a process that imported them, and a smaller process forks faster.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import TypeVar

import msgspec

TASKS_DIR = "tasks"
SPEC = "spec.json"
WORK = "work"
SHIM = "shim.json"
KILL = "kill.json"
EXIT = "exit.json"
REPORTED = "reported"
OUTPUT_LOG = "output.log"
STDERR_LOG = "stderr.log"

# Every process of a task carries this variable; after its shim is gone it is the
# only way left to find processes that started their own session.
TASK_KEY_ENV = "PAI_TASK_KEY"
WORK_DIR_ENV = "PAI_WORK_DIR"

# Exit code for a task whose real exit code cannot be known (it never started, or
# its shim died); the reason says which.
UNKNOWN_EXIT_CODE = -1

LIMITS_CGROUP = "cgroup"
LIMITS_RLIMIT = "rlimit"
LIMITS_NONE = "none"


class ShimSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The part of spec.json a shim reads (the backend writes more: see local.TaskSpec)."""

    slug: str
    commands: list[str]
    env: dict[str, str]  # complete: inherited basics + launch env + PAI markers
    cpu: int
    memoryMB: int
    limits: str = LIMITS_NONE  # the mode asked for; the shim reports what it got
    cgroupParent: str = ""
    graceSeconds: float = 10.0
    logCapBytes: int = 64 * 1024 * 1024


class ShimRecord(msgspec.Struct, frozen=True, kw_only=True):
    # pid + kernel start time identify the shim even after its pid is reused.
    shimPid: int
    shimStartTicks: int
    detail: str = ""
    claimedAt: float = 0.0
    cancelled: bool = False  # a stop claimed it first: never start


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


T = TypeVar("T")

_encoder = msgspec.json.Encoder()


def encode(record: msgspec.Struct) -> bytes:
    return _encoder.encode(record)


def read_record(path: Path, record_type: type[T]) -> T | None:
    """The record at `path`, or None when it is absent or not (yet) whole."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return msgspec.json.decode(data, type=record_type)
    except msgspec.DecodeError:
        return None


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_replacing(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def claim(path: Path, data: bytes) -> bool:
    """Create `path` exclusively and write `data`; False if it already exists.

    Readers may briefly find it empty (see `read_record`); what counts is who
    created it.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return True


def doorbell_name(data_dir: Path) -> str:
    """Name of the abstract unix socket on which the backend hears from its shims.

    Abstract names have no file to go stale and no 108-byte path limit; one per
    data dir, so binding it also proves no other launcher uses that dir.
    """
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:24]
    return f"pai-local-{digest}"


def doorbell_address(name: str) -> str:
    return "\0" + name  # a leading NUL puts the name in the abstract namespace


# Doorbell messages: one datagram each, `R<slug>\n<detail>` (running) or
# `F<slug>` (exit.json written). A lost datagram only delays the news: the
# backend also sweeps the task directories.
RUNNING_BELL = b"R"
FINISHED_BELL = b"F"


class Doorbell:
    """A shim's side of the doorbell; ringing is best effort (the backend may be
    down, and catches up when it recovers)."""

    def __init__(self, name: str, *, timeout: float = 2.0):
        self.address = doorbell_address(name)
        self.timeout = timeout
        self._socket: socket.socket | None = None

    def ring(self, message: bytes) -> None:
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                # Blocks (briefly) while the backend's queue is full rather than drop.
                self._socket.settimeout(self.timeout)
            self._socket.sendto(message, self.address)
        except OSError:
            pass
