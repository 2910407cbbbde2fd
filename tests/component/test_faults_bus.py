"""Faults beyond kill -9, on the bus, against a real nats-server:
a handler that hangs, a publish that times out."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import nats.errors
import nats.js.errors
import pytest

from libs.common import bus as bus_module
from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.messages import (
    EventDeadLettered,
    StopRequested,
    TaskExited,
    TaskVerdict,
    subject_of,
)
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Durable, Kind
from services.runtime.core import RuleBook
from services.runtime.service import RuntimeShell, baseline_rules
from tests.conftest import platform_bus

# Every test on both of the bus's clients (tests/conftest.py: bus_client).
pytestmark = pytest.mark.usefixtures("bus_client")
RUN = uuid.uuid4().hex[:6]
# Generous: the machine running the tests may be loaded.
WAIT_SECONDS = 60.0


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """These tests purge the stream and delete durables: a server of this module's own."""
    return own_nats_server


@pytest.fixture
async def admin(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=list(Durable)) as b:
        yield b


async def until(check, what: str, seconds: float = WAIT_SECONDS):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"waited {seconds:g}s for {what}")


def stop(n: int) -> StopRequested:
    return StopRequested(id=f"alice~job{n}/stop/{RUN}/{uuid.uuid4().hex[:6]}", job=f"alice~job{n}", vc="default", by="alice")


async def stream_events(bus: Bus, type_, subject: str) -> list:
    """Every message of the stream on `subject`, decoded."""
    info = await bus.js.stream_info(STREAM)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(STREAM, seq)
        except nats.js.errors.NotFoundError:
            continue
        if msg.subject == subject:
            found.append(msgspec.json.decode(msg.data, type=type_))
    return found


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "parallel"])
async def test_a_hung_handler_does_not_hold_the_events_behind_it(admin, ordered):
    """The hung event is cancelled at its deadline, retried, then dead-lettered;
    the events behind it are handled meanwhile or right after, each once."""
    deadline = 0.5
    hung, *behind = [stop(n) for n in range(4)]
    for event in (hung, *behind):
        await admin.publish(event)
    started_hung = 0
    cancelled_hung = 0
    handled: list[str] = []

    async def handler(event):
        nonlocal started_hung, cancelled_hung
        if event.id == hung.id:
            started_hung += 1
            try:
                await asyncio.Event().wait()  # never returns
            except asyncio.CancelledError:
                cancelled_hung += 1
                raise
        handled.append(event.id)

    stopping = asyncio.Event()
    began = time.monotonic()
    consuming = asyncio.create_task(admin.consume(
        Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], (StopRequested,), handler,
        stopping=stopping, ordered=ordered, deadline=deadline))
    try:
        await until(lambda: len(handled) == len(behind), "the events behind the hung one")
        took = time.monotonic() - began
        dead = await until(lambda: started_hung >= bus_module.STALLED_DEAD_LETTER_AFTER, "the hung event's last try")
        assert dead
        dead_subject = subject_of(EventDeadLettered(id="", job=hung.job, consumer=Durable.MONITOR.value, eventId="",
                                                    eventKind="", subject="", deliveries=0, reason=""))

        async def dead_lettered():
            return await stream_events(admin, EventDeadLettered, dead_subject)

        for _ in range(200):
            letters = await dead_lettered()
            if letters:
                break
            await asyncio.sleep(0.05)
        [letter] = letters
        assert letter.eventId == hung.id and "stalled" in letter.reason and "deadline" in letter.reason
        assert letter.deliveries == bus_module.STALLED_DEAD_LETTER_AFTER
    finally:
        stopping.set()
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
    # Each try of the hung handler was cancelled, none left running; the others ran once each.
    assert started_hung == cancelled_hung == bus_module.STALLED_DEAD_LETTER_AFTER
    assert sorted(handled) == sorted(e.id for e in behind)
    # Bounded: a few deadlines and retry delays, far from "forever" (not a speed claim).
    assert took < WAIT_SECONDS


async def test_a_handler_that_stalls_once_finishes_its_event_on_the_redelivery(admin):
    event = stop(9)
    await admin.publish(event)
    tries = 0
    finished: list[str] = []

    async def handler(got):
        nonlocal tries
        tries += 1
        if tries == 1:
            await asyncio.sleep(3600)
        finished.append(got.id)

    stopping = asyncio.Event()
    consuming = asyncio.create_task(admin.consume(
        Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], (StopRequested,), handler,
        stopping=stopping, ordered=True, deadline=0.5))
    try:
        await until(lambda: finished, "the redelivered event to be handled")
        await asyncio.sleep(1.0)  # room for a wrong second delivery
    finally:
        stopping.set()
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
    assert finished == [event.id] and tries == 2


async def test_a_verdict_whose_publish_times_out_is_redelivered_and_stored_once(admin, nats_server, monkeypatch,
                                                                               bus_client):
    """The runtime's handler publishes a TaskVerdict. The first publish reaches the
    stream but its ack is lost (a timeout); every try after it times out too, until
    the bus gives up and the handler fails as transient. The exit is redelivered,
    the verdict published again under the same id: one verdict in the stream."""
    run = RUN + bus_client  # each client's run its own ids: JetStream dedupes by id
    exited = TaskExited(id=f"alice~v{run}/1/worker/0/0/exited", job=f"alice~v{run}", vc="default", attempt=1,
                        role="worker", index=0, exitCode=1, userLogTail="Traceback: boom")
    await admin.publish(exited)
    verdict_subject = subject_of(TaskVerdict(id="", job=exited.job, vc="default", attempt=1, role="worker", index=0,
                                             exitCode=1, spec=None))  # type: ignore[arg-type]
    bus = await Bus.connect(nats_server.url, name="runtime", **nats_server.login("runtime"))
    real_publish = bus.js.publish
    failures = {"left": 5}  # Bus.publish tries 5 times per call

    async def flaky_publish(subject, payload=b"", *args, **kwargs):
        if subject == verdict_subject and failures["left"] > 0:
            failures["left"] -= 1
            if failures["left"] == 4:
                await real_publish(subject, payload, *args, **kwargs)  # stored; the ack is what is lost
            raise nats.errors.TimeoutError
        return await real_publish(subject, payload, *args, **kwargs)

    monkeypatch.setattr(bus.js, "publish", flaky_publish)
    calls: list[str] = []
    ctx = ServiceContext(name="runtime", config=Config(), bus=bus)
    shell = RuntimeShell(ctx, RuleBook(baseline_rules(Config())))

    async def handler(event):
        calls.append(event.id)
        await shell.handle(event)

    stopping = asyncio.Event()
    consuming = asyncio.create_task(bus.consume(Durable.RUNTIME, [Kind.TASK_EXITED], (TaskExited,), handler,
                                                stopping=stopping))
    try:
        await until(lambda: len(calls) >= 2, "the exit to be redelivered after the failed publishes")

        async def verdicts():
            return await stream_events(admin, TaskVerdict, verdict_subject)

        for _ in range(200):
            if await verdicts():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # room for a wrong second verdict
        found = await verdicts()
    finally:
        stopping.set()
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await bus.close()
    assert calls == [exited.id, exited.id]
    assert len(found) == 1 and found[0].exitCode == 1 and found[0].cause == exited.id
