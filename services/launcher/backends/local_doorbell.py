"""How shims tell the local backend that a task runs or ended, without waiting.

One abstract unix datagram socket per data dir, bound by the backend; each
message is one datagram: `R<slug>\\n<detail>` (the task runs) or
`F<slug>\\n<exit record>` (its exit is recorded in its spec.json, and that is
the record; one longer than MAX_TOLD_RECORD_BYTES is left out: `F<slug>`). A
lost datagram only delays the news: the backend also sweeps the task directories,
and reads them all when it recovers.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

RUNNING_BELL = b"R"
FINISHED_BELL = b"F"
# Well under a unix datagram's limit (the socket's send buffer, 200 KiB here);
# an exit record is a few hundred bytes.
MAX_TOLD_RECORD_BYTES = 16 * 1024


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
    """A shim's side of the doorbell; ringing is best effort (the backend may be
    down, and catches up when it recovers)."""

    def __init__(self, name: str, *, timeout: float = 0.5):
        self.address = doorbell_address(name)
        self.timeout = timeout
        self._socket: socket.socket | None = None

    def ring(self, message: bytes) -> None:
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
            self._socket.sendto(message, self.address)
        except OSError:
            pass
