"""The bus's receive path (libs/common/bus/wire.py) reads the NATS protocol as
nats-py's own parser does, whatever way the bytes are cut into reads, and hands
the bus's own subscriptions their messages straight off the wire."""

from __future__ import annotations

import itertools

import nats.errors
import pytest
from nats.aio.client import Client
from nats.protocol.parser import Parser

from libs.common.bus.link import parse_headers, status_of
from libs.common.bus.wire import WireParser, install, round_trip

DELIVERY_HEADERS = b"NATS/1.0\r\nNats-Msg-Id: job~1/submitted\r\ntraceparent: 00-ab-cd-01\r\n\r\n"
EVENT = b'{"kind":"job.submitted","id":"job~1/submitted","job":"job~1"}'
ACK_REPLY = b"$JS.ACK.PAI_EVENTS.launcher.1.2045.1988.1732430000000000000.3"
BIG = bytes(range(256)) * 800  # 200 KB: many reads


def hmsg(subject: bytes, sid: int, reply: bytes, headers: bytes, payload: bytes) -> bytes:
    return b"HMSG %s %d %s%d %d\r\n%s%s\r\n" % (
        subject, sid, reply + b" " if reply else b"", len(headers), len(headers) + len(payload), headers, payload)


def msg(subject: bytes, sid: int, reply: bytes, payload: bytes) -> bytes:
    return b"MSG %s %d %s%d\r\n%s\r\n" % (subject, sid, reply + b" " if reply else b"", len(payload), payload)


