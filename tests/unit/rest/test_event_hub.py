"""rest's event hub receives job-state events only while an event stream is open.

One hub per rest process: its subscription (which wakes its one reader) stands while
at least one stream watches, not before and not after, and a stream that fails still
lets go of it. Against an in-memory stand-in for the NATS connection and stream.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats.js.errors

from libs.common.messages import JobState, JobStateChanged, encode, subject_of
from libs.common.subjects import STREAM, Kind, kind_filter
from services.rest.events import EventHub


class FakeSubscription:
    def __init__(self, nc: FakeConnection, cb):
        self.nc, self.cb = nc, cb

    async def unsubscribe(self) -> None:
        self.nc.open.remove(self)


class FakeConnection:
    def __init__(self):
        self.open: list[FakeSubscription] = []
        self.subjects: list[str] = []

    async def subscribe(self, subject: str, cb=None) -> FakeSubscription:
        subscription = FakeSubscription(self, cb)
        self.open.append(subscription)
        self.subjects.append(subject)
        return subscription


class FakeStream:
    """The event stream: stored messages by sequence, read as the hub reads them."""

    def __init__(self):
        self.messages: list[SimpleNamespace] = []

    def store(self, event: JobStateChanged) -> None:
        seq = len(self.messages) + 1
        self.messages.append(SimpleNamespace(seq=seq, subject=subject_of(event), data=encode(event)))

    async def stream_info(self, name: str):
        assert name == STREAM
        return SimpleNamespace(state=SimpleNamespace(first_seq=1, last_seq=len(self.messages)))

    async def get_msg(self, name: str, *, seq: int, subject: str, next: bool):
        prefix = subject.removesuffix(">")
        for msg in self.messages[seq - 1:]:
            if msg.subject.startswith(prefix):
                return msg
        raise nats.js.errors.NotFoundError


def _hub() -> tuple[EventHub, FakeConnection, FakeStream]:
    nc, js = FakeConnection(), FakeStream()
    return EventHub(SimpleNamespace(nc=nc, js=js)), nc, js


def _running(job: str) -> JobStateChanged:
    user = job.split("~")[0]
    return JobStateChanged(id=f"{job}/1/running", job=job, at=1.0, vc="vc1", user=user, attempt=1,
                           state=JobState.RUNNING, previous=JobState.WAITING)


async def test_subscribed_once_while_streams_are_open_and_not_before_or_after():
    hub, nc, js = _hub()
    js.store(_running("alice~old"))  # before anyone watched: not the hub's to hand out
    assert nc.open == []  # nobody watching: no job-state event reaches rest
    async with hub.watching("alice", None) as first:
        async with hub.watching(None, None) as admin:
            assert len(nc.open) == 1  # two streams, one subscription
            assert first.handover == admin.handover == 2
        assert len(nc.open) == 1  # the first stream still reads
        js.store(_running("alice~new"))
        await nc.open[0].cb(None)  # the live message wakes the hub's reader
        await asyncio.wait_for(first.ready.wait(), 5)
        assert [seq for seq, _ in first.queue] == [2]
        assert b'"job": "alice~new"' in first.queue[0][1]
    assert nc.open == [] and hub._reader is None  # the last stream gone: no subscription, no reader
    async with hub.watching("bob", "one"):  # a later stream subscribes again
        assert len(nc.open) == 1
    assert nc.open == []
    assert nc.subjects == [kind_filter(Kind.JOB_STATE)] * 2


async def test_a_stream_that_fails_still_lets_go_of_the_subscription():
    hub, nc, _ = _hub()
    try:
        async with hub.watching("alice", None):
            raise ConnectionResetError
    except ConnectionResetError:
        pass
    assert nc.open == [] and hub._reader is None
    await asyncio.gather(*(_read_briefly(hub, user) for user in ("alice", "bob", None)))
    assert nc.open == [] and hub._reader is None and len(nc.subjects) == 2
    assert not hub._admins and not hub._by_user and not hub._by_job


async def test_a_stream_whose_start_fails_leaves_no_subscription():
    hub, nc, js = _hub()

    async def unavailable(name: str):
        raise ConnectionRefusedError

    js.stream_info = unavailable
    try:
        async with hub.watching("alice", None):
            raise AssertionError("the stream must not start")
    except ConnectionRefusedError:
        pass
    assert nc.open == [] and hub._reader is None and len(nc.subjects) == 1


async def _read_briefly(hub: EventHub, user: str | None) -> None:
    async with hub.watching(user, None):
        await asyncio.sleep(0)
