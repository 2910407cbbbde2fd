"""The bus's link to one NATS connection: how it subscribes, sends requests and
settles JetStream deliveries, through nats-py's public client API alone.

Every layer above (publish, consume, kv) speaks to the connection only through
a `Link`: this one (`bus_client: plain`), or `wire.FastLink` (`bus_client: fast`,
the default), which does the same over nats-py's internals, with less work per
message. A message of a direct subscription goes to a plain function as bytes
(`DirectHandler`), whichever link made it; the bus makes of them what it needs
(`Received`: headers parsed only when read).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import nats
import nats.errors
import nats.js
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

log = logging.getLogger("pai.bus")

# Which client the bus runs (the config's `bus_client`): `fast`, the bus's own
# receive and send paths over nats-py's internals (bus/wire.py), or `plain`,
# nats-py's public API only (a nats-py past the pinned one, or to rule the
# fast path out when hunting a fault).
BusClient = Literal["fast", "plain"]
BUS_CLIENTS: tuple[BusClient, ...] = ("fast", "plain")

# A message for a direct subscription: (subject, reply, payload, raw headers or None).
DirectHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]
# A request sent by `Link.send`: subject, reply subject, headers, payload.
Request = tuple[str, str, "dict[str, str] | None", bytes]

_CRLF = b"\r\n"
# The first line of a headers block: "NATS/1.0" alone, or with an inline status
# ("NATS/1.0 404 No Messages"), what JetStream answers a pull request with.
_HEADERS_LINE = b"NATS/1.0"
_STATUS_AT = len(_HEADERS_LINE) + 1
_STATUS, _DESCRIPTION = "Status", "Description"  # nats-py's names for the inline status


class Unsubscribable(Protocol):
    async def unsubscribe(self) -> None: ...


class Link:
    """The plain link: nats-py's `subscribe` (with a callback), `publish` and `flush`."""

    fast = False

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc

    async def start(self) -> None:
        """Once connected, before the bus is used (the fast link takes over nats-py's request answers)."""

    def jetstream(self, answers: Any) -> nats.js.JetStreamContext:
        """The JetStream context the bus uses (`answers`: the bus's reply subscription, `StoreAcks`)."""
        return nats.js.JetStreamContext(self.nc)

    async def subscribe(self, subject: str, handler: DirectHandler) -> Unsubscribable:
        """Subscribe to `subject`, a subject of this connection's own (an inbox):
        nothing can come for it before a request sent after this returns."""

        async def each(msg: Msg) -> None:
            try:
                handler(msg.subject.encode(), msg.reply.encode(), msg.data, headers_block(msg.headers))
            except Exception:  # the subscription must go on
                log.exception("handling a message on %s failed", msg.subject)

        sub: Subscription = await self.nc.subscribe(subject, cb=each)
        return sub

    async def send(self, requests: Sequence[Request]) -> list[BaseException | None]:
        """Send every request, in order, without waiting for answers; per request,
        None once it left (or is kept for the connection that comes back), or the
        nats-py error that kept it from leaving (too large, a closed connection)."""
        refused: list[BaseException | None] = []
        for subject, reply, headers, data in requests:
            try:
                await self.nc.publish(subject, data, reply=reply, headers=headers)
            except nats.errors.Error as exc:
                refused.append(exc)
            else:
                refused.append(None)
        return refused

    async def settle(self, replies: Sequence[str], payload: bytes) -> None:
        """Answer JetStream deliveries by their reply subjects (an ack: nothing,
        `+WPI`, `+TERM`, `-NAK ...`); raises what nats-py's publish raises."""
        for reply in replies:
            await self.nc.publish(reply, payload)

    async def round_trip(self, timeout: float = 10.0) -> None:
        """Return once the server has read every command sent before the call.

        nats-py's `flush()` alone does not promise that: its PING is written ahead
        of what still waits in the pending buffer (bus/wire.py's `round_trip`).
        But it kicks the flusher task, which writes that buffer before the PONG
        can be read; so a second flush's PING follows everything sent before
        the call. (Not a message to ourselves: a service may not publish to its
        own inbox.)"""
        await self.nc.flush(timeout=max(1, int(timeout)))
        await self.nc.flush(timeout=max(1, int(timeout)))

    def apply_on_arrival(self, push_subscription: Any, apply: Callable[[Any], None]) -> Unsubscribable:
        """Apply the messages of `push_subscription` (nats-py's JetStream push
        subscription, made without a callback) in order as they come; `apply` must
        not block; what it raises is logged. Here a task reading nats-py's queue."""
        return _Applier(push_subscription, apply)


class _Applier:
    """A task applying a push subscription's messages (the plain `apply_on_arrival`)."""

    def __init__(self, sub: Subscription, apply: Callable[[Any], None]) -> None:
        self._task = asyncio.ensure_future(self._run(sub, apply))

    @staticmethod
    async def _run(sub: Subscription, apply: Callable[[Any], None]) -> None:
        while True:
            try:
                msg = await sub.next_msg(timeout=3600)
            except nats.errors.TimeoutError:
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
                return
            try:
                apply(msg)
            except Exception:
                log.exception("applying %s failed", msg.subject)

    async def unsubscribe(self) -> None:
        self._task.cancel()


# The link of each connection the bus made (`Bus.connect`); another connection gets a plain one.
_links: weakref.WeakKeyDictionary[Any, Link] = weakref.WeakKeyDictionary()


def register(link: Link) -> Link:
    _links[link.nc] = link
    return link


