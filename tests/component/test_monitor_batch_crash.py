"""A cluster monitor that dies between a batch's effects and its acks, against a
real nats-server: the monitor that takes over gets the whole batch again and
repeats none of its effects (no alert announced or listed twice, no mail sent
twice) and loses none of them.

The crash is the moment the bus would ack: the first monitor's consumer is
cancelled from inside its batch handler, right after the real handler returned
(so every effect of the batch is stored and nothing is acked). A second monitor
then starts as a restarted one does, restoring from the buckets, and consumes
the same durable, which redelivers every event of the batch once its ack wait
runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from email.message import EmailMessage
from pathlib import Path

import nats.js.errors
import pytest

from libs.common import busauth
from libs.common.alerts_messages import ALERT_KEY_PREFIX
from libs.common.bus import STREAM, Bus
from libs.common.config import load_config
from libs.common.ids import EventId, JobId, UserName, VcName
from libs.common.messages import (
    EVENT_TYPES,
    Event,
    EventDeadLettered,
    JobState,
    JobStateChanged,
    JobSubmitted,
    TaskExited,
)
from libs.common.protocol.model import JobSpec
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.monitor.alerts.core import fingerprint_key
from services.monitor.service import EventIntake, start_cluster

RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 60.0  # the redelivery alone waits out the bus's ack wait
ADMIN = "ops@example.com"
OWNER = "alice@example.com"


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """Its own server: the monitor restores from whole buckets and the durable "monitor"."""
    return own_nats_server


class RecordingMailer:
    """Every mail the monitor hands to its mail server, as (to, subject)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def send(self, message: EmailMessage) -> bool:
        self.sent.append((str(message["To"]), str(message["Subject"])))
        return True


def batch_of_events() -> tuple[list[Event], str, str]:
    """A job asking for status mail that succeeds, one plain task exit, and an
    event another consumer dead-lettered (the monitor alerts the admins)."""
    job = JobId(f"alice~crash{RUN}")
    vc = VcName("default")
    spec = JobSpec(name=f"crash{RUN}", user="alice", virtualCluster=vc, notifyOnStateChange=True,
                   notifyStates=["succeeded"], notifyEmails=[OWNER])
    dead = EventDeadLettered(
        id=EventId(f"{job}/1/main/0/0/exited/dead-lettered/launcher"), job=job, at=time.time(),
        consumer="launcher", eventId=f"{job}/1/main/0/0/exited", eventKind=Kind.TASK_EXITED.value,
        subject=f"pai.v1.task.exited.default.alice.crash{RUN}", deliveries=5, reason="ValueError: boom",
    )
    events: list[Event] = [
        JobSubmitted(id=EventId(f"{job}/submitted"), job=job, at=time.time(), spec=spec),
        TaskExited(id=EventId(f"{job}/1/main/0/0/exited"), job=job, vc=vc, attempt=1, role="main", index=0,
                   exitCode=0, at=time.time()),
        JobStateChanged(id=EventId(f"{job}/1/state/SUCCEEDED"), job=job, vc=vc, user=UserName("alice"), attempt=1,
                        state=JobState.SUCCEEDED, previous=JobState.RUNNING, exitCode=0, at=time.time()),
        dead,
    ]
    return events, job, f"{dead.id}/alert"


async def monitor_context(nats_server, tmp_path: Path, name: str) -> ServiceContext:
    bus = await Bus.connect(nats_server.url, name=name, **nats_server.login("monitor"))
    config = load_config(env={}, data_dir=str(tmp_path / name), admin_emails=ADMIN, alert_probe_urls="-",
                         alert_evaluate_seconds=3600.0)
    return ServiceContext(name="monitor", config=config, bus=bus)


