"""The runtime's shell handling task exits in batches, against a real nats-server.

Every failed exit of a batch gets its verdict, an exit 0 none (the launcher
settles such a task without one). A crash between the batch's verdicts being
stored and its acks, and a batch whose publish fails half way, both hand the
same exits again: still exactly one verdict per failed exit in the stream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import msgspec
import pytest

from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.messages import TaskExited
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Durable, Kind
from services.runtime.core import RuleBook
from services.runtime.service import RuntimeShell, baseline_rules
from tests.conftest import platform_bus, publish_half_then_fail_once

WAIT_SECONDS = 60.0  # generous: the machine running the tests may be loaded; a crashed batch waits out the ack wait
# (exit code, user log tail, the phrase the default rules give it; None: no verdict)
EXITS = [
    (0, "done\n", None),
    (1, "Traceback (most recent call last):\nboom\n", "PAIRuntimeUnknownFailed"),
    (137, "", "ContainerSigKillReceived"),
    (0, "epoch 3 done\n", None),
    (2, "usage: train.py [-h]\n", "PAIRuntimeUnknownFailed"),
    (137, "killed\n", "ContainerSigKillReceived"),
    (0, "", None),
    (1, "oops\n", "PAIRuntimeUnknownFailed"),
]


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """These tests purge the stream and delete the runtime's durable: a server of this module's own."""
    return own_nats_server


@pytest.fixture
async def admin(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=[Durable.RUNTIME]) as bus:
        yield bus


def exits(run: str) -> list[TaskExited]:
    return [
        TaskExited(id=f"alice~exit{run}n{n}/1/main/0/0/exited", job=f"alice~exit{run}n{n}", vc="default", attempt=1,
                   role="main", index=0, exitCode=code, userLogTail=log)
        for n, (code, log, _) in enumerate(EXITS)
    ]


async def until(check, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"waited {WAIT_SECONDS:g}s for {what}")


class Runtime:
    """One runtime shell consuming as the service does (rules: the defaults)."""

    def __init__(self, bus: Bus):
        self.bus = bus
        self.ctx = ServiceContext(name="runtime", config=Config(), bus=bus)
        self.shell = RuntimeShell(self.ctx, RuleBook(baseline_rules(Config())))
        self.batches: list[list[str]] = []
        self.consuming: asyncio.Task | None = None

    @classmethod
    async def connect(cls, nats_server) -> Runtime:
        return cls(await Bus.connect(nats_server.url, name="runtime", **nats_server.login("runtime")))

    def consume(self, handler=None) -> None:
        async def record(events) -> None:
            self.batches.append([event.id for event in events])
            await self.shell.handle_batch(events)

        self.consuming = asyncio.create_task(self.bus.consume_batches(
            Durable.RUNTIME, [Kind.TASK_EXITED], (TaskExited,), handler or record, stopping=self.ctx.stopping))

    async def stop(self) -> None:
        self.ctx.stopping.set()
        if self.consuming is not None:
            self.consuming.cancel()
            await asyncio.gather(self.consuming, return_exceptions=True)
        await self.bus.close()


async def verdicts_in_stream(admin: Bus) -> list[dict]:
    info = await admin.js.stream_info(STREAM)
    events = [msgspec.json.decode((await admin.js.get_msg(STREAM, seq)).data)
              for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    return [event for event in events if event["kind"] == Kind.TASK_VERDICT.value]


async def unacked(admin: Bus) -> int:
    return (await admin.js.consumer_info(STREAM, Durable.RUNTIME.value)).num_ack_pending


def expect_one_verdict_per_failed_exit(verdicts: list[dict], sent: list[TaskExited]) -> None:
    assert Counter(v["cause"] for v in verdicts) == Counter(
        {event.id: 1 for event in sent if event.exitCode != 0}), "one verdict per failed exit, none for exit 0"
    phrases = {v["cause"]: v["spec"]["phrase"] for v in verdicts}
    assert phrases == {event.id: phrase for event, (_, _, phrase) in zip(sent, EXITS, strict=True) if phrase is not None}


async def test_a_crash_after_a_batchs_verdicts_before_its_acks_gives_each_verdict_once(admin, nats_server):
    sent = exits(uuid.uuid4().hex[:6])
    await admin.publish_many(sent)
    first = await Runtime.connect(nats_server)
    stored = asyncio.Event()

    async def handle_then_die(events) -> None:
        first.batches.append([event.id for event in events])
        await first.shell.handle_batch(events)
        stored.set()
        await asyncio.sleep(3600)  # killed here: verdicts stored, nothing acked

    first.consume(handle_then_die)
    try:
        await asyncio.wait_for(stored.wait(), WAIT_SECONDS)
    finally:
        await first.stop()
    assert first.batches == [[event.id for event in sent]], "every waiting exit in one batch"
    assert await unacked(admin) == len(sent)
    expect_one_verdict_per_failed_exit(await verdicts_in_stream(admin), sent)

    second = await Runtime.connect(nats_server)
    second.consume()
    try:
        # The exits come back once the ack wait ran out, and are handled again.
        async def all_again() -> bool:
            return sum(map(len, second.batches)) >= len(sent) and await unacked(admin) == 0

        await until(all_again, "the crashed batch to be handled again and acked")
    finally:
        await second.stop()
    assert sorted(sum(second.batches, [])) == sorted(event.id for event in sent)
    expect_one_verdict_per_failed_exit(await verdicts_in_stream(admin), sent)


async def test_a_batch_whose_publish_fails_is_handled_again_one_by_one_giving_each_verdict_once(admin, nats_server):
    sent = exits(uuid.uuid4().hex[:6])
    await admin.publish_many(sent)
    runtime = await Runtime.connect(nats_server)
    failed = publish_half_then_fail_once(runtime.bus)
    runtime.consume()
    try:
        async def all_again() -> bool:
            return sum(map(len, runtime.batches)) >= 2 * len(sent) and await unacked(admin) == 0

        await until(all_again, "the batch, then each of its exits again")
    finally:
        await runtime.stop()
    assert failed == [sum(1 for event in sent if event.exitCode != 0)]  # verdicts of failed exits only
    assert [len(batch) for batch in runtime.batches] == [len(sent)] + [1] * len(sent)
    expect_one_verdict_per_failed_exit(await verdicts_in_stream(admin), sent)
