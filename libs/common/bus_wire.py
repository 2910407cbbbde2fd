"""The bus's receive and send paths, and their one seam onto nats-py's internals.

Every message a service receives used to take nats-py's whole receive path: two
regular expressions tried per control line and a dict of arguments
(`nats.protocol.parser.Parser`), the headers parsed into a dict, a `Msg`
dataclass, the JetStream bookkeeping, and an `asyncio.Queue` (plus, for a
subscription with a callback, a task step per message). Profiled on a service's
connection that came to 5-10 us per message, for about 35 messages per job in
each service (docs/throughput.md). Most of them are messages the bus consumes
itself: the acks of its batched publishes and KV writes (`Bus._send_together`)
and the answers to its pull requests (`bus._Puller`); then the answers to
nats-py's own requests (single publishes, KV reads: `take_request_answers`).

So `install` puts `WireParser` on the connection: nats-py's parser with the
same state, reading MSG and HMSG itself with one split per control line, and
leaving every other operation (PING, PONG, INFO, +OK, -ERR) and every other
subscription's message to nats-py, exactly as before: JetStream flow control,
ordered consumers, request/reply, slow consumer limits, reconnects (which
`reset()` the parser and resubscribe) are nats-py's. A subscription made with
`subscribe_direct` has its messages handed to a plain function as they are
parsed, as bytes, with no `Msg`; the bus makes of them what it needs
(`Received`: headers parsed only when read).

nats-py's internals relied upon, all here and checked at `install` (a nats-py
that changed them fails at connect, naming its version, never mid-flight):
- `nc._ps`, the parser the read loop awaits (`parse(bytes)`), whose `reset()`
  a reconnect calls, with nats-py's state fields (`buf`, `state`, `needed`,
  `header_needed`, `msg_arg`);
- `nc._process_msg(sid, subject, reply, payload, headers)` and
  `nc._process_ping/_pong/_info/_err`, what the parser hands operations to;
- a subscription's `_id` (the sid of its messages), and its `_pending_queue`
  and `_pending_size` (`apply_on_arrival`);
- request/reply's response subscription and map (`_resp_sub_prefix`,
  `_init_request_sub`, `_resp_map`) and `_build_message`
  (`take_request_answers`);
- on the send side, nats-py's pending buffer and its flusher (`_send_command`,
  `_flush_queue`, `_flush_pending`, `_pending_data_size`, `_max_pending_size`,
  `_max_payload`, the connection's status: `send_commands`), and JetStream's
  API request and publish (`JetStreamContext._api_request` and `publish`, which
  the bus answers itself: `bus._JetStream`), and the pending list and the
  `_transport` it goes to (`round_trip`).

The send side. Every message a service sent went through nats-py's `publish`:
the subject validated, the headers checked with a regular expression each and
built into a bytearray, the command formatted, appended to the pending buffer
and a flush kicked; about 14 acks (every JetStream delivery is acked) and 15
publishes per job across the services. `send_commands` appends commands the
bus formatted itself (`ack_commands`, `publish_command`; a batch's acks or
publishes in one bytes object) to that same buffer, with nats-py's own checks
before (closed, draining, the buffer's bound while reconnecting) and its flush
after: what is pending while the connection is down is written, whole commands
only, once it is back, exactly as nats-py's own publishes are.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Any

import nats
import nats.aio.client
import nats.errors
import nats.js
import nats.protocol.parser as nats_parser
from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, Parser

log = logging.getLogger("pai.bus")

NATS_PY_VERSION = getattr(nats.aio.client, "__version__", "unknown")
# A message for a direct subscription: (subject, reply, payload, raw headers or None).
DirectHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]

_MSG_OPS = (b"MSG ", b"MSG\t", b"HMSG ", b"HMSG\t")
_CRLF = b"\r\n"
# The first line of a headers block: "NATS/1.0" alone, or with an inline status
# ("NATS/1.0 404 No Messages"), what JetStream answers a pull request with.
_HEADERS_LINE = b"NATS/1.0"
_STATUS_AT = len(_HEADERS_LINE) + 1


class WireParser(Parser):
    """nats-py's protocol parser (its state and, for anything but MSG and HMSG,
    its own handling), reading messages with less work per message.

    A read is parsed where it lies (slices of the bytes read, one copy each);
    only what a read leaves unfinished is kept in `buf` for the next. A message
    split across reads waits in nats-py's own state (`AWAITING_MSG_PAYLOAD`),
    so a large payload arriving over many reads is not copied on each. Whenever
    control passes to nats-py (which may await, and a reconnect meanwhile
    resets the parser), `buf` holds nothing; a reset drops the rest of the
    read, as nats-py's parser does."""

    direct: dict[int, DirectHandler]
    resets: int = 0

    def __init__(self, nc: Any = None) -> None:
        super().__init__(nc)
        self.direct = {}

    def reset(self) -> None:
        super().reset()
        self.resets += 1

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        if buf:
            buf += data
            if self.state == AWAITING_MSG_PAYLOAD and len(buf) < self.needed + 2:
                return  # a large payload still arriving
            data = bytes(buf)
            buf.clear()
        resets, direct = self.resets, self.direct
        pos, size = 0, len(data)
        while pos < size:
            if self.state == AWAITING_MSG_PAYLOAD:  # the rest of a message split across reads
                if size - pos < self.needed + 2:
                    break
                arg, hsize, start = self.msg_arg, self.header_needed, pos
                sid, subject, reply, end = arg["sid"], arg["subject"], arg["reply"], pos + self.needed
                self.state, self.header_needed = AWAITING_CONTROL_LINE, 0
            elif data.startswith(_MSG_OPS, pos):
                eol = data.find(_CRLF, pos)
                if eol < 0:
                    break
                args = data[pos:eol].split()
                try:
                    subject, sid = args[1], int(args[2])
                    if args[0] == b"MSG":
                        if len(args) == 4:
                            reply, hsize, total = b"", 0, int(args[3])
                        elif len(args) == 5:
                            reply, hsize, total = args[3], 0, int(args[4])
                        else:
                            raise ValueError
                    elif len(args) == 5:
                        reply, hsize, total = b"", int(args[3]), int(args[4])
                    elif len(args) == 6:
                        reply, hsize, total = args[3], int(args[4]), int(args[5])
                    else:
                        raise ValueError
                except (IndexError, ValueError):
                    raise nats.errors.ProtocolError("nats: malformed MSG") from None
                start = eol + 2
                end = start + total
                if end + 2 > size:  # the payload is still on its way
                    self.msg_arg = {"subject": subject, "sid": sid, "reply": reply}
                    self.needed, self.header_needed, self.state = total, hsize, AWAITING_MSG_PAYLOAD
                    pos = start
                    break
            else:
                eol = data.find(_CRLF, pos)
                if eol < 0:
                    break
                line, pos = data[pos:eol + 2], eol + 2
                await self._operation(line)
                if self.resets != resets:
                    return
                continue
            if hsize > 0:
                headers: bytes | None = data[start:start + hsize]
                payload = data[start + hsize:end]
            else:
                headers, payload = None, data[start:end]
            pos = end + 2
            handler = direct.get(sid)
            if handler is None:
                await self.nc._process_msg(sid, subject, reply, payload, headers)
                if self.resets != resets:
                    return
                continue
            stats = self.nc.stats
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(payload)
            try:
                handler(subject, reply, payload, headers)
            except Exception:  # the read loop must go on
                log.exception("handling a message on %s failed", subject.decode(errors="replace"))
        if pos < size:
            self.buf += data[pos:]

    async def _operation(self, line: bytes) -> None:
        """Any operation but MSG and HMSG, one line, as nats-py's parser handles it."""
        if nats_parser.OK_RE.match(line):
            return
        err = nats_parser.ERR_RE.match(line)
        if err:
            await self.nc._process_err(err.groups()[0].decode().lower())
            return
        if nats_parser.PING_RE.match(line):
            await self.nc._process_ping()
            return
        if nats_parser.PONG_RE.match(line):
            await self.nc._process_pong()
            return
        info = nats_parser.INFO_RE.match(line)
        if info:
            await self.nc._process_info(json.loads(info.groups()[0].decode()))
            return
        raise nats.errors.ProtocolError("nats: unknown protocol")


