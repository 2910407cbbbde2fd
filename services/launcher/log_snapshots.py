"""What the launcher read of a log, kept for a few seconds for the next chunks of the
same read (libs/common/logs.py: `read_log_chunks`).

A log longer than one NATS message is read in chunks, one request each. Reading the
whole log again for every chunk costs the log's size per chunk (a 64 MiB log in 128
chunks: 8 GiB read), and a log still growing would shift under the reader. So the
first chunk (offset 0, or any offset past what is kept) reads the log afresh and keeps
it; the next ones, whose offset falls inside what is kept, are cut from it. A
follower's poll (offset at the end of what is kept) reads afresh. Pure: the clock is
passed in.
"""

from __future__ import annotations

from libs.common.logs import MAX_REPLY_BYTES, LogRequest

KEEP_SECONDS = 10.0
KEPT_AT_MOST = 2  # snapshots; each as long as the log cap (task_log_cap_bytes) at most


def snapshot_key(req: LogRequest) -> tuple:
    return (req.job, req.attempt, req.role, req.index, req.taskAttempt, req.tailBytes)


class LogSnapshots:
    def __init__(self, keep_seconds: float = KEEP_SECONDS, most: int = KEPT_AT_MOST):
        self.keep_seconds, self.most = keep_seconds, most
        self._kept: dict[tuple, tuple[float, bytes]] = {}

    def usable(self, req: LogRequest, now: float) -> bytes | None:
        """The log as kept for a continuation chunk of `req`, None when it must be read afresh."""
        self._expire(now)
        if req.length is None or req.offset <= 0:
            return None
        kept = self._kept.get(snapshot_key(req))
        if kept is None or req.offset >= len(kept[1]):
            return None
        return kept[1]

    def keep(self, req: LogRequest, data: bytes, now: float) -> None:
        """Keep what was read for `req` when more than one chunk of it is left to send."""
        if req.length is None or len(data) - req.offset <= min(req.length, MAX_REPLY_BYTES):
            self._kept.pop(snapshot_key(req), None)
            return
        key = snapshot_key(req)
        self._kept.pop(key, None)
        self._kept[key] = (now, data)
        while len(self._kept) > self.most:
            del self._kept[next(iter(self._kept))]  # the oldest

    def _expire(self, now: float) -> None:
        for key in [k for k, (at, _) in self._kept.items() if now - at > self.keep_seconds]:
            del self._kept[key]


def chunk_of(data: bytes, req: LogRequest) -> bytes:
    """The part of the log `req` asks for: from its offset, `length` bytes at most (MAX_REPLY_BYTES);
    without a length (a request from before chunks), the end of it, as before."""
    rest = data[req.offset:] if req.offset else data
    if req.length is None:
        return rest[-MAX_REPLY_BYTES:]
    return rest[: max(0, min(req.length, MAX_REPLY_BYTES))]
