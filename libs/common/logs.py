"""Task logs on request: rest asks, the launcher (which owns the logs) answers.

Logs are a query, not an event, so this is NATS request/reply on one subject,
not a JetStream stream.
"""

from __future__ import annotations

import msgspec
import nats.errors

from libs.common.errors import NotFound, Transient

# Outside the event stream (pai.v1.>): JetStream would store a request and
# answer it with a publish ack before the launcher could.
LOG_SUBJECT = "pai.rpc.v1.logs"
MAX_REPLY_BYTES = 4 * 1024 * 1024  # JSON (base64) of this stays below NATS' default 8 MiB payload limit


class LogRequest(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    attempt: int
    role: str
    index: int
    taskAttempt: int | None = None  # None: the latest
    tailBytes: int | None = None  # None: the whole log (capped at MAX_REPLY_BYTES)
    offset: int = 0  # skip this many bytes of the log (follow mode: what was already shown)


class LogReply(msgspec.Struct, frozen=True, kw_only=True):
    found: bool
    data: bytes = b""
    error: str = ""


async def request_log(bus, req: LogRequest, *, timeout: float = 10.0) -> bytes:
    try:
        msg = await bus.nc.request(LOG_SUBJECT, msgspec.json.encode(req), timeout=timeout)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise Transient("the launcher did not answer the log request; is it running?") from exc
    reply = msgspec.json.decode(msg.data, type=LogReply)
    if not reply.found:
        raise NotFound(reply.error or f"no log for {req.job} {req.role}[{req.index}] attempt {req.attempt}")
    return reply.data