async def send_commands(nc: Any, commands: bytes, messages: int, payload_bytes: int) -> None:
    """Send `commands` (whole protocol commands, e.g. `ack_commands`) as nats-py's
    `publish` sends one: refused on a closed or draining connection, and while
    reconnecting past the pending buffer's bound (nats-py's `OutboundBufferLimitError`);
    counted in the connection's stats; written by nats-py's flusher, or kept
    for the connection that comes back."""
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    if nc.is_draining_pubs:
        raise nats.errors.ConnectionDrainingError
    if not nc.is_connected and (nc._max_pending_size <= 0 or payload_bytes + nc._pending_data_size > nc._max_pending_size):
        raise nats.errors.OutboundBufferLimitError
    stats = nc.stats
    stats["out_msgs"] += messages
    stats["out_bytes"] += payload_bytes
    await nc._send_command(commands)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


def ack_commands(replies: list[str], payload: bytes = b"") -> bytes:
    """One PUB of `payload` (an ack: nothing, `+WPI`, `+TERM`, `-NAK ...`) to each
    of `replies`, the reply subjects of JetStream deliveries. Not validated as
    nats-py validates a subject: the server sent them, as whitespace-separated
    tokens of a MSG line, so they hold no whitespace or line ends."""
    tail = b" %d\r\n%b\r\n" % (len(payload), payload)
    return b"".join([b"PUB " + reply.encode() + tail for reply in replies])


