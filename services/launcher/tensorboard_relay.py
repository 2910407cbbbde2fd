"""The launcher's side of a job's TensorBoard (libs/common/tensorboard_relay.py).

rest asks on TENSORBOARD_SUBJECT; the launcher finds the role's first task of the job's
current attempt, running, and its `tensorboard` port and host address (as the scheduler
placed it), makes the HTTP request there, and answers. The launcher is where the
platform already reaches tasks (it starts and stops them); on Kubernetes it reaches a
node's host network the way it reaches the API. An answer longer than one message is
kept a few seconds under rest's `fetch` id for its later chunks (bounded in count and
bytes). Nothing here is stored: a launcher restarted mid-answer makes rest's next chunk
a 503, and the browser asks again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import OrderedDict

import aiohttp
import msgspec

from libs.common.ids import JobId
from libs.common.messages import TaskState
from libs.common.protocol.tensorboard import PORT_LABEL
from libs.common.tensorboard_relay import (
    CHUNK_BYTES,
    MAX_ANSWER_BYTES,
    METHODS,
    PASSED_HEADERS,
    TENSORBOARD_SUBJECT,
    RelayReply,
    RelayRequest,
    accepts,
)
from services.launcher.core.lifecycle import LauncherCore

log = logging.getLogger(__name__)

KEEP_SECONDS = 30.0
KEPT_AT_MOST = 8
# What TensorBoard may take to answer one request (a large event file's first load).
FETCH_SECONDS = 30.0


class Relay:
    def __init__(self, core: LauncherCore):
        self.core = core
        self._kept: OrderedDict[str, tuple[float, RelayReply, bytes]] = OrderedDict()
        self._http: aiohttp.ClientSession | None = None
        self.pending: set[asyncio.Task[None]] = set()

    def where(self, req: RelayRequest) -> tuple[str, int] | RelayReply:
        """(host, port) of the job's TensorBoard, or why there is none to reach."""
        record = self.core.job(JobId(req.job))
        if record is None or not record.attempts or record.state.is_final:
            return RelayReply(status=409, error=f"{req.job} is not running: its TensorBoard runs while it does")
        task = record.current.task(req.role, 0)
        if task is None or task.state != TaskState.RUNNING or not task.live:
            state = task.state.value if task is not None else "not started"
            return RelayReply(status=409, error=f"task {req.role}[0] of {req.job}, which runs TensorBoard, is {state}")
        ports = task.ports.get(PORT_LABEL)
        if not ports or not task.hostIp:
            return RelayReply(status=404, error=f"task {req.role}[0] of {req.job} has no tensorboard port")
        return task.hostIp, ports[0]

    async def answer(self, req: RelayRequest) -> RelayReply:
        now = time.monotonic()
        for fetch in [f for f, (at, _, _) in self._kept.items() if now - at > KEEP_SECONDS]:
            del self._kept[fetch]
        if req.offset > 0:
            kept = self._kept.get(req.fetch)
            if kept is None:
                return RelayReply(status=503, error="the rest of TensorBoard's answer is no longer kept; ask again")
            head, body = kept[1], kept[2]
            return msgspec.structs.replace(head, data=body[req.offset:req.offset + CHUNK_BYTES])
        if req.method not in METHODS or not req.path.startswith("/"):
            return RelayReply(status=400, error=f"not relayed: {req.method} {req.path[:100]}")
        found = self.where(req)
        if isinstance(found, RelayReply):
            return found
        host, port = found
        url = f"http://{host}:{port}{req.path}" + (f"?{req.query}" if req.query else "")
        headers = {"Content-Type": req.contentType} if req.contentType else {}
        # The client's own codings (aiohttp would ask for gzip whatever the client said).
        headers["Accept-Encoding"] = req.acceptEncoding or "identity"
        try:
            http = self._session()
            async with http.request(req.method, url, data=req.body or None, headers=headers,
                                    allow_redirects=False) as resp:
                passed = {h: resp.headers[h] for h in PASSED_HEADERS if h in resp.headers}
                if passed.get("Content-Encoding", "").strip().lower() == "identity":  # TensorBoard's page says so
                    del passed["Content-Encoding"]  # no coding, and HTTP has no header for it
                decoding = Decoding.of(passed.get("Content-Encoding", ""), req.acceptEncoding)
                if isinstance(decoding, str):
                    return RelayReply(status=502, error=decoding)
                parts, size = [], 0
                async for part in resp.content.iter_any():
                    part = decoding.decode(part, MAX_ANSWER_BYTES - size) if decoding else part
                    parts.append(part)
                    size += len(part)
                    if size > MAX_ANSWER_BYTES:
                        return RelayReply(status=502, error=f"TensorBoard's answer is over {MAX_ANSWER_BYTES} bytes")
                if decoding:
                    decoding.finish()
                    passed = decoding.headers(passed)
                body = b"".join(parts)
                head = RelayReply(status=resp.status, headers=passed, size=len(body))
        except zlib.error as exc:
            return RelayReply(status=502, error=f"TensorBoard's encoded answer could not be decoded: {exc}")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return RelayReply(status=502, error=(
                f"TensorBoard of {req.job} ({req.role}[0], port {port}) did not answer: {exc or type(exc).__name__}; "
                f"it may still be starting, or have failed: its task's log and {'.tensorboard.log'} in the task's "
                "working directory say"))
        if len(body) > CHUNK_BYTES:
            self._kept[req.fetch] = (now, head, body)
            while len(self._kept) > KEPT_AT_MOST:
                self._kept.popitem(last=False)
        return msgspec.structs.replace(head, data=body[:CHUNK_BYTES])

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # No proxy from the environment: the task's address is the node's own. Compressed
            # answers the client accepts stay so (a third of the bytes on the bus), their
            # Content-Encoding passed on; the others are decoded here (Decoding).
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_SECONDS),
                                               auto_decompress=False, trust_env=False)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


