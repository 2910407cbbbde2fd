"""The bus against a real nats-server: dedupe, ack rules, redelivery."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from libs.common.bus import Bus
from libs.common.errors import BadInput, Transient
from libs.common.messages import NodeStatus, StopRequested
from libs.common.subjects import STREAM, Bucket, Durable, Kind
from tests.conftest import platform_bus


@pytest.fixture
async def bus(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=list(Durable)) as b:
        yield b


# Every test on both of the bus's clients (tests/conftest.py: bus_client).
pytestmark = pytest.mark.usefixtures("bus_client")
RUN = uuid.uuid4().hex[:6]  # ids stay unique across runs on one server: JetStream dedupes by id


def stop_event(n: int) -> StopRequested:
    return StopRequested(id=f"alice~job{n}/stop/{RUN}/{uuid.uuid4().hex[:6]}", job=f"alice~job{n}", vc="default", by="alice")


async def consume_until(bus, handler, count_fn, want, kinds=(Kind.JOB_STOP_REQUESTED,), types=(StopRequested,), ordered=True):
    stopping = asyncio.Event()
    task = asyncio.create_task(bus.consume(Durable.MONITOR, kinds, types, handler, stopping=stopping, ordered=ordered))
    for _ in range(200):
        if count_fn() >= want:
            break
        await asyncio.sleep(0.05)
    stopping.set()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def test_bootstrap_is_idempotent_and_creates_every_bucket(bus):
    await bus.bootstrap()
    for bucket in Bucket:
        kv = await bus.kv(bucket)
        await kv.put("probe", b"1")
        assert (await kv.get("probe")).value == b"1"
        await kv.purge("probe")  # the buckets are shared with the session's other tests


async def test_publishing_the_same_event_twice_stores_it_once(bus):
    once = stop_event(1)
    await bus.publish(once)
    await bus.publish(once)
    await bus.publish(stop_event(2))
    info = await bus.js.stream_info(STREAM)
    assert info.state.messages == 2


async def test_events_are_handled_in_order_and_acked(bus):
    seen: list[str] = []

    async def handler(event):
        seen.append(event.job)

    for n in range(5):
        await bus.publish(stop_event(n))
    await consume_until(bus, handler, lambda: len(seen), 5)
    assert seen == [f"alice~job{n}" for n in range(5)]
    info = await bus.js.consumer_info(STREAM, Durable.MONITOR.value)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_transient_failure_is_redelivered_and_bad_input_is_dropped(bus):
    calls: dict[str, int] = {}

    async def handler(event):
        calls[event.job] = calls.get(event.job, 0) + 1
        if event.job == "alice~job1" and calls[event.job] == 1:
            raise Transient("database away")
        if event.job == "alice~job2":
            raise BadInput("never valid")

    for n in (1, 2):
        await bus.publish(stop_event(n))
    # Until job1's retry and job2's one try have both happened (job2 comes right after the retry: stopping
    # at the retry alone could stop before it).
    await consume_until(bus, handler, lambda: min(calls.get("alice~job1", 0), 2) + min(calls.get("alice~job2", 0), 1), 3)
    assert calls == {"alice~job1": 2, "alice~job2": 1}


async def test_undecodable_message_is_terminated_not_fatal(bus):
    seen = []

    async def handler(event):
        seen.append(event.job)

    await bus.js.publish("pai.v1.job.stop_requested.default.alice.bad", b"{not json", headers={"Nats-Msg-Id": str(uuid.uuid4())})
    await bus.publish(stop_event(3))
    await consume_until(bus, handler, lambda: len(seen), 1)
    assert seen == ["alice~job3"]


async def test_consumer_filters_by_kind(bus):
    seen = []

    async def handler(event):
        seen.append(type(event).__name__)

    await bus.publish(NodeStatus(id=f"node/a/{RUN}", job="", node="10.0.0.1", healthy=False))
    await bus.publish(stop_event(4))
    await consume_until(bus, handler, lambda: len(seen), 1)
    await asyncio.sleep(0.1)
    assert seen == ["StopRequested"]


async def test_trace_context_travels_from_publisher_to_handler(bus):
    """A job's event is handled inside the job's one trace, as the child of the
    publish, which links to the span that published it (the request that asked)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    from libs.common import telemetry

    # OpenTelemetry takes one global provider per process: add to the one set
    # earlier (by a service started in this process), or set one.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    seen = []

    async def handler(event):
        current = trace.get_current_span()
        seen.append((current.get_span_context().trace_id, current.parent.span_id if current.parent else None))

    event = stop_event(5)
    with telemetry.span("submit"):
        sent = trace.get_current_span().get_span_context().span_id
        await bus.publish(event)
    await consume_until(bus, handler, lambda: len(seen), 1)
    [(trace_id, parent)] = seen
    assert trace_id == telemetry.job_trace_id(event.job) != 0
    [publish] = [s for s in exporter.get_finished_spans() if s.name == "publish"]
    assert publish.context.span_id == parent
    assert [link.context.span_id for link in publish.links] == [sent]


async def test_ordered_consumer_keeps_order_when_its_process_dies_mid_event(bus, nats_server):
    """A message handed to a consumer that died is redelivered before any later one."""
    first, second = stop_event(6), stop_event(7)
    crashed = await Bus.connect(nats_server.url, name="crashing", **nats_server.login("platform"))
    got_first = asyncio.Event()

    async def hang(event):
        got_first.set()
        await asyncio.sleep(3600)  # dies before it acks

    stopping = asyncio.Event()
    task = asyncio.create_task(crashed.consume(Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], (StopRequested,), hang,
                                               stopping=stopping, ordered=True))
    await bus.publish(first)
    await asyncio.wait_for(got_first.wait(), 10)
    task.cancel()
    await crashed.nc.close()
    await bus.publish(second)

    seen = []

    async def record(event):
        seen.append(event.id)

    await consume_until(bus, record, lambda: len(seen), 2)
    assert seen == [first.id, second.id]


