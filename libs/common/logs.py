"""Task logs on request: rest asks, the launcher (which owns the logs) answers.

Logs are a query, not an event, so this is NATS request/reply on one subject,
not a JetStream stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats.errors

from libs.common.errors import NotFound, Transient

# Outside the event stream (pai.v1.>): JetStream would store a request and
# answer it with a publish ack before the launcher could.
LOG_SUBJECT = "pai.rpc.v1.logs"
# The most log bytes one reply carries: their JSON (base64, 4/3 larger) stays well under
# nats-server's default max_payload of 1 MiB. A longer log is read in chunks of this
# size (`read_log_chunks`), each one request, and streamed to the HTTP client.
LOG_CHUNK_BYTES = 512 * 1024
MAX_REPLY_BYTES = LOG_CHUNK_BYTES


class LogRequest(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    attempt: int
    role: str
    index: int
    taskAttempt: int | None = None  # None: the latest
    tailBytes: int | None = None  # None: the whole log (capped at MAX_REPLY_BYTES)
    offset: int = 0  # skip this many bytes of the log (follow mode: what was already shown)
    # At most this many bytes from `offset` (capped at MAX_REPLY_BYTES). None: the end
    # of the log from `offset`, MAX_REPLY_BYTES at most (requests from before chunks).
    length: int | None = None


class LogReply(msgspec.Struct, frozen=True, kw_only=True):
    found: bool
    data: bytes = b""
    error: str = ""
    # The length of the log as read (after tailBytes, before offset and length): the
    # chunks of one read end there. -1 from a launcher that does not say.
    size: int = -1


async def request_log_chunk(bus, req: LogRequest, *, timeout: float = 10.0) -> LogReply:
    """One reply of the launcher: at most `req.length` (MAX_REPLY_BYTES) bytes from `req.offset`."""
    try:
        msg = await bus.nc.request(LOG_SUBJECT, msgspec.json.encode(req), timeout=timeout)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise Transient("the launcher did not answer the log request; is it running?") from exc
    except nats.errors.MaxPayloadError as exc:  # a request is small; said plainly should it ever not be
        raise Transient(f"the log request is larger than the bus allows: {exc}") from exc
    reply = msgspec.json.decode(msg.data, type=LogReply)
    if not reply.found:
        raise NotFound(reply.error or f"no log for {req.job} {req.role}[{req.index}] attempt {req.attempt}")
    return reply


async def read_log_chunks(bus, req: LogRequest, *, chunk: int = LOG_CHUNK_BYTES,
                          timeout: float = 10.0) -> AsyncIterator[bytes]:
    """The log from `req.offset` to its end as the launcher read it first, chunk by chunk,
    each one request/reply under NATS's message limit. The launcher keeps what it read for
    the next chunks (services/launcher/service.py), so the chunks are one snapshot of a
    growing log. The first chunk is asked for before anything is yielded: a log that
    does not exist raises NotFound before an HTTP answer has begun."""
    offset = req.offset
    while True:
        reply = await request_log_chunk(bus, msgspec.structs.replace(req, offset=offset, length=chunk), timeout=timeout)
        if reply.data:
            yield reply.data
        offset += len(reply.data)
        # The end of the log as read (a launcher that does not tell the size: a short chunk).
        if not reply.data or (offset >= reply.size if reply.size >= 0 else len(reply.data) < chunk):
            return
