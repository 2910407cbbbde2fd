"""The fork server: forks the shims that run local tasks.

`python -m services.launcher.backends.local_forkserver DOORBELL` runs as a
child of the local backend and reads task specs on stdin, one JSON per line.
For all the specs waiting at once (up to MAX_BATCH) it forks one shim: a single
task when load is light, so a crash costs one task; a shared shim under load,
because a forked Python process copies every page it touches, which costs
milliseconds per shim, more than running the task itself. Forking a warm
interpreter is still far cheaper than starting one per task.

It holds no state: when the launcher dies it reads EOF and exits, and the shims
carry on, each in its own session. A new one is simply sent what nobody claimed.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import sys
import time
import traceback

from services.launcher.backends.local_doorbell import Doorbell
from services.launcher.backends.local_layout import (
    ExitRecord,
    KillRequest,
    ShimRecord,
    ShimSpec,
    decoder,
    encode,
    with_claim,
)
from services.launcher.backends.local_shim import Shim

MAX_BATCH = 64
# When shims were forked moments ago, specs keep coming: wait this long for
# more before forking, so a burst shares shims. A lone task waits for nothing.
BUSY_WITHIN_SECONDS = 0.05
GATHER_SECONDS = 0.005


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def run_shim(specs: list[bytes], doorbell_name: str) -> None:
    """Body of a forked shim; never returns.

    Each item is a task line: a spec, and for a task with secrets its
    filled-in commands after local_layout.SECRET_SEPARATOR, read from the
    launcher's pipe, so secrets pass through memory only."""
    try:
        os.setsid()  # out of the launcher's session: its ^C or hangup is not ours
        os.umask(0o077)  # what a shim writes (specs, logs, exits) is the platform's alone
        _detach_stdio()
        shim = Shim(Doorbell(doorbell_name))
        for spec_json in specs:
            try:
                shim.take(spec_json)
            except Exception:  # noqa: BLE001 - a bad spec must not cost the others
                traceback.print_exc()
        shim.serve()
    finally:
        os._exit(0)


def _warm_up() -> None:
    """Build, before forking, what every shim needs (decoders, type info), so
    shims share it instead of each building (and copying) it."""
    for record_type in (ShimSpec, KillRequest, ShimRecord, ExitRecord):
        decoder(record_type)
    encode(ExitRecord(exitCode=0))
    sample = ShimSpec(taskDir="/", slug="", commands=[], env={}, cpu=0, memoryMB=0)
    decoder(ShimSpec).decode(with_claim(encode(sample), ShimRecord(shimPid=0, shimStartTicks=0)))


def serve(doorbell_name: str) -> None:
    """The fork server: task specs, one JSON per line on stdin, until EOF."""
    # Shims are reaped as they end (not ignored: reaping adds their CPU time to
    # ours, and so to the launcher's children's, where it can be measured).
    signal.signal(signal.SIGCHLD, _reap_shims)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when we stop
    _warm_up()
    # A forked shim shares our memory until it writes to a page; a garbage
    # collection would write to every object's header and copy them all.
    gc.disable()
    gc.freeze()
    specs = SpecReader(0)
    last_fork = float("-inf")
    while batch := specs.next_batch(busy=time.monotonic() - last_fork < BUSY_WITHIN_SECONDS):
        last_fork = time.monotonic()
        if os.fork() == 0:
            run_shim(batch, doorbell_name)


def _reap_shims(_signum: int, _frame: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


class SpecReader:
    """Task specs from a pipe, in batches of what is waiting."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lines: list[bytes] = []
        self.pending = b""
        self.ended = False

    def next_batch(self, *, busy: bool) -> list[bytes]:
        """The specs waiting now, at most MAX_BATCH; empty at EOF. When `busy`
        (tasks keep coming), first gather for GATHER_SECONDS: a shim per task
        would cost more than the wait."""
        if not self.lines and not self._read(None):
            return []
        if busy:
            deadline = time.monotonic() + GATHER_SECONDS
            while len(self.lines) < MAX_BATCH and (left := deadline - time.monotonic()) > 0:
                if not self._read(left):
                    break
        batch, self.lines = self.lines[:MAX_BATCH], self.lines[MAX_BATCH:]
        return batch

    def _read(self, timeout: float | None) -> bool:
        """Read what is there (waiting up to `timeout`); False at EOF or timeout."""
        if self.ended:
            return False
        if timeout is not None and not select.select([self.fd], [], [], timeout)[0]:
            return False
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            self.ended = True
            return False
        *complete, self.pending = (self.pending + chunk).split(b"\n")
        self.lines.extend(line for line in complete if line)
        return True


if __name__ == "__main__":
    serve(sys.argv[1])
