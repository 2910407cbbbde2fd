"""GET /api/v2/jobs/{job}/terminal?taskRole=&taskIndex=: a shell in a running task, over
a WebSocket (the portal's job page draws it with xterm.js).

rest never reaches a node: it authorises the caller (the job's owner or an admin: 403
otherwise; 409 when the task does not run), subscribes to the session's output subject,
asks the launcher over NATS to open the session (libs/common/subjects.py, TERMINAL_*;
services/launcher/terminals.py), and then relays: binary WebSocket frames are the
terminal's bytes both ways; a text frame from the browser is JSON control,
`{"resize": {"cols": C, "rows": R}}`; the server's last text frame before it closes is
`{"closed": "<why>"}`. Each side pings the other over the bus every
TERMINAL_PING_SECONDS, and a side silent for TERMINAL_LINK_SECONDS is taken for gone.

A browser cannot set an Authorization header on a WebSocket, and a token in the URL
would land in logs and history: the portal sends it as a subprotocol,
`base64url.bearer.pai.<token, base64url without padding>` beside `pai.terminal.v1`, as
Kubernetes' API server takes one (services/rest/auth.py); the server answers with
`pai.terminal.v1` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time

import msgspec
import nats.errors
from aiohttp import WSMsgType, web

from libs.common.errors import BadInput, Conflict, NotFound, Transient
from libs.common.messages import JobState, TaskState, TerminalInput, TerminalOpen, TerminalOpenReply, TerminalOutput
from libs.common.subjects import (
    TERMINAL_LINK_SECONDS,
    TERMINAL_OPEN_SUBJECT,
    TERMINAL_PING_SECONDS,
    terminal_input_subject,
    terminal_output_subject,
)
from services.rest import jobs_api
from services.rest.request import USER, ctx_of

PROTOCOL = "pai.terminal.v1"
# A typed line or a paste is small; a frame past this is cut off with a close (1009).
MAX_INPUT_FRAME = 64 * 1024
OPEN_TIMEOUT_SECONDS = 20.0
NO_LAUNCHER_RETRY_SECONDS = (0.1, 0.3, 1.0)
_encode = msgspec.json.Encoder().encode
_output_decoder = msgspec.json.Decoder(TerminalOutput)
_reply_decoder = msgspec.json.Decoder(TerminalOpenReply)


def _int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{name} must be an integer, not {raw[:40]!r}") from None
    if not low <= value <= high:
        raise BadInput(f"{name} must be between {low} and {high}, not {value}")
    return value


async def open_terminal(request: web.Request) -> web.WebSocketResponse:
    ctx = ctx_of(request)
    jid = jobs_api.job_param(request)
    sub, rec, _ = await jobs_api.read_job(request, jid)
    jobs_api.require_owner_or_admin(request, sub, "open a terminal in")
    roles = [r.name for r in sub.spec.taskRoles]
    role = request.query.get("taskRole") or roles[0]
    if role not in roles:
        raise NotFound(f"{jid} has no task role {role[:100]!r}; its roles: {', '.join(roles)}")
    index = _int_query(request, "taskIndex", 0, 0, 1_000_000)
    cols = _int_query(request, "cols", 80, 1, 1000)
    rows = _int_query(request, "rows", 24, 1, 1000)
    task = rec.current.task(role, index) if rec is not None and rec.attempts else None
    if rec is None or rec.state != JobState.RUNNING or task is None or task.state != TaskState.RUNNING:
        state = task.state.value if task is not None else (rec.state.value if rec is not None else "WAITING")
        raise Conflict(f"task {role}[{index}] of {jid} is {state}, not running: a terminal opens only in a running task")
    if not request.headers.get("Upgrade", "").lower() == "websocket":
        raise BadInput("this route is a WebSocket: connect with 'Upgrade: websocket' (the portal's job page does)")

    session = secrets.token_urlsafe(24)
    nc = ctx.bus.nc
    output = await nc.subscribe(terminal_output_subject(session))
    opened = False
    try:
        ask = TerminalOpen(session=session, job=sub.job, role=role, index=index, by=request[USER].username,
                           cols=cols, rows=rows)
        msg = await _ask_launcher(nc, _encode(ask))
        reply = _reply_decoder.decode(msg.data)
        if not reply.ok:
            raise {404: NotFound, 409: Conflict, 400: BadInput}.get(reply.status, Transient)(reply.error)
        opened = True
        ws = web.WebSocketResponse(protocols=(PROTOCOL,), max_msg_size=MAX_INPUT_FRAME)
        await ws.prepare(request)
        await _relay(ws, nc, output, session)
        return ws
    finally:
        if opened:  # the launcher ends its side at once (else after TERMINAL_LINK_SECONDS)
            with contextlib.suppress(Exception):
                await nc.publish(terminal_input_subject(session), _encode(TerminalInput(close=True)))
        with contextlib.suppress(Exception):
            await output.unsubscribe()


async def _ask_launcher(nc, request: bytes):
    """The launcher's answer to an open; asked again a few times while no launcher listens
    (a standby taking over, or a subscription the server has not yet)."""
    for wait in (*NO_LAUNCHER_RETRY_SECONDS, None):
        try:
            return await nc.request(TERMINAL_OPEN_SUBJECT, request, timeout=OPEN_TIMEOUT_SECONDS)
        except nats.errors.NoRespondersError as exc:
            if wait is None:
                raise Transient("no launcher answers terminal requests; is it running?") from exc
            await asyncio.sleep(wait)
        except nats.errors.TimeoutError as exc:
            raise Transient("the launcher did not answer the terminal request in time") from exc
    raise AssertionError("unreachable")


async def _relay(ws: web.WebSocketResponse, nc, output, session: str) -> None:
    input_subject = terminal_input_subject(session)
    heard = [time.monotonic()]
    why = ["closed by the browser"]

    async def from_launcher() -> None:
        async for msg in output.messages:
            heard[0] = time.monotonic()
            try:
                got = _output_decoder.decode(msg.data)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # only the launcher may publish here (the bus's permissions)
            if got.data:
                await ws.send_bytes(got.data)
            if got.closed:
                why[0] = got.reason or "closed"
                return

    async def from_browser() -> None:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                await nc.publish(input_subject, _encode(TerminalInput(data=msg.data)))
            elif msg.type == WSMsgType.TEXT:
                size = _resize_of(msg.data)
                if size is not None:
                    await nc.publish(input_subject, _encode(TerminalInput(cols=size[0], rows=size[1])))
            elif msg.type == WSMsgType.ERROR:
                why[0] = f"the WebSocket failed: {ws.exception()}"
                return

    async def keep_alive() -> None:
        while True:
            await asyncio.sleep(TERMINAL_PING_SECONDS)
            if time.monotonic() - heard[0] > TERMINAL_LINK_SECONDS:
                why[0] = "the launcher stopped answering"
                return
            await nc.publish(input_subject, _encode(TerminalInput()))

    tasks = [asyncio.ensure_future(c) for c in (from_launcher(), from_browser(), keep_alive())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not ws.closed:
        with contextlib.suppress(Exception):
            await ws.send_str(json.dumps({"closed": why[0]}))
            await ws.close(code=1000, message=why[0].encode()[:120])


def _resize_of(text: str) -> tuple[int, int] | None:
    try:
        doc = json.loads(text)
        size = doc["resize"]
        cols, rows = int(size["cols"]), int(size["rows"])
    except (ValueError, TypeError, KeyError):
        return None
    if 1 <= cols <= 1000 and 1 <= rows <= 1000:
        return cols, rows
    return None
