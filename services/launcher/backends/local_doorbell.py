"""How shims tell the local backend that a task runs or ended, without waiting.

One abstract unix datagram socket per data dir, bound by the backend. A
message is `R<slug>\\n<detail>` (the task runs) or `F<slug>\\n<exit record>`
(its exit is recorded in its spec.json, and that is the record; one longer than
MAX_TOLD_RECORD_BYTES is left out: `F<slug>`). A lost datagram only delays the
news: the backend also sweeps the task directories, and reads them all when it
recovers.

A shim sends what it rang together: one datagram holds every message since its
last `flush`, separated by NUL (BELL_SEPARATOR: no slug and no JSON record holds
one). The shim flushes each time round its loop, before it waits; a message
waits at most BELL_GATHER_SECONDS however long a turn takes (a shim fed many
tasks at once starts them all in one turn). Each datagram wakes the backend's
event loop, and a turn of that loop cost more than the messages it read; and the
backend's receive queue (net.unix.max_dgram_qlen, often 10) counts datagrams,
not messages: a shim blocks while it is full.

Who rang: an abstract name is reachable by every process of the machine, tasks
included (they can read it in /proc/net/unix). So the backend turns on
SO_PASSCRED, and the kernel attaches to each datagram its sender's credentials
(SCM_CREDENTIALS: the sender's pid, real uid and gid; a sender may claim other
ones only with CAP_SYS_ADMIN/CAP_SETUID over the receiver's user namespace, and
a task in a user namespace of its own can only name the uid it is mapped from).
Shims run as the launcher's own user (root when tasks change user), tasks as
job uids: a datagram whose sender uid is not the launcher's is dropped
(`sender_uid`, local.py's `_on_bell`). One that passes came from a process of
the platform's user, which could as well write the task's record; so its
payload is worth what the record is worth (the shim sends the very bytes it
appended there), and the backend takes the exit from it without reading the
file. When tasks run as the platform's own user (it is not root, or
`task_user` is unset), the check cannot tell a shim from a task: the backend
says so when it starts (README, security).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

RUNNING_BELL = b"R"
FINISHED_BELL = b"F"
BELL_SEPARATOR = b"\0"
# Well under a unix datagram's limit (the socket's send buffer, 200 KiB here);
# an exit record is a few hundred bytes.
MAX_TOLD_RECORD_BYTES = 16 * 1024
# A datagram of gathered messages is sent before it would pass this (the backend
# reads up to 64 KiB at a time).
BELL_DATAGRAM_BYTES = 48 * 1024
# The longest a rung message waits for the shim's loop to flush it: a task's start
# is told this much later at most (a shim handed 64 tasks at once takes some 30 ms
# to start them all).
BELL_GATHER_SECONDS = 0.005


# struct ucred: pid_t pid, uid_t uid, gid_t gid.
_UCRED = struct.Struct("iII")
CREDENTIALS_SPACE = socket.CMSG_SPACE(_UCRED.size)


def listen_with_credentials(bell: socket.socket) -> None:
    """Have the kernel attach its sender's credentials to every datagram `bell` receives."""
    bell.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def sender_of(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
    """(pid, uid) of a datagram's sender from its `recvmsg` ancillary data; None if none came."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            pid, uid, _gid = _UCRED.unpack_from(data)
            return pid, uid
    return None


def doorbell_name(data_dir: Path) -> str:
    """Name of the abstract unix socket on which the backend hears from its shims.

    Abstract names have no file to go stale and no 108-byte path limit; one per
    data dir, so binding it also proves no other launcher uses that dir.
    """
    # Imported here: shims import this module, and hashlib maps OpenSSL into
    # every forked shim (local_layout's docstring).
    import hashlib

    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:24]
    return f"pai-local-{digest}"


def doorbell_address(name: str) -> str:
    return "\0" + name  # a leading NUL puts the name in the abstract namespace


class Doorbell:
    """A shim's side of the doorbell: `ring` gathers, `flush` sends (see the top).
    Sending is best effort (the backend may be down, and catches up when it recovers)."""

    def __init__(self, name: str, *, timeout: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self.address = doorbell_address(name)
        self.timeout = timeout
        self._clock = clock
        self._socket: socket.socket | None = None
        self._gathered: list[bytes] = []
        self._gathered_bytes = 0
        self._first_rung_at = 0.0

    def ring(self, message: bytes) -> None:
        """Gather `message`; sent by the next `flush`, or now if the oldest gathered
        one has waited BELL_GATHER_SECONDS."""
        if self._gathered_bytes + len(message) + len(BELL_SEPARATOR) > BELL_DATAGRAM_BYTES:
            self.flush()
        if not self._gathered:
            self._first_rung_at = self._clock()
        self._gathered.append(message)
        self._gathered_bytes += len(message) + len(BELL_SEPARATOR)
        if self._clock() - self._first_rung_at >= BELL_GATHER_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Send what was rung since the last flush, as one datagram."""
        if not self._gathered:
            return
        datagram = BELL_SEPARATOR.join(self._gathered)
        self._gathered, self._gathered_bytes = [], 0
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                # While the backend's queue is full, sleep in the kernel (up to the
                # timeout) rather than drop the news. Not `settimeout`: Python then
                # polls, and poll() calls an unconnected datagram socket writable
                # even when the peer's queue is full, so it would spin.
                seconds = int(self.timeout)
                micros = int((self.timeout - seconds) * 1e6)
                self._socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros)
                )
            self._socket.sendto(datagram, self.address)
        except OSError:
            pass