# What PAI receives, and what nats-py handles for it, in one stream.
STREAM = b"".join([
    b'INFO {"server_id":"x","max_payload":1048576,"connect_urls":["10.0.0.2:4222"]}\r\n',
    hmsg(b"_INBOX.p.1", 1, ACK_REPLY, DELIVERY_HEADERS, EVENT),  # a JetStream delivery (pull answer)
    hmsg(b"_INBOX.p.1", 1, b"", b"NATS/1.0 404 No Messages\r\n\r\n", b""),  # the status ending an answer
    msg(b"_INBOX.a.7.0", 2, b"", b'{"stream":"PAI_EVENTS","seq":42}'),  # a PubAck
    hmsg(b"_INBOX.a.7.1", 2, b"", b"NATS/1.0 503\r\n\r\n", b""),  # no responders
    b"PING\r\n",
    msg(b"$KV.pai_jobs.u.j1", 3, b"$JS.ACK.KV_pai_jobs.w.1.9.9.1732430000000000000.0", b'{"spec":1}'),  # a watch
    b"+OK\r\n",
    hmsg(b"$KV.pai_jobs.u.j2", 3, b"$JS.ACK.KV_pai_jobs.w.1.10.10.1732430000000000000.0",
         b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n", b""),  # a watched delete
    hmsg(b"deliver.x", 4, b"$JS.FC.PAI.x.y", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),  # flow control
    b"PONG\r\n",
    msg(b"_INBOX.big", 5, b"", BIG),
    msg(b"empty", 6, b"", b""),
    b"-ERR 'Permissions Violation for Subscription to \"secret\"'\r\n",
    msg(b"tail", 7, b"r", b"x"),
])


class RecordingClient:
    """The parts of nats-py's client the parser calls, recording what it was handed."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.stats = {"in_msgs": 0, "in_bytes": 0}
        self._subs: dict = {}
        self._resp_sub_prefix = None
        self._pending: list[bytes] = []
        self._pending_data_size = 0
        self._transport = None

    # The send side, not used here.
    _flush_queue = None
    _pending_data_size = _max_pending_size = 0
    _max_payload = 1024 * 1024
    is_closed = is_connected = is_draining_pubs = False

    async def _send_command(self, cmd, priority=False):
        raise NotImplementedError

    async def _flush_pending(self, force_flush=False):
        raise NotImplementedError

    async def _init_request_sub(self):
        raise NotImplementedError

    def _build_message(self, sid, subject, reply, data, headers):
        raise NotImplementedError

    async def _process_msg(self, sid, subject, reply, data, headers):
        self.seen.append(("msg", sid, bytes(subject), bytes(reply), data, headers))

    async def _process_ping(self):
        self.seen.append(("ping",))

    async def _process_pong(self):
        self.seen.append(("pong",))

    async def _process_info(self, info):
        self.seen.append(("info", info))

    async def _process_err(self, err):
        self.seen.append(("err", err))


async def parsed(parser_class, chunks: list[bytes], direct_sids=()) -> list[tuple]:
    client = RecordingClient()
    parser = parser_class(client)
    for sid in direct_sids:
        parser.direct[sid] = lambda subject, reply, data, headers, sid=sid: client.seen.append(
            ("msg", sid, subject, reply, data, headers))
    for chunk in chunks:
        await parser.parse(chunk)
    assert not parser.buf, "everything sent was read"
    return client.seen


def cut_at(data: bytes, *points: int) -> list[bytes]:
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


async def test_one_read_is_parsed_as_nats_py_parses_it():
    expected = await parsed(Parser, [STREAM])
    assert len([s for s in expected if s[0] == "msg"]) == 10
    assert await parsed(WireParser, [STREAM]) == expected


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 4096])
async def test_reads_of_any_size_are_parsed_as_one(size):
    expected = await parsed(Parser, [STREAM])
    chunks = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    assert await parsed(WireParser, chunks) == expected


async def test_a_stream_cut_in_two_anywhere_is_parsed_as_one():
    head = STREAM[:STREAM.index(b"MSG _INBOX.big")]  # every cut of the small messages, the big one once
    expected = await parsed(Parser, [head])
    for point in range(1, len(head)):
        assert await parsed(WireParser, cut_at(head, point)) == expected, point


async def test_a_big_payload_arrives_over_many_reads():
    stream = msg(b"_INBOX.big", 5, b"reply", BIG) + b"PING\r\n"
    chunks = [stream[i:i + 65536] for i in range(0, len(stream), 65536)]
    assert await parsed(WireParser, chunks) == [("msg", 5, b"_INBOX.big", b"reply", BIG, None), ("ping",)]


async def test_the_bus_own_subscriptions_get_their_messages_straight_and_others_go_to_nats_py():
    expected = await parsed(Parser, [STREAM])
    direct = await parsed(WireParser, cut_at(STREAM, 100, 333, 1000), direct_sids=(1, 2))
    assert direct == expected  # the same messages, in the same order, whoever took them


async def test_direct_messages_are_counted_in_the_connection_stats():
    client = RecordingClient()
    parser = WireParser(client)
    parser.direct[2] = lambda *message: None
    await parser.parse(msg(b"_INBOX.a.7.0", 2, b"", b"12345") + msg(b"other", 9, b"", b"xy"))
    assert client.stats == {"in_msgs": 1, "in_bytes": 5}  # nats-py counts the others itself


async def test_a_direct_handler_that_fails_does_not_stop_the_reading():
    client = RecordingClient()
    parser = WireParser(client)
    parser.direct[2] = lambda *message: 1 / 0
    await parser.parse(msg(b"_INBOX.a.7.0", 2, b"", b"{}") + b"PING\r\n")
    assert client.seen == [("ping",)]


@pytest.mark.parametrize("line", [
    b"MSG subject\r\n", b"MSG subject 1 reply x\r\n", b"MSG subject one 5\r\n", b"HMSG subject 1 2\r\n",
    b"HMSG subject 1 reply 2 3 4\r\n",
])
async def test_a_malformed_message_line_is_a_protocol_error(line):
    with pytest.raises(nats.errors.ProtocolError):
        await WireParser(RecordingClient()).parse(line)


async def test_an_unknown_operation_is_a_protocol_error():
    with pytest.raises(nats.errors.ProtocolError):
        await WireParser(RecordingClient()).parse(b"WHAT is this\r\n")


async def test_installed_on_a_connection_mid_message_it_goes_on_where_nats_py_stopped():
    client = RecordingClient()
    client._ps = Parser(client)
    stream = hmsg(b"_INBOX.p.1", 1, ACK_REPLY, DELIVERY_HEADERS, EVENT) + b"PING\r\n"
    await client._ps.parse(stream[:60])  # the control line and part of the payload
    parser = install(client)
    assert parser is client._ps and isinstance(parser, WireParser)
    await parser.parse(stream[60:])
    assert client.seen == [("msg", 1, b"_INBOX.p.1", ACK_REPLY, EVENT, DELIVERY_HEADERS), ("ping",)]
    assert install(client) is parser  # once per connection


async def test_a_reset_parser_drops_what_it_held():
    client = RecordingClient()
    parser = WireParser(client)
    await parser.parse(msg(b"s", 1, b"", b"abcdef")[:12])
    parser.reset()  # what nats-py does on a reconnect
    await parser.parse(b"PONG\r\n")
    assert client.seen == [("pong",)]


async def test_round_trip_sends_what_is_pending_before_its_ping():
    """nats-py's flush() writes PING straight to the socket; a SUB still in the
    pending buffer would reach the server after it."""
    written: list[bytes] = []

    class Transport:
        def writelines(self, lines):
            written.extend(lines)

    class Connected(RecordingClient):
        is_connected = True

        async def flush(self, timeout):
            written.append(b"PING\r\n")

    client = Connected()
    client._transport = Transport()
    client._pending, client._pending_data_size = [b"SUB rules q 9\r\n"], 15
    await round_trip(client)
    assert written == [b"SUB rules q 9\r\n", b"PING\r\n"]
    assert (client._pending, client._pending_data_size) == ([], 0)  # not written twice by the flusher


def test_a_nats_py_whose_internals_changed_fails_at_connect_naming_its_version():
    class Changed(RecordingClient):
        _process_msg = None

    client = Changed()
    client._ps = Parser(client)
    with pytest.raises(RuntimeError, match=r"nats-py \S+: .*_process_msg"):
        install(client)


def test_a_connection_with_another_parser_is_refused():
    client = RecordingClient()
    client._ps = object()
    with pytest.raises(RuntimeError, match="nc._ps"):
        install(client)


@pytest.mark.parametrize(("payload", "headers", "status"), [
    (b"", b"NATS/1.0 404 No Messages\r\n\r\n", 404),
    (b"", b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\n\r\n", 408),
    (b"", b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n", 409),
    (b"", b"NATS/1.0 503\r\n\r\n", 503),
    (b"", b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n", None),  # headers, no status
    (b"{}", b"NATS/1.0 404\r\n\r\n", None),  # a payload: a message, not a status
    (b"", None, None),
])
def test_the_status_ending_a_pull_answer_is_read_from_its_first_line(payload, headers, status):
    assert status_of(payload, headers) == status


@pytest.mark.parametrize("raw", [
    DELIVERY_HEADERS,
    b"NATS/1.0 404 No Messages\r\n\r\n",
    b"NATS/1.0 503\r\n\r\n",
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1016\r\nNats-Last-Stream: 1024\r\n\r\n",
    b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n",
    b"NATS/1.0\r\nName:NoSpace\r\nTabbed:\tvalue \r\nbad name: x\r\nno colon\r\n\r\n",
    "NATS/1.0\r\nUnicode: caf\u00e9\r\n\r\n".encode(),
    b"NATS/1.0\r\n\r\n",
])
async def test_headers_are_read_as_nats_py_reads_them(raw):
    assert parse_headers(raw) == await Client()._process_headers(raw)

