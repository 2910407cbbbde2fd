"""The bus's send path (libs/common/bus_wire.py): acks written into nats-py's
pending buffer as the bus formats them are the bytes nats-py's own `publish`
would write, refused where it would refuse them, and counted as it counts them."""

from __future__ import annotations

import json

import nats.errors
import pytest
from nats.aio.client import Client

from libs.common.bus_wire import Received, ack_all, ack_commands, keep_in_progress, send_commands

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


def commands(nc: Client) -> list[tuple[list[bytes], bytes]]:
    """The PUB commands pending, as nats-server reads them: the arguments of the
    line (whitespace-separated, so nats-py's two spaces for no reply subject are
    one) and the payload."""
    data, read = pending(nc), []
    while data:
        line, _, data = data.partition(b"\r\n")
        args = line.split()
        size = int(args[-1])
        read.append((args, data[:size]))
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
    return Received(nc, b"pai.v1.job.submitted", reply, b"{}", None)


async def test_a_batch_is_acked_in_one_write():
    nc = client()
    msgs = [delivery(nc, reply) for reply in REPLIES]
    await ack_all(nc, msgs)
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
        await ack_all(nc, [first, bad])
    assert nc._pending == [] and not first._ackd


async def test_heartbeats_go_to_those_still_unacked():
    nc = client()
    done, busy = delivery(nc, REPLIES[0]), delivery(nc, REPLIES[1])
    await done.term()
    await keep_in_progress(nc, [done, busy])
    assert pending(nc) == ack_commands(REPLIES[:1], b"+TERM") + ack_commands(REPLIES[1:], b"+WPI")
    await ack_all(nc, [busy])
    before = pending(nc)
    await keep_in_progress(nc, [done, busy])
    assert pending(nc) == before
