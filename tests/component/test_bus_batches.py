"""Batches on the bus against a real nats-server: what waits is handled together,
acked only after the handler returned, in order across a crash, and a failing
batch is handled again event by event."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import nats.js.errors
import pytest

from libs.common import busauth
from libs.common.bus import Bus, get_json
from libs.common.errors import Transient
from libs.common.messages import StopRequested
from libs.common.subjects import STREAM, Bucket, Durable, Kind
from tests.conftest import platform_bus

# Every test on both of the bus's clients (tests/conftest.py: bus_client).
pytestmark = pytest.mark.usefixtures("bus_client")
RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 60.0  # generous: the machine running the tests may be loaded
KINDS, TYPES = [Kind.JOB_STOP_REQUESTED], (StopRequested,)


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """These tests purge the stream and delete durables: a server of this module's own."""
    return own_nats_server


@pytest.fixture
async def bus(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=list(Durable)) as b:
        yield b


def stop_event(n: int) -> StopRequested:
    return StopRequested(id=f"alice~job{n}/stop/{RUN}/{uuid.uuid4().hex[:6]}", job=f"alice~job{n}", vc="default", by="alice")


async def until(check, what: str, seconds: float = WAIT_SECONDS):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"waited {seconds:g}s for {what}")


def consuming(bus: Bus, handler, *, ordered: bool = True, max_batch: int = 256,
              gather_seconds: float = 0.0) -> tuple[asyncio.Task, asyncio.Event]:
    stopping = asyncio.Event()
    task = asyncio.create_task(
        bus.consume_batches(Durable.MONITOR, KINDS, TYPES, handler, stopping=stopping, ordered=ordered, max_batch=max_batch,
                            gather_seconds=gather_seconds)
    )
    return task, stopping


async def halt(task: asyncio.Task) -> None:
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


async def unacked(bus: Bus) -> int:
    return (await bus.js.consumer_info(STREAM, Durable.MONITOR.value)).num_ack_pending


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "parallel"])
async def test_waiting_events_come_in_batches_in_order_and_are_acked_after_the_handler(bus, ordered):
    events = [stop_event(n) for n in range(50)]
    await bus.publish_many(events)
    batches: list[list[str]] = []

    async def handler(batch):
        batches.append([event.id for event in batch])

    task, stopping = consuming(bus, handler, ordered=ordered, max_batch=16)
    await until(lambda: sum(map(len, batches)) >= 50, "all 50 events")
    handled = [event_id for batch in batches for event_id in batch]
    assert handled == [event.id for event in events]  # each once, in stream order
    assert max(map(len, batches)) == 16  # what waited came together, up to the bound
    assert len(batches) < 50
    for _ in range(100):
        if await unacked(bus) == 0:
            break
        await asyncio.sleep(0.05)
    assert await unacked(bus) == 0
    stopping.set()
    await halt(task)


async def test_an_idle_consumer_hands_over_a_lone_event_at_once(bus):
    batches: list[list[str]] = []

    async def handler(batch):
        batches.append([event.id for event in batch])

    task, stopping = consuming(bus, handler)
    await asyncio.sleep(0.3)  # the consumer is waiting on its pull request
    lone = stop_event(1)
    sent = time.monotonic()
    await bus.publish(lone)
    await until(lambda: batches, "the lone event")
    # Not waiting for a batch to fill: well under the pull's own 5 s linger.
    assert time.monotonic() - sent < 2.0
    assert batches == [[lone.id]]
    stopping.set()
    await halt(task)


async def test_a_gathering_consumer_hands_over_the_first_event_alone_and_what_came_meanwhile_together(bus):
    batches: list[list[str]] = []

    async def handler(batch):
        batches.append([event.id for event in batch])

    task, stopping = consuming(bus, handler, ordered=False, gather_seconds=3.0)
    await asyncio.sleep(0.3)  # the consumer is waiting on its pull request
    first = stop_event(0)
    await bus.publish(first)
    await until(lambda: batches, "the first event")
    assert batches == [[first.id]]  # not held back: nothing came before it
    meanwhile = [stop_event(n) for n in range(1, 6)]
    for event in meanwhile:  # one at a time, while the consumer gathers
        await bus.publish(event)
    await until(lambda: len(batches) >= 2, "what came meanwhile")
    assert batches[1] == [event.id for event in meanwhile]
    stopping.set()
    await halt(task)


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "parallel"])
async def test_a_batch_that_fails_is_handled_again_event_by_event(bus, ordered):
    """One event fails once: its neighbours are applied, it is retried, nothing twice in effect."""
    events = [stop_event(n) for n in range(10)]
    flaky = events[4]
    await bus.publish_many(events)
    applied: dict[str, int] = {}
    calls: list[int] = []
    failed = []

    async def handler(batch):
        calls.append(len(batch))
        staged = dict(applied)  # a core's transaction: all of the batch or nothing
        for event in batch:
            if event.id == flaky.id and not failed:
                failed.append(event.id)
                raise Transient("the store answered late")
            staged[event.id] = staged.get(event.id, 0) + 1
        applied.clear()
        applied.update(staged)

    task, stopping = consuming(bus, handler, ordered=ordered)
    await until(lambda: len(applied) == 10, "every event applied")
    stopping.set()
    await halt(task)
    assert set(applied) == {event.id for event in events}
    assert set(applied.values()) == {1}
    assert calls[0] == 10 and 1 in calls[1:]  # whole, then one at a time


