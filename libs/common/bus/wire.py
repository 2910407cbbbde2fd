"""The fast link (`bus_client: fast`, the default): the bus's receive and send
paths over nats-py's internals, and the one module that reads them.

Every message a service receives used to take nats-py's whole receive path: two
regular expressions tried per control line and a dict of arguments
(`nats.protocol.parser.Parser`), the headers parsed into a dict, a `Msg`
dataclass, the JetStream bookkeeping, and an `asyncio.Queue` (plus, for a
subscription with a callback, a task step per message). Profiled on a service's
connection that came to 5-10 us per message, for about 35 messages per job in
each service (docs/throughput.md). Most of them are messages the bus consumes
itself: the acks of its batched publishes and KV writes (`Bus._send_together`)
and the answers to its pull requests (`pull.Puller`); then the answers to
nats-py's own requests (single publishes, KV reads: `take_request_answers`).

So `FastLink.start` puts `WireParser` on the connection (`install`): nats-py's parser with the
same state, reading MSG and HMSG itself with one split per control line, and
leaving every other operation (PING, PONG, INFO, +OK, -ERR) and every other
subscription's message to nats-py, exactly as before: JetStream flow control,
ordered consumers, request/reply, slow consumer limits, reconnects (which
`reset()` the parser and resubscribe) are nats-py's. A subscription made with
`FastLink.subscribe` has its messages handed to a plain function as they are
parsed, as bytes, with no `Msg`; the bus makes of them what it needs
(`link.Received`: headers parsed only when read).

`link.Link` does all of it through nats-py's public API (`bus_client: plain`);
the bus's behaviour is the same either way (the bus tests run both).

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
  the bus answers itself: `_JetStream`), and the pending list and the
  `_transport` it goes to (`round_trip`).
Both links read a `KeyValue`'s bucket name, stream, subject prefix and context
(`_name`, `_stream`, `_pre`, `_js`) and a KV watcher's subscription (`_sub`),
which nats-py does not offer otherwise: `kv_parts`, `watcher_subscription`.

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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import msgspec
import nats
import nats.aio.client
import nats.errors
import nats.js
import nats.js.errors
import nats.protocol.parser as nats_parser
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.kv import KeyValue
from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, Parser

from libs.common.bus.answers import ApiAnswer, StoreAcks, api_answer_of, pub_ack_of
from libs.common.bus.link import DirectHandler, Link, Request, Unsubscribable, parse_headers

log = logging.getLogger("pai.bus")

NATS_PY_VERSION = getattr(nats.aio.client, "__version__", "unknown")
_MSG_OPS = (b"MSG ", b"MSG\t", b"HMSG ", b"HMSG\t")
_CRLF = b"\r\n"


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
    return cast(WireParser, parser)


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
            f"PAI's bus (libs/common/bus/wire.py) does not work with nats-py {NATS_PY_VERSION}: "
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
        raise RuntimeError(f"PAI's bus (libs/common/bus/wire.py) does not work with nats-py {NATS_PY_VERSION}: "
                           "its request/reply subscription is not where it was. Install the nats-py version "
                           "pyproject.toml pins.")
    sid = sids[0]

    def answer(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        future = nc._resp_map.get(subject[len(prefix):].decode())
        if future is not None and not future.done():
            future.set_result(nc._build_message(sid, subject, reply, data, parse_headers(headers)))

    parser.direct[sid] = answer


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

    async def unsubscribe(self) -> None:
        """Nothing of its own to stop: the push subscription is unsubscribed by its owner."""


def apply_on_arrival(push_subscription: Any, apply: Callable[[Any], None]) -> _AppliedAtOnce:
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
    return direct


class _JetStream(nats.js.JetStreamContext):
    """nats-py's JetStream context, whose single publishes (`Publisher.publish`, every
    KeyValue put, create, update and delete) and API requests (KV reads, stream
    and consumer info) are answered on the bus's reply subscription (`answers.StoreAcks`)
    instead of as nats-py requests: per request, no random token (a `getrandom`
    system call), NUID, `wait_for` timer, `Msg` or headers dict. Raises what
    nats-py's own raise: the JetStream error's class (`APIError.from_error`), so
    `KeyValue.create`/`update` still tell a wrong last sequence; a NATS timeout;
    `NoStreamResponseError` for a publish no stream listens to,
    `ServiceUnavailableError` for an API request without a responder."""

    def __init__(self, nc: NatsClient, answers: StoreAcks):
        super().__init__(nc)
        self._answers = answers

    async def publish(self, subject: str, payload: bytes = b"", timeout: float | None = None,
                      stream: str | None = None, headers: dict[str, Any] | None = None,
                      msg_ttl: float | None = None) -> api.PubAck:
        if stream is not None or msg_ttl is not None:  # forms PAI does not send: nats-py's own
            return await super().publish(subject, payload, timeout=timeout, stream=stream, headers=headers,
                                         msg_ttl=msg_ttl)
        [answer] = await self._answers.send([(subject, payload, headers)], pub_ack_of,
                                            self._timeout if timeout is None else timeout)
        if isinstance(answer, api.PubAck):
            return answer
        raise answer if isinstance(answer, Exception) else nats.errors.TimeoutError

    async def _api_request(self, req_subject: str, req: bytes = b"", timeout: float = 5) -> dict[str, Any]:
        [answer] = await self._answers.send([(req_subject, req, None)], api_answer_of, timeout)
        if not isinstance(answer, ApiAnswer):
            raise answer if isinstance(answer, Exception) else nats.errors.TimeoutError
        if answer.no_responders:
            raise nats.js.errors.ServiceUnavailableError
        resp: dict[str, Any] = msgspec.json.decode(answer.data, type=dict[str, Any])
        if "error" in resp:
            raise nats.js.errors.APIError.from_error(resp["error"])
        return resp



class FastLink(Link):
    """The link over nats-py's internals (module doc): the same subscriptions,
    requests and acks as `Link`, with less work per message."""

    fast = True

    async def start(self) -> None:
        install(self.nc)
        await take_request_answers(self.nc)

    def jetstream(self, answers: Any) -> nats.js.JetStreamContext:
        return _JetStream(self.nc, answers)

    async def subscribe(self, subject: str, handler: DirectHandler) -> Unsubscribable:
        parser = install(self.nc)
        sub = await self.nc.subscribe(subject)
        parser.direct[sub._id] = handler
        return _Direct(self.nc, sub)

    async def send(self, requests: Sequence[Request]) -> list[BaseException | None]:
        """As `Link.send`, but the requests PAI sends (see `publish_command`) are
        formatted here and written into nats-py's pending buffer together."""
        nc = self.nc
        if "publish" in vars(nc):
            # A connection whose `publish` was replaced on the instance (the fault
            # tests break writes there: tests/component/rest_replica.py) gets
            # every request through it, as nats-py's own requests do.
            return await super().send(requests)
        refused: list[BaseException | None] = [None] * len(requests)
        formatted: list[bytes] = []  # commands not yet sent, of the requests at `positions`
        positions: list[int] = []
        payload_bytes = 0
        for position, (subject, reply, headers, data) in enumerate(requests):
            if len(data) > nc._max_payload:
                refused[position] = nats.errors.MaxPayloadError()
                continue
            command = publish_command(subject, reply, headers, data)
            if command is not None:
                formatted.append(command)
                positions.append(position)
                payload_bytes += len(data)
                continue
            # One nats-py would refuse or rewrite: its own publish, in order.
            await self._send(formatted, positions, payload_bytes, refused)
            formatted, positions, payload_bytes = [], [], 0
            try:
                await nc.publish(subject, data, reply=reply, headers=headers)
            except nats.errors.Error as exc:
                refused[position] = exc
        await self._send(formatted, positions, payload_bytes, refused)
        return refused

    async def _send(self, commands: list[bytes], positions: list[int], payload_bytes: int,
                    refused: list[BaseException | None]) -> None:
        if not commands:
            return
        try:
            await send_commands(self.nc, b"".join(commands), len(commands), payload_bytes)
        except nats.errors.Error as exc:  # not sent (a closed connection, no room to keep it while reconnecting)
            for position in positions:
                refused[position] = exc

    async def settle(self, replies: Sequence[str], payload: bytes) -> None:
        await send_commands(self.nc, ack_commands(list(replies), payload), len(replies), len(payload) * len(replies))

    async def round_trip(self, timeout: float = 10.0) -> None:
        await round_trip(self.nc, timeout)

    def apply_on_arrival(self, push_subscription: Any, apply: Callable[[Any], None]) -> Unsubscribable:
        return apply_on_arrival(push_subscription, apply)


class _Direct:
    """A subscription of `FastLink.subscribe`: its messages go to its handler as they are parsed."""

    def __init__(self, nc: Any, sub: Any) -> None:
        self._nc = nc
        self._sub = sub
        self.sid: int = sub._id

    async def unsubscribe(self) -> None:
        self._nc._ps.direct.pop(self.sid, None)
        await self._sub.unsubscribe()


class KvParts(NamedTuple):
    """What the bus reads of nats-py's `KeyValue` (it has no public accessors for them)."""

    name: str  # the bucket
    stream: str  # its stream, KV_<bucket>
    prefix: str  # its keys' subject prefix, $KV.<bucket>.
    js: nats.js.JetStreamContext
    nc: NatsClient


def kv_parts(kv: KeyValue) -> KvParts:
    return KvParts(kv._name, kv._stream, kv._pre, kv._js, kv._js._nc)


def watcher_subscription(watcher: KeyValue.KeyWatcher) -> Any:
    """The JetStream push subscription behind a KV watch (its consumer's info)."""
    return watcher._sub
