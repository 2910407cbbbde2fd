"""The bus's send path (libs/common/bus/wire.py): acks and publishes written into
nats-py's pending buffer as the bus formats them are the commands nats-py's own
`publish` would write, refused where it would refuse them, and counted as it
counts them; what nats-py would refuse or rewrite is left to it."""

from __future__ import annotations

import json

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import api

from libs.common.bus.answers import StoreAcks, store_outcome
from libs.common.bus.link import Received, ack_all, keep_in_progress
from libs.common.bus.wire import FastLink, ack_commands, publish_command, send_commands

REPLIES = [
    "$JS.ACK.PAI_EVENTS.launcher.1.2045.1988.1732430000000000000.3",
    "$JS.ACK.hub.ACCHASH.PAI_EVENTS.scheduler.2.99.7.1732430000000000000.12.r4nd0m",
]
NAK = b"-NAK " + json.dumps({"delay": 200_000_000}).encode()


def client(status: int = Client.RECONNECTING, max_pending: int = 2 * 1024 * 1024) -> Client:
    """A nats-py client as it is while reconnecting: what it is sent stays in its
    pending buffer, for the connection that comes back."""
    nc = Client()
    nc._status = status
    nc._max_pending_size = max_pending
    return nc


def pending(nc: Client) -> bytes:
    return b"".join(nc._pending)


def commands(nc: Client) -> list[tuple[list[bytes], bytes, bytes]]:
    """The PUB and HPUB commands pending, as nats-server reads them: the arguments
    of the line (whitespace-separated, so nats-py's two spaces for no reply
    subject are one), the headers block and the payload."""
    data, read = pending(nc), []
    while data:
        line, _, data = data.partition(b"\r\n")
        args = line.split()
        size = int(args[-1])
        header_size = int(args[-2]) if args[0] == b"HPUB" else 0
        read.append((args, data[:header_size], data[header_size:size]))
        assert data[size:size + 2] == b"\r\n"
        data = data[size + 2:]
    return read


@pytest.mark.parametrize("payload", [b"", b"+WPI", b"+TERM", NAK], ids=["ack", "in-progress", "term", "nak"])
@pytest.mark.parametrize("replies", [REPLIES[:1], REPLIES], ids=["one", "batch"])
async def test_acks_are_the_bytes_nats_py_publish_writes(replies, payload):
    ours, theirs = client(), client()
    await send_commands(ours, ack_commands(replies, payload), len(replies), len(payload) * len(replies))
    for reply in replies:
        await theirs.publish(reply, payload)
    assert commands(ours) == commands(theirs)
    assert ours._pending_data_size == len(pending(ours))
    assert (ours.stats["out_msgs"], ours.stats["out_bytes"]) == (theirs.stats["out_msgs"], theirs.stats["out_bytes"])


@pytest.mark.parametrize(
    ("status", "max_pending", "draining"),
    [
        pytest.param(Client.CLOSED, 1024, False, id="closed"),
        pytest.param(Client.CONNECTED, 1024, True, id="draining"),
        pytest.param(Client.RECONNECTING, 0, False, id="reconnecting-without-a-buffer"),
        pytest.param(Client.RECONNECTING, 8, False, id="reconnecting-with-a-full-buffer"),
    ],
)
async def test_acks_are_refused_where_nats_py_refuses_a_publish(status, max_pending, draining):
    ours, theirs = client(status, max_pending), client(status, max_pending)
    for nc in (ours, theirs):
        nc._pending_data_size = 4
        if draining:
            nc._status = Client.DRAINING_PUBS
    with pytest.raises(nats.errors.Error) as refused_to_them:
        await theirs.publish(REPLIES[0], NAK)
    with pytest.raises(type(refused_to_them.value)):
        await send_commands(ours, ack_commands(REPLIES[:1], NAK), 1, len(NAK))
    assert ours._pending == []


def delivery(nc: Client, reply: str) -> Received:
    return Received(FastLink(nc), b"pai.v1.job.submitted", reply, b"{}", None)


async def test_a_batch_is_acked_in_one_write():
    nc = client()
    msgs = [delivery(nc, reply) for reply in REPLIES]
    await ack_all(msgs)
    assert nc._pending == [ack_commands(REPLIES)]
    assert all(msg._ackd for msg in msgs)


@pytest.mark.parametrize(
    ("reply", "acked", "error"),
    [
        pytest.param("", False, nats.errors.NotJSMessageError, id="not-a-jetstream-delivery"),
        pytest.param(REPLIES[1], True, nats.errors.MsgAlreadyAckdError, id="already-acked"),
    ],
)
async def test_a_batch_with_one_that_cannot_be_acked_sends_nothing(reply, acked, error):
    nc = client()
    bad = delivery(nc, reply)
    bad._ackd = acked
    first = delivery(nc, REPLIES[0])
    with pytest.raises(error):
        await ack_all([first, bad])
    assert nc._pending == [] and not first._ackd