async def test_a_crash_between_a_batchs_effects_and_its_acks_repeats_it_first_then_goes_on(bus, nats_server):
    """The handler's effects (one KV key per event) are durable, then the process dies
    before any ack: the next incarnation gets the same events back before any newer one,
    in stream order, and applying them again changes nothing."""
    first = [stop_event(n) for n in range(20)]
    later = [stop_event(n) for n in range(20, 25)]
    await bus.publish_many(first)
    crashed = await Bus.connect(nats_server.url, name="crashing", **nats_server.login(busauth.PLATFORM))
    effects_done = asyncio.Event()

    async def apply(bus_: Bus, batch) -> None:
        await bus_.kv_write_many(Bucket.ALERTS, {f"test.{RUN}.{e.job.split('~')[1]}": msgspec.json.encode(e.id) for e in batch})

    async def apply_then_die(batch):
        await apply(crashed, batch)
        effects_done.set()
        await asyncio.sleep(3600)  # killed here: effects durable, nothing acked

    task, _ = consuming(crashed, apply_then_die)
    await asyncio.wait_for(effects_done.wait(), WAIT_SECONDS)
    task.cancel()
    await crashed.nc.close()
    assert await unacked(bus) == 20
    await bus.publish_many(later)  # arrives while the first batch is still unacked

    seen: list[str] = []

    async def apply_and_record(batch):
        await apply(bus, batch)
        seen.extend(event.id for event in batch)

    task, stopping = consuming(bus, apply_and_record)
    await until(lambda: len(seen) >= 25, "the redelivered batch and the later events")
    stopping.set()
    await halt(task)
    assert seen == [event.id for event in first + later]  # once each, the old ones first
    kv = await bus.kv(Bucket.ALERTS)
    for event in first + later:
        stored, _ = await get_json(kv, f"test.{RUN}.{event.job.split('~')[1]}", str)
        assert stored == event.id


