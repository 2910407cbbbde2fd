"""A job's TensorBoard through rest: rest asks over the bus, the launcher fetches it.

rest never opens a connection to a node (docs/architecture.md: the services meet only on
NATS; on Kubernetes rest need not reach the nodes' host network at all). The launcher
owns the tasks and knows where each runs, so rest hands it the HTTP request
(`RelayRequest`) on request/reply, the launcher makes it to the task's TensorBoard
(its host address and `tensorboard` port) and answers with the status, the headers
that matter and the body. A body longer than one NATS message comes in chunks, each one
request, cut from what the launcher fetched once and keeps a few seconds under the
request's `fetch` id (services/launcher/tensorboard_relay.py), so the chunks are one
answer.

Content codings are negotiated as HTTP has them: rest passes on the client's
Accept-Encoding (`acceptEncoding`), the launcher asks TensorBoard with it (or for
`identity` when the client named none), and an answer encoded in a way the client did
not accept (a server that gzips regardless) is decoded before it is relayed, so a plain
client (urllib, curl without --compressed) gets the plain body and a browser still gets
TensorBoard's gzip as it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats.errors

from libs.common.errors import Transient

# Outside the event stream (pai.v1.>), as the log requests (libs/common/logs.py).
TENSORBOARD_SUBJECT = "pai.rpc.v1.tensorboard"
# The most body bytes one reply carries: JSON's base64 keeps it under NATS's 1 MiB.
CHUNK_BYTES = 512 * 1024
# A request body rest relays (TensorBoard's data API posts small forms).
MAX_REQUEST_BODY_BYTES = 256 * 1024
# An answer larger than this is refused (502): TensorBoard's page is a few MiB.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# The answer's headers passed on to the browser (the rest are hop-by-hop or rest's own).
PASSED_HEADERS = ("Content-Type", "Content-Encoding", "Cache-Control", "ETag", "Last-Modified", "Location",
                  "Content-Disposition")
METHODS = ("GET", "HEAD", "POST")


class RelayRequest(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    role: str  # the role whose first task runs TensorBoard (libs/common/protocol/tensorboard.py)
    fetch: str  # rest's id of this answer: its later chunks ask for it by it
    method: str = "GET"
    path: str = "/"  # under TensorBoard's root
    query: str = ""
    contentType: str = ""
    body: bytes = b""
    offset: int = 0  # > 0: a later chunk of the answer fetched under `fetch`
    acceptEncoding: str = ""  # the client's Accept-Encoding; "" when it sent none: the plain body alone


class RelayReply(msgspec.Struct, frozen=True, kw_only=True):
    status: int  # TensorBoard's; or PAI's own 404/409/502/504 with `error`
    headers: dict[str, str] = {}
    data: bytes = b""
    size: int = 0  # the whole body's length
    error: str = ""


def accepts(accept_encoding: str, coding: str) -> bool:
    """Whether a client's Accept-Encoding (RFC 9110 12.5.3) takes `coding` (e.g. "gzip").

    A coding it names with a weight above 0, or `*` above 0 when it does not name the
    coding itself; `x-gzip` is gzip. No header, or an empty one, takes none: a client
    that did not ask for an encoded body gets the plain one (as servers answer in practice).
    """
    coding = _ALIASES.get(coding.strip().lower(), coding.strip().lower())
    star: bool | None = None
    for item in accept_encoding.split(","):
        name, _, params = item.partition(";")
        name = name.strip().lower()
        name = _ALIASES.get(name, name)
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0  # a weight that is no number accepts nothing
        if name == coding:
            return weight > 0
        if name == "*":
            star = weight > 0
    return bool(star)


_ALIASES = {"x-gzip": "gzip"}


async def ask(bus, req: RelayRequest, *, timeout: float = 40.0) -> RelayReply:
    try:
        msg = await bus.nc.request(TENSORBOARD_SUBJECT, msgspec.json.encode(req), timeout=timeout)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise Transient("the launcher did not answer the TensorBoard request; is it running?") from exc
    return msgspec.json.decode(msg.data, type=RelayReply)


async def rest_of_body(bus, req: RelayRequest, first: RelayReply) -> AsyncIterator[bytes]:
    """The body's chunks after `first`, each asked for by its offset."""
    offset = len(first.data)
    while offset < first.size:
        reply = await ask(bus, msgspec.structs.replace(req, offset=offset, body=b""))
        if reply.status != first.status or not reply.data:
            raise Transient(reply.error or "the launcher no longer holds the rest of TensorBoard's answer")
        yield reply.data
        offset += len(reply.data)