async def test_heartbeats_go_to_those_still_unacked():
    nc = client()
    done, busy = delivery(nc, REPLIES[0]), delivery(nc, REPLIES[1])
    await done.term()
    await keep_in_progress([done, busy])
    assert pending(nc) == ack_commands(REPLIES[:1], b"+TERM") + ack_commands(REPLIES[1:], b"+WPI")
    await ack_all([busy])
    before = pending(nc)
    await keep_in_progress([done, busy])
    assert pending(nc) == before


EVENT = b'{"kind":"job.stop_requested","id":"alice~j1/stop","job":"alice~j1"}'


@pytest.mark.parametrize(
    ("subject", "reply", "headers", "payload"),
    [
        pytest.param("pai.v1.job.stop_requested.default.alice.j1", "_INBOX.x.3.0",
                     {"Nats-Msg-Id": "alice~j1/stop", "traceparent": "00-ab-cd-01"}, EVENT, id="event"),
        pytest.param("$KV.pai_jobs.alice.j1", "_INBOX.x.3.1", None, EVENT, id="kv-put"),
        pytest.param("$KV.pai_jobs.alice.j1", "_INBOX.x.3.2", {"KV-Operation": "DEL"}, b"", id="kv-delete"),
        pytest.param("$KV.pai_jobs.alice.j1", "_INBOX.x.3.3", {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}, EVENT,
                     id="kv-create-enum-header-name"),
        pytest.param("$JS.API.STREAM.INFO.PAI_EVENTS", "_INBOX.x.4.0", None, b"", id="api-request"),
        pytest.param("pai.v1.x", "", None, b"x", id="no-reply"),
    ],
)
async def test_a_publish_formatted_by_the_bus_is_what_nats_py_writes(subject, reply, headers, payload):
    ours, theirs = client(), client()
    command = publish_command(subject, reply, headers, payload)
    assert command is not None
    await send_commands(ours, command, 1, len(payload))
    await theirs.publish(subject, payload, reply=reply, headers=headers)
    assert commands(ours) == commands(theirs)
    assert ours.stats == theirs.stats


@pytest.mark.parametrize(
    ("subject", "reply", "headers"),
    [
        pytest.param("pai.v1.a b", "_INBOX.x.1.0", None, id="space-in-subject"),
        pytest.param("pai.v1.a\r\nPUB evil 0", "_INBOX.x.1.0", None, id="command-injected"),
        pytest.param("", "_INBOX.x.1.0", None, id="empty-subject"),
        pytest.param("pai.v1.a", "_INBOX.x 1.0", None, id="space-in-reply"),
        pytest.param("pai.v1.a", "_INBOX.x.1.0", {" Padded ": "v"}, id="header-name-nats-py-strips"),
        pytest.param("pai.v1.a", "_INBOX.x.1.0", {"Bad:Name": "v"}, id="header-name-not-a-token"),
        pytest.param("pai.v1.a", "_INBOX.x.1.0", {"Name": "a\r\nEvil: 1"}, id="header-value-with-line-end"),
        pytest.param("pai.v1.a", "_INBOX.x.1.0", {"Name": " v "}, id="header-value-nats-py-strips"),
    ],
)
def test_a_publish_nats_py_would_refuse_or_rewrite_is_left_to_it(subject, reply, headers):
    assert publish_command(subject, reply, headers, b"x") is None


async def test_requests_sent_together_leave_in_order_those_left_to_nats_py_too():
    nc = client()
    nc._max_payload = 64
    answers = StoreAcks(FastLink(nc))
    answers._sub = object()  # as if subscribed: nothing is answered here
    requests = [
        ("pai.v1.a", b"1", {"Nats-Msg-Id": "a"}),
        ("pai.v1.b", b"2", {"Name": " padded "}),  # nats-py's own publish
        ("pai.v1.c", b"x" * 65, None),  # past the largest payload: never sent
        ("pai.v1.d", b"4", None),
    ]
    got = await answers.send(requests, store_outcome, 0.01)
    assert [(args[1], payload) for args, _, payload in commands(nc)] == [
        (b"pai.v1.a", b"1"), (b"pai.v1.b", b"2"), (b"pai.v1.d", b"4")]
    assert got[0] is None and got[1] is None and got[3] is None  # not answered in time
    assert isinstance(got[2], nats.errors.MaxPayloadError)
    assert nc.stats["out_msgs"] == 3
