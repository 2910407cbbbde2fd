"""rest's event hub receives job-state events only while an event stream is open."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from libs.common.subjects import Kind, kind_filter
from services.rest.events import EventHub


class FakeSubscription:
    def __init__(self, nc: FakeConnection):
        self.nc = nc

    async def unsubscribe(self) -> None:
        self.nc.open -= 1


class FakeConnection:
    def __init__(self):
        self.open = 0
        self.subjects: list[str] = []

    async def subscribe(self, subject: str, cb=None) -> FakeSubscription:
        self.open += 1
        self.subjects.append(subject)
        return FakeSubscription(self)


async def test_subscribed_once_while_streams_are_open_and_not_before_or_after():
    nc = FakeConnection()
    hub = EventHub(SimpleNamespace(nc=nc))
    assert nc.open == 0  # nobody watching: no job-state event reaches rest
    async with hub.reading():
        async with hub.reading():
            assert nc.open == 1
        assert nc.open == 1  # the first stream still reads
        woken = hub.next_publication()
        await hub._on_event(None)
        assert woken.is_set()
    assert nc.open == 0
    async with hub.reading():  # a later stream subscribes again
        assert nc.open == 1
    assert nc.open == 0
    assert nc.subjects == [kind_filter(Kind.JOB_STATE)] * 2


async def test_a_stream_that_fails_still_lets_go_of_the_subscription():
    nc = FakeConnection()
    hub = EventHub(SimpleNamespace(nc=nc))
    try:
        async with hub.reading():
            raise ConnectionResetError
    except ConnectionResetError:
        pass
    assert nc.open == 0
    await asyncio.gather(*(_read_briefly(hub) for _ in range(3)))
    assert nc.open == 0 and len(nc.subjects) == 2


async def _read_briefly(hub: EventHub) -> None:
    async with hub.reading():
        await asyncio.sleep(0)
