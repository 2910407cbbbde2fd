"""rest's event hub: one consumer of job-state events per rest process, held only
while an event stream is open, delivering each event's body and sequence (no
stored read per event), and replaced from the hub's cursor whenever a delivery
went missing, so no stream misses an event or sees one twice.

Against an in-memory stand-in for the NATS connection and the event stream, which
delivers as nats-server delivers to an ordered push consumer: reply subjects
`$JS.ACK...` carrying the stream and consumer sequences, heartbeats, flow control.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats.errors
import pytest

from libs.common.messages import JobState, JobStateChanged, encode, subject_of
from libs.common.subjects import STREAM, Kind, kind_filter
from services.rest import events
from services.rest.events import EventHub


class FakeSubscription:
    def __init__(self, nc: FakeConnection, subject: str, handler):
        self.nc, self.subject, self.handler = nc, subject, handler

    async def unsubscribe(self) -> None:
        self.nc.open.remove(self)


class FakeConnection:
    def __init__(self):
        self.open: list[FakeSubscription] = []
        self.published: list[str] = []
        self._inboxes = 0

    def new_inbox(self) -> str:
        self._inboxes += 1
        return f"_INBOX.rest.{self._inboxes}"

    async def subscribe(self, nc, subject: str, handler) -> FakeSubscription:
        assert nc is self
        subscription = FakeSubscription(self, subject, handler)
        self.open.append(subscription)
        return subscription

    async def publish(self, subject: str) -> None:
        self.published.append(subject)


class FakeStream:
    """The event stream: stored messages by sequence, and the consumers made on it."""

    def __init__(self, nc: FakeConnection):
        self.nc = nc
        self.messages: list[SimpleNamespace] = []
        self.consumers: list = []  # the configs, in order made
        self.refuse = 0  # consumer creates still to refuse (NATS away)
        self.made = asyncio.Event()

    def store(self, event: JobStateChanged) -> int:
        seq = len(self.messages) + 1
        self.messages.append(SimpleNamespace(seq=seq, subject=subject_of(event), data=encode(event)))
        return seq

    async def stream_info(self, name: str):
        assert name == STREAM
        return SimpleNamespace(state=SimpleNamespace(first_seq=1, last_seq=len(self.messages)))

    async def add_consumer(self, stream: str, config):
        assert stream == STREAM
        if self.refuse:
            self.refuse -= 1
            raise nats.errors.NoRespondersError
        self.consumers.append(config)
        self.made.set()
        return SimpleNamespace(name=config.name)

    def deliver(self, config, seq: int, consumer_seq: int) -> None:
        """Message `seq` as `config`'s consumer sends it, the `consumer_seq`th it sends."""
        msg = self.messages[seq - 1]
        reply = f"$JS.ACK.{STREAM}.{config.name}.1.{seq}.{consumer_seq}.1700000000000000000.0"
        self._handler(config)(msg.subject.encode(), reply.encode(), msg.data, None)

    def heartbeat(self, config, last_consumer: int) -> None:
        headers = f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {last_consumer}\r\n\r\n".encode()
        self._handler(config)(config.deliver_subject.encode(), b"", b"", headers)

    def flow_control(self, config, reply: str) -> None:
        self._handler(config)(config.deliver_subject.encode(), reply.encode(), b"",
                              b"NATS/1.0 100 FlowControl Request\r\n\r\n")

    def _handler(self, config):
        # A consumer whose subscription is gone delivers to nobody.
        for subscription in self.nc.open:
            if subscription.subject == config.deliver_subject:
                return subscription.handler
        return lambda *message: None

    async def next_consumer(self, count: int):
        while len(self.consumers) < count:
            self.made.clear()
            await asyncio.wait_for(self.made.wait(), 5)
        return self.consumers[count - 1]


def _hub() -> tuple[EventHub, FakeConnection, FakeStream]:
    nc = FakeConnection()
    js = FakeStream(nc)
    return EventHub(SimpleNamespace(nc=nc, js=js), subscribe=nc.subscribe), nc, js


def _running(job: str) -> JobStateChanged:
    user = job.split("~")[0]
    return JobStateChanged(id=f"{job}/1/running", job=job, at=1.0, vc="vc1", user=user, attempt=1,
                           state=JobState.RUNNING, previous=JobState.WAITING)


def _queued(watcher) -> list[int]:
    return [seq for seq, _ in watcher.queue]