# What nats-py's publish refuses in a subject (whitespace: it would break the
# command line, and a line end could inject commands of its own).
_SUBJECT_TROUBLE = re.compile(r"[ \t\r\n]")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # nats-py's (a token of RFC 9110)
# Header names seen valid; PAI sends a handful (Nats-Msg-Id, traceparent, KV-Operation, ...).
_VALID_HEADER_NAMES: set[str] = set()


def publish_command(subject: str, reply: str, headers: dict[str, str] | None, payload: bytes) -> bytes | None:
    """The PUB or HPUB command nats-py's `publish` writes for this message, for
    `send_commands`; None for one nats-py would refuse or rewrite (whitespace in
    a subject, a header name or value it strips or cleans), to be left to it.
    A batch of publishes so formatted is one write instead of one `publish`
    each (subject validation, a regular expression per header, a bytearray
    built piece by piece: ~5 us a publish, about 15 per job across services)."""
    if not subject or _SUBJECT_TROUBLE.search(subject) or _SUBJECT_TROUBLE.search(reply):
        return None
    head = b"%b %b " % (subject.encode(), reply.encode()) if reply else subject.encode() + b" "
    if headers is None:
        return b"PUB %b%d\r\n%b\r\n" % (head, len(payload), payload)
    lines = ["NATS/1.0\r\n"]
    for name, value in headers.items():
        if name not in _VALID_HEADER_NAMES:
            if not _HEADER_NAME.fullmatch(name) or len(_VALID_HEADER_NAMES) > 64:
                return None
            _VALID_HEADER_NAMES.add(name)
        if "\r" in value or "\n" in value or value != value.strip():
            return None
        lines.append(name + ": " + value + "\r\n")  # not a format: a name may be a str Enum (api.Header)
    lines.append("\r\n")
    block = "".join(lines).encode()
    return b"HPUB %b%d %d\r\n%b%b\r\n" % (head, len(block), len(block) + len(payload), block, payload)


def install(nc: Any) -> WireParser:
    """Put `WireParser` on the connection `nc` (nats-py's, connected), keeping
    whatever its parser holds; raises RuntimeError, naming nats-py's version,
    when nats-py's internals are not what this module relies on."""
    parser: Any = getattr(nc, "_ps", None)  # nats-py's Parser, checked below
    if isinstance(parser, WireParser):
        return parser
    _check_internals(nc, parser)
    # The same object, so a parse in progress (awaiting nats-py) and the read
    # loop's next call see one buffer and one state.
    parser.__class__ = WireParser
    parser.direct = {}
    parser.resets = 0
    return parser