async def dead_letters(bus) -> list:
    """Every EventDeadLettered in the stream, decoded."""
    from libs.common.messages import decode
    from libs.common.subjects import kind_filter

    sub = await bus.js.pull_subscribe(kind_filter(Kind.EVENT_DEAD_LETTERED), stream=STREAM)
    try:
        msgs = await sub.fetch(10, timeout=1)
    except Exception:
        msgs = []
    await sub.unsubscribe()
    return [decode(m.data) for m in msgs]


async def test_a_bug_that_repeats_is_dead_lettered_and_the_events_behind_it_flow(bus):
    """The poison event crashes its handler on every delivery: after DEAD_LETTER_AFTER
    incarnations the consumer gives up on it, announces it, and handles the next one."""
    from libs.common import bus as bus_module

    poison, after = stop_event(20), stop_event(21)
    await bus.publish(poison)
    await bus.publish(after)
    tries, seen = [], []

    async def handler(event):
        if event.id == poison.id:
            tries.append(event.id)
            raise RuntimeError("record too large for this service")
        seen.append(event.id)

    incarnations = 0
    while not seen and incarnations < bus_module.DEAD_LETTER_AFTER + 2:
        incarnations += 1
        stopping = asyncio.Event()
        task = asyncio.create_task(
            bus.consume(Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], (StopRequested,), handler, stopping=stopping, ordered=True)
        )
        for _ in range(100):  # a crash ends consume(); the "restart" is the next loop
            if task.done() or seen:
                break
            await asyncio.sleep(0.05)
        stopping.set()
        if not task.done():
            task.cancel()
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            await task
    assert seen == [after.id]
    assert len(tries) == bus_module.DEAD_LETTER_AFTER
    [letter] = [d for d in await dead_letters(bus) if d.eventId == poison.id]
    assert letter.job == poison.job and letter.consumer == Durable.MONITOR.value
    assert letter.deliveries == bus_module.DEAD_LETTER_AFTER
    assert "record too large" in letter.reason


async def test_a_transient_failure_that_never_clears_is_dead_lettered_quickly_on_an_ordered_consumer(bus, monkeypatch):
    from libs.common.bus import consume as bus_module

    monkeypatch.setattr(bus_module, "TRANSIENT_DEAD_LETTER_AFTER", 3)
    stuck, after = stop_event(22), stop_event(23)
    await bus.publish(stuck)
    await bus.publish(after)
    seen = []

    async def handler(event):
        if event.id == stuck.id:
            raise Transient("the store is full")
        seen.append(event.id)

    await consume_until(bus, handler, lambda: len(seen), 1)
    assert seen == [after.id]
    [letter] = [d for d in await dead_letters(bus) if d.eventId == stuck.id]
    assert letter.deliveries == 3 and "the store is full" in letter.reason


async def test_restore_reads_every_live_entry_of_a_bucket(bus):
    import msgspec

    from libs.common.bus import all_keys, load_all

    kv = await bus.kv(Bucket.NODES)
    for key in await all_keys(kv):
        await kv.purge(key)
    for n in range(300):  # more than the watcher's queue holds at once
        await kv.put(f"restore-{n}", msgspec.json.encode({"n": n}))
    await kv.delete("restore-7")
    loaded = await load_all(kv, dict)
    assert len(loaded) == 299 and "restore-7" not in loaded and loaded["restore-299"] == {"n": 299}


async def test_all_keys_lists_every_live_key_also_right_after_they_were_written(bus):
    """nats-py's own KeyValue.keys() may end before the entries the server already
    sent are read, and list none or some of them."""
    from libs.common.bus import all_keys

    kv = await bus.kv(Bucket.NODES)
    for key in await all_keys(kv):
        await kv.purge(key)
    assert await all_keys(kv) == []
    for n in range(200):
        await kv.put(f"listed.{n}", b"{}")
    await kv.put("other.1", b"{}")
    await kv.delete("listed.7")
    wanted = {f"listed.{n}" for n in range(200)} - {"listed.7"}
    for _ in range(40):
        assert set(await all_keys(kv, "listed.")) == wanted
        assert set(await all_keys(kv)) == wanted | {"other.1"}
    for key in await all_keys(kv):
        await kv.purge(key)


async def test_restore_from_another_services_bucket_leaves_out_a_value_that_does_not_decode(bus):
    """A bad value in a bucket some other service owns must not keep this one from
    starting; in its own bucket it fails the load (its state would be wrong)."""
    import msgspec

    from libs.common.bus import all_keys, load_all

    kv = await bus.kv(Bucket.NODES)
    for key in await all_keys(kv):
        await kv.purge(key)
    await kv.put("good", msgspec.json.encode({"n": 1}))
    await kv.put("bad", b"[not an object")
    assert await load_all(kv, dict, skip_undecodable=True) == {"good": {"n": 1}}
    with pytest.raises(msgspec.DecodeError):
        await load_all(kv, dict)
    await kv.purge("bad")


async def test_restore_from_a_store_that_does_not_answer_fails_instead_of_restoring_nothing(bus, monkeypatch):
    """A bucket whose stream is not there (JetStream still recovering it) is never
    taken for an empty one: the service retries, then fails so it is restarted."""
    from libs.common.bus import kv as bus_module

    kv = await bus.kv(Bucket.NODES)
    monkeypatch.setattr(bus_module, "RESTORE_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(kv, "_stream", "KV_not_recovered_yet")
    with pytest.raises(Transient, match="not ready to restore from"):
        await bus_module.load_all(kv, dict)