class Decoding:
    """An answer's gzip or deflate body decoded as it arrives, for a client that did not
    accept that coding. Its output is bounded as the answer's bytes are: each part
    inflates to at most the room left under MAX_ANSWER_BYTES (plus one byte, to see it
    overflow), so a small body that inflates hugely costs no more than the limit."""

    CODINGS = ("gzip", "x-gzip", "deflate")

    def __init__(self) -> None:
        # 32 + MAX_WBITS: a zlib or gzip header, told apart by zlib (HTTP's deflate is zlib's).
        self._zlib = zlib.decompressobj(32 + zlib.MAX_WBITS)
        self._fed = False

    @classmethod
    def of(cls, content_encoding: str, accept_encoding: str) -> Decoding | str | None:
        """None: passed on as it is; a Decoding; or why it cannot be relayed to this client."""
        codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if all(accepts(accept_encoding, c) for c in codings):
            return None
        if len(codings) == 1 and codings[0] in cls.CODINGS:
            return cls()
        return (f"TensorBoard answered with Content-Encoding {content_encoding!r}, which the client does not accept "
                f"(Accept-Encoding {accept_encoding or 'none'!r}) and the launcher cannot decode")

    def decode(self, data: bytes, room: int) -> bytes:
        self._fed = self._fed or bool(data)
        # At most one byte past the room (max_length 0 would mean no bound): over it, the
        # caller refuses the answer, and what the rest would inflate to is never made.
        return self._zlib.decompress(data, max(room, 0) + 1)

    def finish(self) -> None:
        if self._fed and not self._zlib.eof:
            raise zlib.error("it ends before its end")

    @staticmethod
    def headers(passed: dict[str, str]) -> dict[str, str]:
        """The decoded answer's headers: no Content-Encoding, and an ETag no longer the
        encoded bytes' own (weak: the same content, not the same bytes)."""
        headers = {h: v for h, v in passed.items() if h != "Content-Encoding"}
        if "ETag" in headers and not headers["ETag"].startswith("W/"):
            headers["ETag"] = "W/" + headers["ETag"]
        return headers


async def serve(bus, core: LauncherCore) -> Relay:
    """Answer rest's TensorBoard requests (queue group `launcher`, as the log requests)."""
    relay = Relay(core)

    async def on_request(msg) -> None:
        try:
            req = msgspec.json.decode(msg.data, type=RelayRequest)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            await msg.respond(msgspec.json.encode(RelayReply(status=400, error=f"bad TensorBoard request: {exc}")))
            return
        # Answered in a task of its own: a slow TensorBoard holds no other request.
        task = asyncio.get_running_loop().create_task(_respond(msg, relay, req))
        relay.pending.add(task)
        task.add_done_callback(relay.pending.discard)

    await bus.nc.subscribe(TENSORBOARD_SUBJECT, queue="launcher", cb=on_request)
    # The server has the subscription before the launcher says it is ready: a request
    # sent after that must not meet "no responders" (a race a loaded machine lost).
    await bus.round_trip()
    return relay


async def _respond(msg, relay: Relay, req: RelayRequest) -> None:
    try:
        reply = await relay.answer(req)
    except Exception as exc:  # noqa: BLE001 - any failure is this one answer's, said to rest
        log.exception("relaying TensorBoard of %s", req.job)
        reply = RelayReply(status=502, error=f"the launcher could not relay TensorBoard: {type(exc).__name__}")
    try:
        await msg.respond(msgspec.json.encode(reply))
    except Exception:  # noqa: BLE001 - rest gave up waiting; nothing to answer
        log.debug("TensorBoard answer for %s not delivered", req.job)