def _check_internals(nc: Any, parser: Any) -> None:
    problems = []
    if type(parser) is not Parser:
        problems.append(f"the connection's parser (nc._ps) is {type(parser).__name__}, not nats.protocol.parser.Parser")
    for field in ("buf", "state", "needed", "header_needed", "msg_arg"):
        if parser is not None and not hasattr(parser, field):
            problems.append(f"its parser has no {field}")
    if not inspect.iscoroutinefunction(getattr(parser, "parse", None)) or not callable(getattr(parser, "reset", None)):
        problems.append("its parser has no async parse() and reset()")
    process_msg = getattr(nc, "_process_msg", None)
    if process_msg is None or list(inspect.signature(process_msg).parameters) != ["sid", "subject", "reply", "data", "headers"]:
        problems.append("nc._process_msg(sid, subject, reply, data, headers) is gone or changed")
    for name in ("_process_ping", "_process_pong", "_process_info", "_process_err"):
        if not inspect.iscoroutinefunction(getattr(nc, name, None)):
            problems.append(f"nc.{name} is gone")
    for name in ("OK_RE", "ERR_RE", "PING_RE", "PONG_RE", "INFO_RE"):
        if not hasattr(nats_parser, name):
            problems.append(f"nats.protocol.parser.{name} is gone")
    if not isinstance(getattr(nc, "stats", None), dict):
        problems.append("nc.stats is gone")
    for name in ("_resp_sub_prefix", "_init_request_sub", "_build_message", "_subs", "_flush_queue", "_pending",
                 "_pending_data_size", "_max_pending_size", "_max_payload", "_transport", "is_closed",
                 "is_connected", "is_draining_pubs"):
        if not hasattr(nc, name):
            problems.append(f"nc.{name} is gone")
    for name in ("_send_command", "_flush_pending"):
        if not inspect.iscoroutinefunction(getattr(nc, name, None)):
            problems.append(f"nc.{name} is gone")
    api_request = getattr(nats.js.JetStreamContext, "_api_request", None)
    if api_request is None or list(inspect.signature(api_request).parameters) != ["self", "req_subject", "req", "timeout"]:
        problems.append("JetStreamContext._api_request(req_subject, req, timeout) is gone or changed")
    publish = getattr(nats.js.JetStreamContext, "publish", None)
    if publish is None or list(inspect.signature(publish).parameters) != [
            "self", "subject", "payload", "timeout", "stream", "headers", "msg_ttl"]:
        problems.append("JetStreamContext.publish(subject, payload, timeout, stream, headers, msg_ttl) changed")
    if problems:
        raise RuntimeError(
            f"PAI's bus (libs/common/bus_wire.py) does not work with nats-py {NATS_PY_VERSION}: "
            + "; ".join(problems) + ". Install the nats-py version pyproject.toml pins."
        )


async def round_trip(nc: Any, timeout: float = 10.0) -> None:
    """Return once the server has read every command sent on `nc` before the call.

    nats-py's `flush()` does not promise that: it writes its PING straight to
    the socket, ahead of the commands still waiting in its pending buffer for
    the flusher task (a SUB or a PUB just made). Its PONG can then come back
    before the server has read them, and a subscription "flushed" this way was
    seen to have no responder yet for a request made right after (about one
    time in fifteen). Writing what is pending first keeps the order."""
    if nc._pending_data_size > 0 and nc.is_connected:
        nc._transport.writelines(nc._pending[:])
        nc._pending = []
        nc._pending_data_size = 0
    await nc.flush(timeout=timeout)


