"""The bus's own receive path (libs/common/bus_wire.py) against a real nats-server:
request/reply answers, publishes' acks and pull answers taken straight off the
wire, also after NATS was killed and came back."""

from __future__ import annotations

import asyncio
import uuid

import nats.errors
import pytest

from libs.common.bus import Bus
from libs.common.bus_wire import WireParser
from libs.common.errors import Transient
from libs.common.messages import StopRequested
from libs.common.subjects import STREAM, Bucket, Durable, Kind
from tests.conftest import platform_bus

RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # killed and restarted here: no other module's server


@pytest.fixture
async def bus(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=list(Durable)) as b:
        yield b


def stops(prefix: str, n: int) -> list[StopRequested]:
    return [StopRequested(id=f"{prefix}{RUN}/{i}", job=f"alice~{prefix}{RUN}{i}", vc="default", by="alice")
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


async def test_a_connected_bus_reads_with_its_own_parser(bus):
    assert isinstance(bus.nc._ps, WireParser)


async def test_a_subscription_is_served_as_soon_as_round_trip_returns(bus, nats_server):
    """What a replica relies on before it says it answers (the runtime's rules,
    the monitor's alerts): nats-py's flush() can return before the server has
    read a SUB just made, and a request then finds no responder."""
    responder = await Bus.connect(nats_server.url, name="test-responder", **nats_server.login("platform"))
    try:
        async def answer(msg) -> None:
            await msg.respond(b"here")

        for i in range(150):
            sub = await responder.nc.subscribe(f"test.fresh.{RUN}.{i}", cb=answer)
            await responder.round_trip()
            assert (await bus.nc.request(f"test.fresh.{RUN}.{i}", b"", timeout=5)).data == b"here", i
            await sub.unsubscribe()
    finally:
        await responder.close()


async def test_requests_are_answered_with_their_headers_and_no_responder_is_told(bus, nats_server):
    responder = await Bus.connect(nats_server.url, name="test-responder", **nats_server.login("platform"))
    try:
        async def answer(msg) -> None:
            await msg.respond(b"pong:" + msg.data)

        sub = await responder.nc.subscribe(f"test.echo.{RUN}", cb=answer)
        await responder.round_trip()
        replies = await asyncio.gather(*(bus.nc.request(f"test.echo.{RUN}", b"%d" % i, timeout=5) for i in range(50)))
        assert [reply.data for reply in replies] == [b"pong:%d" % i for i in range(50)]
        with pytest.raises(nats.errors.NoRespondersError):
            await bus.nc.request(f"test.nobody.{RUN}", b"", timeout=5)
        await sub.unsubscribe()
    finally:
        await responder.close()


async def test_kv_reads_and_single_publishes_through_nats_py_requests_still_work(bus):
    kv = await bus.kv(Bucket.RULES)
    revision = await kv.put(f"wire{RUN}", b'{"x":1}')
    entry = await kv.get(f"wire{RUN}")
    assert (entry.value, entry.revision) == (b'{"x":1}', revision)
    await bus.publish(stops("single", 1)[0])
    assert await consume(bus, stops("single", 1)) == {f"single{RUN}/0"}


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
    assert isinstance(bus.nc._ps, WireParser)
    assert await consume(bus, stops("after", 20)) >= {e.id for e in stops("after", 20)}
    reply = await bus.nc.request("$JS.API.INFO", b"", timeout=5)  # request/reply on the same connection
    assert b"account" in reply.data or b"memory" in reply.data
