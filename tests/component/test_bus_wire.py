"""The bus's own receive and send paths (libs/common/bus/wire.py, link.py) against
a real nats-server: request/reply answers, publishes' acks and pull answers taken
straight off the wire; single publishes, KV writes and reads and JetStream API
requests answered on the bus's reply subscription, with nats-py's errors; acks
written while NATS is down delivered once it is back; and all of it after NATS
was killed and came back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid

import nats.errors
import nats.js.errors
import pytest

from libs.common.bus import Bus, Puller, ack_all, delivery
from libs.common.bus.wire import WireParser
from libs.common.errors import Transient
from libs.common.messages import StopRequested, encode, subject_of
from libs.common.subjects import STREAM, Bucket, Durable, Kind
from tests.conftest import platform_bus

# Every test on both of the bus's clients (tests/conftest.py: bus_client).
pytestmark = pytest.mark.usefixtures("bus_client")
RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # killed and restarted here: no other module's server


@pytest.fixture
async def bus(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=list(Durable)) as b:
        yield b


def run_id() -> str:
    """This run's ids, each client's its own (JetStream dedupes by id; a key created stays)."""
    return RUN + os.environ.get("PAI_BUS_CLIENT", "")


def stops(prefix: str, n: int) -> list[StopRequested]:
    run = run_id()
    return [StopRequested(id=f"{prefix}{run}/{i}", job=f"alice~{prefix}{run}{i}", vc="default", by="alice")
            for i in range(n)]


async def consume(bus: Bus, wanted: list[StopRequested]) -> set[str]:
    """The ids handled until every one of `wanted` was (an event whose ack a kill -9
    lost comes again: at least once)."""
    seen: set[str] = set()
    stopping = asyncio.Event()

    async def handler(events) -> None:
        seen.update(e.id for e in events)
        if seen >= {e.id for e in wanted}:
            stopping.set()

    async with asyncio.timeout(30):
        await bus.consume_batches(Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], [StopRequested], handler,
                                  stopping=stopping)
    return seen


async def test_a_connected_bus_reads_with_its_own_parser_on_the_fast_client_only(bus, bus_client):
    assert bus.link.fast == (bus_client == "fast")
    assert isinstance(bus.nc._ps, WireParser) == bus.link.fast


async def test_a_subscription_is_served_as_soon_as_round_trip_returns(bus, nats_server):
    """What a replica relies on before it says it answers (the runtime's rules,
    the monitor's alerts): nats-py's flush() can return before the server has
    read a SUB just made, and a request then finds no responder."""
    responder = await Bus.connect(nats_server.url, name="test-responder", **nats_server.login("platform"))
    try:
        async def answer(msg) -> None:
            await msg.respond(b"here")

        for i in range(150):
            sub = await responder.nc.subscribe(f"test.fresh.{run_id()}.{i}", cb=answer)
            await responder.round_trip()
            assert (await bus.nc.request(f"test.fresh.{run_id()}.{i}", b"", timeout=5)).data == b"here", i
            await sub.unsubscribe()
    finally:
        await responder.close()


async def test_requests_are_answered_with_their_headers_and_no_responder_is_told(bus, nats_server):
    responder = await Bus.connect(nats_server.url, name="test-responder", **nats_server.login("platform"))
    try:
        async def answer(msg) -> None:
            await msg.respond(b"pong:" + msg.data)

        sub = await responder.nc.subscribe(f"test.echo.{run_id()}", cb=answer)
        await responder.round_trip()
        replies = await asyncio.gather(*(bus.nc.request(f"test.echo.{run_id()}", b"%d" % i, timeout=5) for i in range(50)))
        assert [reply.data for reply in replies] == [b"pong:%d" % i for i in range(50)]
        with pytest.raises(nats.errors.NoRespondersError):
            await bus.nc.request(f"test.nobody.{run_id()}", b"", timeout=5)
        await sub.unsubscribe()
    finally:
        await responder.close()


async def test_single_publishes_and_kv_writes_answer_as_nats_py_did(bus):
    event = stops("single", 1)[0]
    stored = await bus.js.publish(subject_of(event), encode(event), headers={"Nats-Msg-Id": event.id})
    again = await bus.js.publish(subject_of(event), encode(event), headers={"Nats-Msg-Id": event.id})
    assert (stored.stream, bool(stored.duplicate)) == (STREAM, False)
    assert (again.seq, again.duplicate) == (stored.seq, True)
    assert await consume(bus, [event]) == {event.id}

    kv = await bus.kv(Bucket.RULES)
    key = f"wire{run_id()}"
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get(key)
    created = await kv.create(key, b'{"x":1}')
    with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
        await kv.create(key, b'{"x":2}')
    updated = await kv.update(key, b'{"x":3}', last=created)
    with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
        await kv.update(key, b'{"x":4}', last=created)
    entry = await kv.get(key)
    assert (entry.value, entry.revision) == (b'{"x":3}', updated)
    await kv.delete(key, last=updated)
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get(key)
    recreated = await kv.create(key, b'{"x":5}')  # a deleted key may be created again
    assert (await kv.get(key)).revision == recreated > updated
    assert await kv.put(key, b'{"x":6}') > recreated


async def test_requests_no_one_answers_fail_as_nats_py_s_did(bus):
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await bus.js.publish(f"test.nostream.{run_id()}", b"x")
    with pytest.raises(nats.js.errors.NotFoundError):
        await bus.js.stream_info("NO_SUCH_STREAM")
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        await bus.js._api_request(f"test.nobody.{run_id()}", b"", timeout=5)
    silent = await bus.nc.subscribe(f"test.silent.{run_id()}")  # a responder that never answers
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await bus.js.publish(f"test.silent.{run_id()}", b"x", timeout=0.2)
        with pytest.raises(nats.errors.TimeoutError):
            await bus.js._api_request(f"test.silent.{run_id()}", b"", timeout=0.2)
    finally:
        await silent.unsubscribe()


async def test_acks_sent_while_nats_is_down_reach_it_once_back(bus, nats_server):
    await bus.publish_many(stops("down", 3))
    await bus._pull_subscription(Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], max_ack_pending=100)
    puller = await Puller.open(bus.nc, STREAM, Durable.MONITOR.value)
    try:
        async with asyncio.timeout(10):
            msgs = []
            while len(msgs) < 3:
                msgs += await puller.next_batch(3 - len(msgs))
        # Stopped, not killed: a kill -9 may lose the consumer's record of the
        # deliveries (not yet synced), and then nothing is left to ack.
        await asyncio.to_thread(nats_server.stop)
        for _ in range(100):
            if not bus.nc.is_connected:
                break
            await asyncio.sleep(0.05)
        await ack_all(msgs)  # kept in nats-py's pending buffer meanwhile
        nats_server.start()
        for _ in range(300):
            info = None
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                info = await bus.js.consumer_info(STREAM, Durable.MONITOR.value)
            if info is not None and info.ack_floor.stream_seq >= max(delivery(msg).stream_seq for msg in msgs):
                break
            await asyncio.sleep(0.1)
        assert info is not None and info.ack_floor.stream_seq >= max(delivery(msg).stream_seq for msg in msgs)
        assert (info.num_ack_pending, info.num_redelivered) == (0, 0)
    finally:
        await puller.close()


async def test_after_nats_is_killed_and_back_the_bus_publishes_and_consumes_again(bus, nats_server):
    await bus.publish_many(stops("before", 20))
    assert await consume(bus, stops("before", 20)) == {e.id for e in stops("before", 20)}
    nats_server.stop(kill=True)
    await asyncio.to_thread(nats_server.proc.wait)
    nats_server.start()
    for _ in range(300):  # the client reconnects by itself, its subscriptions with it
        if bus.nc.is_connected:
            break
        await asyncio.sleep(0.1)
    for _ in range(100):  # JetStream may still be recovering its store
        try:
            await bus.publish_many(stops("after", 20))
            break
        except Transient:  # publish_many says so when JetStream does not answer yet
            await asyncio.sleep(0.2)
    assert isinstance(bus.nc._ps, WireParser) == bus.link.fast
    assert await consume(bus, stops("after", 20)) >= {e.id for e in stops("after", 20)}
    reply = await bus.nc.request("$JS.API.INFO", b"", timeout=5)  # request/reply on the same connection
    assert b"account" in reply.data or b"memory" in reply.data