async def take_request_answers(nc: Any) -> None:
    """Hand nats-py's request answers (on its one response subscription,
    `<inbox>.<nuid>.*`) to the waiting request in the read loop: the same `Msg`
    nats-py's `_request_sub_callback` sets on the request's future, without the
    queue and the task step its callback subscription costs per answer."""
    parser = install(nc)
    if nc._resp_sub_prefix is None:
        await nc._init_request_sub()
    prefix = bytes(nc._resp_sub_prefix)
    mux = (prefix + b"*").decode()
    sids = [sid for sid, sub in nc._subs.items() if sub.subject == mux]
    if len(sids) != 1 or not isinstance(getattr(nc, "_resp_map", None), dict):
        raise RuntimeError(f"PAI's bus (libs/common/bus_wire.py) does not work with nats-py {NATS_PY_VERSION}: "
                           "its request/reply subscription is not where it was. Install the nats-py version "
                           "pyproject.toml pins.")
    sid = sids[0]

    def answer(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        future = nc._resp_map.get(subject[len(prefix):].decode())
        if future is not None and not future.done():
            future.set_result(nc._build_message(sid, subject, reply, data, parse_headers(headers)))

    parser.direct[sid] = answer


class DirectSubscription:
    """A subscription whose messages go to a plain function as they are parsed
    (`WireParser.direct`). Made through nats-py, so that a reconnect subscribes
    it again; nats-py's own queue for it stays empty."""

    def __init__(self, nc: Any, sub: Any, handler: DirectHandler):
        self._nc = nc
        self._sub = sub
        self.sid: int = sub._id

    @classmethod
    async def open(cls, nc: Any, subject: str, handler: DirectHandler) -> DirectSubscription:
        """Subscribe to `subject`, a subject of this connection's own (an inbox):
        nothing can come for it before a request sent after this returns."""
        parser = install(nc)
        sub = await nc.subscribe(subject)
        parser.direct[sub._id] = handler
        return cls(nc, sub, handler)

    async def unsubscribe(self) -> None:
        self._nc._ps.direct.pop(self.sid, None)
        await self._sub.unsubscribe()


class Inbox:
    """The messages of a direct subscription, kept for a reader that takes them
    when it is ready (`get`), in arrival order."""

    __slots__ = ("_loop", "_waiter", "items")

    def __init__(self, loop: Any) -> None:
        self.items: deque[Any] = deque()
        self._waiter: Any = None
        self._loop = loop

    def put(self, item: Any) -> None:
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
            headers["Status"] = status.decode()
        if description.strip():
            headers["Description"] = description.decode()
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


class Received:
    """A message the bus takes itself from a direct subscription: what nats-py's
    `Msg` offers the bus (subject, reply, data, headers; a JetStream delivery's
    ack, nak, term, in_progress), at the cost of one small object. Subject and
    headers are decoded only when read."""

    __slots__ = ("_ackd", "_headers", "_nc", "_raw_headers", "_subject", "data", "reply")

    def __init__(self, nc: Any, subject: bytes, reply: str, data: bytes, raw_headers: bytes | None) -> None:
        self._nc = nc
        self._subject = subject
        self.reply = reply
        self.data = data
        self._raw_headers = raw_headers
        self._headers: Any = False
        self._ackd = False

    @property
    def subject(self) -> str:
        return self._subject.decode()

    @property
    def headers(self) -> dict[str, str] | None:
        if self._headers is False:
            self._headers = parse_headers(self._raw_headers)
        return self._headers

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
        await self._settle(_TERM)

    async def _settle(self, payload: bytes) -> None:
        """Answer the delivery once and for all (ack, nak or term: `payload`)."""
        self._check_reply()
        await send_commands(self._nc, ack_commands([self.reply], payload), 1, len(payload))
        self._ackd = True

    async def in_progress(self) -> None:
        if not self.reply:
            raise nats.errors.NotJSMessageError
        await send_commands(self._nc, ack_commands([self.reply], _IN_PROGRESS), 1, len(_IN_PROGRESS))


_TERM = b"+TERM"
_IN_PROGRESS = b"+WPI"


async def ack_all(nc: Any, msgs: list[Received]) -> None:
    """Ack every one of `msgs` (deliveries of `nc`), as each one's `ack()` would,
    with one write into nats-py's pending buffer; none is acked (or sent) when
    one of them cannot be."""
    for msg in msgs:
        msg._check_reply()
    await send_commands(nc, ack_commands([msg.reply for msg in msgs]), len(msgs), 0)
    for msg in msgs:
        msg._ackd = True


async def keep_in_progress(nc: Any, msgs: list[Received]) -> None:
    """Tell JetStream the handler is still at work on those of `msgs` not yet acked,
    nak'ed or terminated (one write for all)."""
    replies = [msg.reply for msg in msgs if not msg._ackd and msg.reply]
    if replies:
        await send_commands(nc, ack_commands(replies, _IN_PROGRESS), len(replies), len(_IN_PROGRESS) * len(replies))


class _AppliedAtOnce:
    """Stands in for a nats-py subscription's message queue: each message the read
    loop puts there is applied at once, in the read loop itself.

    Without a callback, nats-py puts a subscription's messages in its queue for
    `next_msg`; with one, a task per subscription takes them out and awaits the
    callback: a future woken, a task step and a coroutine per message. What it
    reads of the queue besides `put_nowait` (its size for flow control, `join` on
    drain) is answered as for a queue always empty: every message is applied by
    the time it is handed over, so the ordered consumer's flow control replies at
    once. `apply` must not block; what it raises is logged, never raised into
    the read loop."""

    def __init__(self, sub: Any, apply: Callable[[Any], None]):
        self._sub = sub
        self._apply = apply

    def put_nowait(self, msg: Any) -> None:
        self._sub._pending_size -= len(msg.data)  # counted by nats-py as it queued it
        try:
            self._apply(msg)
        except Exception:  # nats-py's read loop must go on
            log.exception("applying %s failed", msg.subject)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        return None


def apply_on_arrival(push_subscription: Any, apply: Callable[[Any], None]) -> None:
    """Apply the messages of `push_subscription` (nats-py's JetStream push
    subscription, made without a callback) as nats-py's read loop hands them
    over, any already queued first, in order (`_AppliedAtOnce`); `apply` must
    not block. For a consumer that only updates memory per message (rest's job
    index watches). Its messages stay on nats-py's path (`Msg`): the ordered
    consumer's gap detection and flow control are nats-py's."""
    sub = push_subscription._sub
    queued = sub._pending_queue
    direct = _AppliedAtOnce(sub, apply)
    sub._pending_queue = push_subscription._pending_queue = direct
    while not queued.empty():
        direct.put_nowait(queued.get_nowait())
