"""The fork server: forks the shims that run local tasks.

`python -m services.launcher.backends.local_forkserver DOORBELL [FEED_SECONDS]` runs as a
child of the local backend and reads task specs on stdin, one JSON per line.
It forks a shim for the specs waiting, and keeps sending it the specs that come
next, through the shim's feed (a pipe), for FEED_SECONDS (default
SHIM_FEED_SECONDS; 0: no feed, a shim per batch) or until it took
MAX_TASKS_PER_SHIM; then it closes the feed (the shim ends once its tasks
have) and the next spec gets a new shim. A forked Python process copies every
page it touches: a shim's fork, start and exit cost several milliseconds, a few
times what a trivial task costs, so a shim per task would cost more than the
tasks; a crash of a shim costs the tasks it holds, at most MAX_TASKS_PER_SHIM.
Forking a warm interpreter is still far cheaper than starting one per task.

It holds no state: when the launcher dies it reads EOF and exits (closing the
feed of the shim it was feeding), and the shims carry on, each in its own
session. A new one is simply sent what nobody claimed.
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
MAX_TASKS_PER_SHIM = MAX_BATCH
# How long a shim is sent new tasks after it was forked.
SHIM_FEED_SECONDS = 2.0
# When shims were forked moments ago, specs keep coming: wait this long for
# more before forking, so a burst shares shims. A lone task waits for nothing,
# nor does one a fed shim takes.
BUSY_WITHIN_SECONDS = 0.05
GATHER_SECONDS = 0.005


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def run_shim(specs: list[bytes], doorbell_name: str, feed: int | None = None) -> None:
    """Body of a forked shim; never returns.

    Each item is a task line: a spec, and for a task with secrets its
    filled-in commands after local_layout.SECRET_SEPARATOR, read from the
    launcher's pipe, so secrets pass through memory only. `feed`: the read end
    of the pipe that brings more, until EOF."""
    try:
        os.setsid()  # out of the launcher's session: its ^C or hangup is not ours
        os.umask(0o077)  # what a shim writes (specs, logs, exits) is the platform's alone
        _detach_stdio()
        shim = Shim(Doorbell(doorbell_name), feed)
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
    sample = ShimSpec(taskPath="/", slug="", commands=[], env={}, cpu=0, memoryMB=0)
    decoder(ShimSpec).decode(with_claim(encode(sample), ShimRecord(shimPid=0, shimStartTicks=0)))


def serve(doorbell_name: str, feed_seconds: float = SHIM_FEED_SECONDS) -> None:
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
    fed: FedShim | None = None
    while True:
        now = time.monotonic()
        if fed is not None and now >= fed.closes_at:
            fed.close()
            fed = None
        batch = specs.next_batch(
            busy=fed is None and now - last_fork < BUSY_WITHIN_SECONDS,
            timeout=None if fed is None else fed.closes_at - now,
        )
        if not batch:
            if specs.ended:
                break
            continue  # the fed shim's time is up
        if fed is not None:
            batch = fed.send(batch)
            if batch or fed.taken >= MAX_TASKS_PER_SHIM:
                fed.close()
                fed = None
        if batch:
            # (the previous feed is closed: the new shim must not hold its write end)
            fed = fork_shim(batch, doorbell_name, feed_seconds)
            last_fork = time.monotonic()
    if fed is not None:
        fed.close()


def fork_shim(batch: list[bytes], doorbell_name: str, feed_seconds: float) -> FedShim | None:
    """A shim for `batch`, and its feed while it may take more (None: it may not)."""
    if feed_seconds <= 0:
        if os.fork() == 0:
            run_shim(batch, doorbell_name)
        return None
    feed_r, feed_w = os.pipe()
    if os.fork() == 0:
        os.close(feed_w)
        run_shim(batch, doorbell_name, feed_r)
    os.close(feed_r)
    return FedShim(feed_w, taken=len(batch), seconds=feed_seconds)


class FedShim:
    """The write end of a shim's feed, while it takes more tasks."""

    def __init__(self, fd: int, *, taken: int, seconds: float):
        self.fd = fd
        os.set_blocking(fd, False)  # a shim that does not read must not stall us
        self.taken = taken
        self.closes_at = time.monotonic() + seconds

    def send(self, lines: list[bytes]) -> list[bytes]:
        """Send what the shim may still take; returns the lines it did not get
        whole (a line cut short is dropped by the shim)."""
        room = max(0, MAX_TASKS_PER_SHIM - self.taken)
        offered, rest = lines[:room], lines[room:]
        data = b"".join(line + b"\n" for line in offered)
        try:
            written = os.write(self.fd, data) if data else 0
        except (BlockingIOError, BrokenPipeError):  # full, or the shim is gone
            written = 0
        sent = 0
        for line in offered:
            written -= len(line) + 1
            if written < 0:
                break
            sent += 1
        self.taken += sent
        return offered[sent:] + rest

    def close(self) -> None:
        os.close(self.fd)


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

    def next_batch(self, *, busy: bool, timeout: float | None = None) -> list[bytes]:
        """The specs waiting now, at most MAX_BATCH; empty at EOF (then `ended`)
        or when none came within `timeout` (None: wait as long as it takes).
        When `busy` (tasks keep coming), first gather for GATHER_SECONDS: a shim
        per task would cost more than the wait."""
        if not self.lines and not self._read(timeout):
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
    serve(sys.argv[1], *(float(arg) for arg in sys.argv[2:3]))