def link_of(nc: Any) -> Link:
    link = _links.get(nc)
    if link is None:
        link = register(Link(nc))
    return link


class DirectSubscription:
    """A subscription whose messages go to a plain function (`DirectHandler`), by
    the connection's link. Made through nats-py, so that a reconnect subscribes it again."""

    def __init__(self, sub: Unsubscribable) -> None:
        self._sub = sub

    @classmethod
    async def open(cls, nc: Any, subject: str, handler: DirectHandler) -> DirectSubscription:
        return cls(await link_of(nc).subscribe(subject, handler))

    async def unsubscribe(self) -> None:
        await self._sub.unsubscribe()


class Inbox:
    """The messages of a direct subscription, kept for a reader that takes them
    when it is ready (`get`), in arrival order."""

    __slots__ = ("_loop", "_waiter", "items")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._loop = loop

    def put(self, item: object) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        while not self.items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.items.popleft()


def status_of(payload: bytes, headers: bytes | None) -> int | None:
    """The inline status of a message without a payload (`NATS/1.0 404 No
    Messages`: what JetStream answers a pull request with when it ends), else None."""
    if payload or not headers or not headers.startswith(_HEADERS_LINE) or headers[_STATUS_AT - 1:_STATUS_AT] != b" ":
        return None
    code = headers[_STATUS_AT:_STATUS_AT + 3]
    return int(code) if code.isdigit() else None


def parse_headers(raw: bytes | None) -> dict[str, str] | None:
    """A headers block as nats-py reads it (`Client._process_headers`): the inline
    status as `Status` and `Description`, then `Name: Value` per line."""
    if not raw:
        return None
    first, _, rest = raw.partition(_CRLF)
    headers: dict[str, str] = {}
    if first[len(_HEADERS_LINE):len(_HEADERS_LINE) + 1] == b" ":
        status, _, description = first[_STATUS_AT:].partition(b" ")
        status = status.strip()
        if status.isdigit():
            headers[_STATUS] = status.decode()
        if description.strip():
            headers[_DESCRIPTION] = description.decode()
    for line in rest.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if not key or len(key.split()) != 1:  # whitespace inside a name: not a header
            continue
        headers[key] = value.strip().decode("utf-8", "replace")
    return headers or None


def headers_block(headers: dict[str, str] | None) -> bytes | None:
    """The headers block of a message nats-py parsed (`parse_headers` read back):
    its inline status on the first line, then `Name: Value` per line."""
    if not headers:
        return None
    fields = dict(headers)
    status, description = fields.pop(_STATUS, ""), fields.pop(_DESCRIPTION, "")
    first = "NATS/1.0" + (f" {status}" if status else "") + (f" {description}" if description else "")
    return ("\r\n".join([first, *(f"{name}: {value}" for name, value in fields.items())]) + "\r\n\r\n").encode()


class Received:
    """A message the bus takes itself from a direct subscription: what nats-py's
    `Msg` offers the bus (subject, reply, data, headers; a JetStream delivery's
    ack, nak, term, in_progress), at the cost of one small object. Subject and
    headers are decoded only when read."""

    __slots__ = ("_ackd", "_headers", "_link", "_raw_headers", "_subject", "data", "reply")

    def __init__(self, link: Link, subject: bytes, reply: str, data: bytes, raw_headers: bytes | None) -> None:
        self._link = link
        self._subject = subject
        self.reply = reply
        self.data = data
        self._raw_headers = raw_headers
        self._headers: dict[str, str] | None | bool = False
        self._ackd = False

    @property
    def subject(self) -> str:
        return self._subject.decode()

    @property
    def headers(self) -> dict[str, str] | None:
        if self._headers is False:
            self._headers = parse_headers(self._raw_headers)
        return self._headers if isinstance(self._headers, dict) else None

    def _check_reply(self) -> None:
        if not self.reply:
            raise nats.errors.NotJSMessageError
        if self._ackd:
            raise nats.errors.MsgAlreadyAckdError(self)

    async def ack(self) -> None:
        await self._settle(b"")

    async def nak(self, delay: float | None = None) -> None:
        payload = b"-NAK"
        if delay:
            payload += b" " + json.dumps({"delay": int(delay * 10**9)}).encode()
        await self._settle(payload)

    async def term(self) -> None:
        await self._settle(TERM)

    async def _settle(self, payload: bytes) -> None:
        """Answer the delivery once and for all (ack, nak or term: `payload`)."""
        self._check_reply()
        await self._link.settle([self.reply], payload)
        self._ackd = True

    async def in_progress(self) -> None:
        if not self.reply:
            raise nats.errors.NotJSMessageError
        await self._link.settle([self.reply], IN_PROGRESS)


TERM = b"+TERM"
IN_PROGRESS = b"+WPI"


async def ack_all(msgs: Sequence[Received]) -> None:
    """Ack every one of `msgs` (deliveries of one connection), as each one's `ack()`
    would, with one write (on the fast link); none is acked when one of them cannot be."""
    if not msgs:
        return
    for msg in msgs:
        msg._check_reply()
    await msgs[0]._link.settle([msg.reply for msg in msgs], b"")
    for msg in msgs:
        msg._ackd = True


async def keep_in_progress(msgs: Sequence[Received]) -> None:
    """Tell JetStream the handler is still at work on those of `msgs` not yet acked,
    nak'ed or terminated (one write for all on the fast link)."""
    replies = [msg.reply for msg in msgs if not msg._ackd and msg.reply]
    if replies:
        await msgs[0]._link.settle(replies, IN_PROGRESS)