async def test_one_consumer_while_streams_are_open_and_not_before_or_after():
    hub, nc, js = _hub()
    js.store(_running("alice~old"))  # before anyone watched: not the hub's to hand out
    assert nc.open == []  # nobody watching: no job-state event reaches rest
    async with hub.watching("alice", None) as first:
        async with hub.watching(None, None) as admin:
            assert len(nc.open) == 1 and len(js.consumers) == 1  # two streams, one consumer
            assert first.handover == admin.handover == 2
        config = js.consumers[0]
        assert (config.filter_subject, config.opt_start_seq, config.deliver_subject) == (
            kind_filter(Kind.JOB_STATE), 2, nc.open[0].subject)
        assert config.flow_control and config.idle_heartbeat and config.mem_storage
        js.deliver(config, js.store(_running("alice~new")), 1)  # the body comes with the delivery
        assert _queued(first) == [2]
        assert b'"job": "alice~new"' in first.queue[0][1]
    assert nc.open == [] and hub._reader is None  # the last stream gone: no subscription, no reader
    async with hub.watching("bob", "one"):  # a later stream follows anew, from the stream's end
        assert len(nc.open) == 1 and js.consumers[1].opt_start_seq == 3
    assert nc.open == [] and len(js.consumers) == 2


async def test_a_delivery_that_went_missing_is_delivered_again_by_a_new_consumer_and_none_twice():
    hub, _, js = _hub()
    async with hub.watching("alice", None) as watcher:
        seqs = [js.store(_running(f"alice~job{n}")) for n in range(4)]
        first = js.consumers[0]
        js.deliver(first, seqs[0], 1)
        js.deliver(first, seqs[2], 3)  # the second delivery was lost on the way
        second = await js.next_consumer(2)
        assert second.opt_start_seq == seqs[0] + 1  # from the first event not handed out
        js.deliver(first, seqs[3], 4)  # the old consumer's late deliveries are not taken
        for n, seq in enumerate(seqs[1:], start=1):
            js.deliver(second, seq, n)
        assert _queued(watcher) == seqs


async def test_a_heartbeat_saying_more_was_sent_than_arrived_means_a_new_consumer():
    hub, _, js = _hub()
    async with hub.watching("bob", None) as watcher:
        seqs = [js.store(_running(f"bob~job{n}")) for n in range(2)]
        first = js.consumers[0]
        js.deliver(first, seqs[0], 1)
        js.heartbeat(first, 1)  # all that was sent arrived
        await asyncio.sleep(0.05)
        assert len(js.consumers) == 1
        js.heartbeat(first, 2)  # the last delivery never came
        second = await js.next_consumer(2)
        assert second.opt_start_seq == seqs[1]
        js.deliver(second, seqs[1], 1)
        assert _queued(watcher) == seqs


async def test_a_silent_consumer_is_replaced_from_the_cursor(monkeypatch):
    # NATS restarted and the consumer (in memory) is gone: no deliveries, no heartbeats.
    monkeypatch.setattr(events, "HEARTBEAT_SECONDS", 0.02)
    hub, _, js = _hub()
    async with hub.watching(None, None) as admin:
        first = js.consumers[0]
        js.deliver(first, js.store(_running("carol~a")), 1)
        later = js.store(_running("carol~b"))  # stored while the consumer was gone
        second = await js.next_consumer(2)
        assert second.opt_start_seq == later
        js.deliver(second, later, 1)
        assert _queued(admin) == [1, 2]


async def test_flow_control_is_answered_and_a_consumer_not_made_is_made_again(monkeypatch):
    monkeypatch.setattr(events, "RETRY_SECONDS", 0.01)
    hub, nc, js = _hub()
    js.refuse = 2  # NATS away when the first stream opens: the stream opens all the same
    async with hub.watching("dave", None) as watcher:
        config = await js.next_consumer(1)
        assert config.opt_start_seq == 1
        js.deliver(config, js.store(_running("dave~x")), 1)
        js.flow_control(config, "$JS.FC.PAI_EVENTS.abc.1")
        for _ in range(100):
            if nc.published:
                break
            await asyncio.sleep(0.01)
        assert nc.published == ["$JS.FC.PAI_EVENTS.abc.1"]
        assert _queued(watcher) == [1]


async def test_a_stream_that_fails_still_lets_go_of_the_consumer():
    hub, nc, js = _hub()
    with pytest.raises(ConnectionResetError):
        async with hub.watching("alice", None):
            raise ConnectionResetError
    assert nc.open == [] and hub._reader is None
    await asyncio.gather(*(_read_briefly(hub, user) for user in ("alice", "bob", None)))
    assert nc.open == [] and hub._reader is None and len(js.consumers) == 2
    assert not hub._admins and not hub._by_user and not hub._by_job


async def test_a_stream_whose_start_fails_leaves_no_subscription():
    hub, nc, js = _hub()

    async def unavailable(name: str):
        raise ConnectionRefusedError

    js.stream_info = unavailable
    with pytest.raises(ConnectionRefusedError):
        async with hub.watching("alice", None):
            raise AssertionError("the stream must not start")
    assert nc.open == [] and hub._reader is None and js.consumers == []


async def _read_briefly(hub: EventHub, user: str | None) -> None:
    async with hub.watching(user, None):
        await asyncio.sleep(0)