async def test_publish_many_stores_each_event_once_in_order(bus):
    events = [stop_event(n) for n in range(30)]
    await bus.publish_many(events)
    await bus.publish_many(events)  # a batch redelivered after a crash publishes again
    info = await bus.js.stream_info(STREAM)
    stored = [msgspec.json.decode((await bus.js.get_msg(STREAM, seq)).data, type=StopRequested).id
              for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    assert stored == [event.id for event in events]


async def test_batches_published_at_once_from_a_fresh_connection_are_each_stored(bus, nats_server):
    fresh = await Bus.connect(nats_server.url, name="test-fresh", **nats_server.login(busauth.PLATFORM))
    try:
        first, second = [stop_event(n) for n in range(5)], [stop_event(n) for n in range(5, 10)]
        await asyncio.gather(fresh.publish_many(first), fresh.publish_many(second),
                             fresh.kv_write_many(Bucket.ALERTS, {f"fresh.{RUN}": b"1"}))
        info = await bus.js.stream_info(STREAM)
        stored = {msgspec.json.decode((await bus.js.get_msg(STREAM, seq)).data, type=StopRequested).id
                  for seq in range(info.state.first_seq, info.state.last_seq + 1)}
        assert stored == {event.id for event in first + second}
        assert (await (await bus.kv(Bucket.ALERTS)).get(f"fresh.{RUN}")).value == b"1"
    finally:
        await fresh.close()


async def test_kv_write_many_puts_and_deletes_every_key(bus):
    kv = await bus.kv(Bucket.ALERTS)
    await bus.kv_write_many(Bucket.ALERTS, {f"w.{RUN}.{n}": str(n).encode() for n in range(10)})
    await bus.kv_write_many(Bucket.ALERTS, {f"w.{RUN}.0": None, f"w.{RUN}.1": b"one"})
    assert await get_json(kv, f"w.{RUN}.0", int) is None
    assert (await kv.get(f"w.{RUN}.1")).value == b"one"
    assert (await kv.get(f"w.{RUN}.9")).value == b"9"


async def test_events_a_dead_run_held_come_back_before_newer_ones_even_when_their_ack_waits_end_apart(bus, nats_server):
    """The dead run held two lots of events, taken 3.5 s apart, so they come back
    apart (the ack wait is 5 s). Newer events published meanwhile must not be handed
    over between the two lots."""
    from libs.common.bus import ACK_WAIT_SECONDS

    # A durable as a running service leaves it (whole batches allowed), then a dead run's pulls.
    idle, stopping = consuming(bus, lambda batch: asyncio.sleep(0))
    await asyncio.sleep(0.5)
    stopping.set()
    await halt(idle)
    early, late, newer = ([stop_event(n) for n in range(base, base + 5)] for base in (0, 10, 20))
    await bus.publish_many(early + late)
    dead = await Bus.connect(nats_server.url, name="dead", **nats_server.login(busauth.PLATFORM))
    inbox = dead.nc.new_inbox()
    answers = await dead.nc.subscribe(inbox)

    async def take_five() -> None:  # a pull that leaves no request lingering in the server
        await dead.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{Durable.MONITOR.value}",
                              b'{"batch": 5, "no_wait": true}', reply=inbox)
        for _ in range(5):
            assert (await answers.next_msg(timeout=5)).data

    await take_five()
    await asyncio.sleep(3.5)
    await take_five()
    await dead.nc.close()  # dies holding both lots, unacked
    await bus.publish_many(newer)

    seen: list[str] = []

    async def record(batch):
        seen.extend(event.id for event in batch)

    task, stopping = consuming(bus, record)
    await until(lambda: len(seen) >= 15, "the dead run's events and the newer ones", seconds=WAIT_SECONDS + ACK_WAIT_SECONDS)
    stopping.set()
    await halt(task)
    assert seen == [event.id for event in early + late + newer]


async def test_publish_many_sends_again_by_itself_a_publish_whose_ack_never_comes(bus, monkeypatch):
    from libs.common.bus import publish as bus_module

    monkeypatch.setattr(bus_module, "PUBLISH_ACK_SECONDS", 0.5)
    events = [stop_event(n) for n in range(6)]
    lost = events[2].id
    real_send = bus.link.send
    dropped: list[str] = []

    async def losing_one(requests):
        kept = []
        for request in requests:
            subject, _, headers, _ = request
            if (headers or {}).get("Nats-Msg-Id") == lost and not dropped:
                dropped.append(subject)  # lost on the way: never stored, no ack, ever
            else:
                kept.append(request)
        sent = iter(await real_send(kept))
        return [next(sent) if request in kept else None for request in requests]

    monkeypatch.setattr(bus.link, "send", losing_one)
    await bus.publish_many(events)
    info = await bus.js.stream_info(STREAM)
    stored = [msgspec.json.decode((await bus.js.get_msg(STREAM, seq)).data, type=StopRequested).id
              for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    assert sorted(stored) == sorted(event.id for event in events)  # each once; the lost one sent again
    assert stored[-1] == lost


async def test_a_write_refused_before_it_leaves_fails_the_batch_naming_its_key(bus):
    huge = b"x" * (2 * 1024 * 1024)  # past the largest message NATS takes
    with pytest.raises(Transient, match=f"pai_alerts/big.{RUN}"):
        await bus.kv_write_many(Bucket.ALERTS, {f"small.{RUN}": b"1", f"big.{RUN}": huge})


async def test_a_write_jetstream_refuses_fails_the_batch_naming_its_key_and_the_rest_is_stored(bus):
    too_big = b"x" * 5000  # past the leases bucket's largest message (4 KiB), well within what NATS carries
    with pytest.raises(Transient, match=f"pai_leases/big.{RUN}") as refused:
        await bus.kv_write_many(Bucket.LEASES, {f"small.{RUN}": b"1", f"big.{RUN}": too_big})
    assert isinstance(refused.value.__cause__, nats.js.errors.APIError)
    assert refused.value.__cause__.err_code == 10054  # JetStream's "message size exceeds maximum allowed"
    kv = await bus.kv(Bucket.LEASES)
    assert (await kv.get(f"small.{RUN}")).value == b"1"