async def stop(ctx: ServiceContext, *tasks: asyncio.Task) -> None:
    ctx.stopping.set()
    for task in [*tasks, *ctx.tasks]:
        task.cancel()
    for task in [*tasks, *ctx.tasks]:
        with contextlib.suppress(BaseException):
            await task
    await ctx.bus.close()


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def consume(ctx: ServiceContext, handler) -> asyncio.Task:
    return asyncio.ensure_future(ctx.bus.consume_batches(
        Durable.MONITOR, list(Kind), list(EVENT_TYPES.values()), handler, stopping=ctx.stopping))


async def test_a_crash_between_a_batchs_effects_and_its_acks_repeats_and_loses_nothing(nats_server, tmp_path):
    events, job, alert_id = batch_of_events()
    platform = await Bus.connect(nats_server.url, name="test-platform", **nats_server.login(busauth.PLATFORM))
    mailer = RecordingMailer()
    try:
        # Waiting before the monitor starts, so its first fetch takes them as one batch.
        await platform.publish_many(events)
        last_seq = (await platform.js.stream_info(STREAM)).state.last_seq

        async def consumer_state() -> tuple[int, int]:
            info = await platform.js.consumer_info(STREAM, Durable.MONITOR.value)
            return info.ack_floor.stream_seq, info.num_ack_pending

        # --- the first monitor: handles the batch, dies before acking it ---
        first = await monitor_context(nats_server, tmp_path, "first")
        intake: EventIntake = await start_cluster(first, mailer=mailer)
        batches: list[list[str]] = []

        async def handle_then_die(batch: list[Event]) -> None:
            await intake.handle(batch)
            batches.append([e.id for e in batch])
            consuming.cancel()  # the bus acks after the handler returns: it never gets there

        consuming = consume(first, handle_then_die)
        await until(lambda: _true(batches), "the first monitor to handle a batch")
        assert batches[0] == [e.id for e in events], "the events did not come as one batch"
        await until(lambda: _true(len(mailer.sent) >= 2), "the first monitor's mail")
        await stop(first, consuming)
        floor, pending = await consumer_state()
        assert floor < last_seq and pending == len(events), "the crashed batch was acked"
        mailed_before = list(mailer.sent)
        alert_before = await _stored_alert(platform, alert_id)
        assert alert_before is not None, "the dead-letter alert was not listed before the crash"

        # --- the second monitor: restores, gets the batch again, consumes it all ---
        second = await monitor_context(nats_server, tmp_path, "second")
        takeover = await start_cluster(second, mailer=mailer)
        consuming = consume(second, takeover.handle)
        try:
            async def all_acked() -> bool:
                floor, pending = await consumer_state()
                return floor >= last_seq and pending == 0

            await until(all_acked, "the second monitor to ack the redelivered batch")
            await asyncio.sleep(1.0)  # time for any mail it (wrongly) queued to go out
            # Nothing lost: the second monitor knows the job's end.
            assert takeover.core.state_of(job) is JobState.SUCCEEDED
            assert takeover.alerts.core.jobs[job].state is JobState.SUCCEEDED
        finally:
            await stop(second, consuming)

        # Nothing repeated: the same two mails, once each.
        assert sorted(mailer.sent) == sorted(mailed_before)
        assert sorted(to for to, _ in mailer.sent) == sorted([OWNER, ADMIN])
        # The dead-letter alert: announced once, listed once, as the first monitor listed it.
        firing = await platform.js.stream_info(STREAM, subjects_filter="pai.v1.alert.firing.>")
        assert sum((firing.state.subjects or {}).values()) == 1
        assert await _stored_alert(platform, alert_id) == alert_before
    finally:
        await platform.close()


async def _true(value) -> bool:
    return bool(value)


async def _stored_alert(bus: Bus, fingerprint: str) -> bytes | None:
    kv = await bus.kv(Bucket.ALERTS)
    try:
        entry = await kv.get(ALERT_KEY_PREFIX + fingerprint_key(fingerprint))
    except nats.js.errors.KeyNotFoundError:
        return None
    return entry.value
