"""GET /api/v2/events with many streams open at once: rest reads each job state event
once and hands it to every stream that may see it (services/rest/events.py).

Real HTTP, rest logged in to a real nats-server as `rest`, events published as the
launcher publishes them. Each of 200 streams, of several users, admins and single-job
watchers, gets exactly the events it may see, in order, none missing, none twice;
streams that reconnect with Last-Event-ID while events keep coming resume without a
gap or a repeat; a stream that falls behind is told to reconnect and loses nothing.
Live events reach the streams with no stored read (the hub's consumer delivers their
bodies); after nats-server is killed and started again, every stream gets every
later event once, in order.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession, ClientTimeout, TCPConnector
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.messages import JobState, JobStateChanged
from libs.common.service import ServiceContext
from services.rest import auth, events
from services.rest.app import create_app
from tests.component.test_sse import SseReader, life, open_stream
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
USERS = [f"fan{n}{RUN}" for n in range(4)]
ADMIN = f"fanadmin{RUN}"
PER_USER, ADMINS, PER_JOB = 45, 10, 10  # 200 streams
STATES = (JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED)


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
async def buses(nats_server) -> AsyncIterator[dict[str, Bus]]:
    platform = await Bus.connect(nats_server.url, name="fanout-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    rest = await Bus.connect(nats_server.url, name="fanout-rest", **nats_server.login("rest"))
    launcher = await Bus.connect(nats_server.url, name="fanout-launcher", **nats_server.login("launcher"))
    yield {"rest": rest, "launcher": launcher}
    for bus in (rest, launcher, platform):
        await bus.close()


@pytest.fixture(scope="module")
async def api(buses, tmp_path_factory):
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("fanout")),
                         rest_events_heartbeat_seconds=1.0)
    ctx = ServiceContext(name="rest", config=config, bus=buses["rest"])
    app = await create_app(ctx)
    server = TestServer(app)
    await server.start_server()
    ctx.set_ready()
    tokens = {name: await auth.create_user(buses["rest"], name, admin=name == ADMIN) for name in (*USERS, ADMIN)}
    yield server, tokens, app
    await server.close()


def job_events(jobs: int) -> list[JobStateChanged]:
    """`jobs` jobs spread over the users, each through its three states, interleaved."""
    lives = [life(f"{USERS[n % len(USERS)]}~job{n}", USERS[n % len(USERS)], *STATES) for n in range(jobs)]
    return [lives[n][step] for step in range(len(STATES)) for n in range(jobs)]


def matches(scope: tuple[str | None, str | None], event: JobStateChanged) -> bool:
    user, job = scope
    return (user is None or event.user == user) and (job is None or event.job == job)


def seen(got: list[dict]) -> list[tuple[str, str]]:
    return [(e["data"]["job"], e["data"]["state"]) for e in got]


async def read_n(reader: SseReader, count: int) -> list[dict]:
    return [await reader.next_event() for _ in range(count)]


def count_stored_reads(bus: Bus) -> list[int]:
    """The sequences rest reads from the stream by STREAM.MSG.GET from now on."""
    reads: list[int] = []
    read = bus.js.get_msg

    async def counted(*args, **kwargs):
        reads.append(kwargs.get("seq", 0))
        return await read(*args, **kwargs)

    bus.js.get_msg = counted
    return reads


async def test_every_stream_gets_exactly_its_events_in_order_and_resumes_without_gaps(api, buses):
    server, tokens, _ = api
    single_job = f"{USERS[0]}~job0"
    scopes: list[tuple[str | None, str | None]] = (
        [(user, None) for user in USERS for _ in range(PER_USER)] + [(None, None)] * ADMINS + [(USERS[0], single_job)] * PER_JOB)
    published = job_events(12)  # 36 events
    first, second = published[:18], published[18:]
    async with ClientSession(timeout=ClientTimeout(total=None, sock_read=None),
                             connector=TCPConnector(limit=0)) as session:

        async def open_scope(scope, **headers):
            user, job = scope
            token = tokens[ADMIN if user is None else user]
            if job is None:
                return await open_stream(session, server, token, **headers)
            return await session.get(server.make_url("/api/v2/events"), params={"job": job},
                                     headers={"Authorization": f"Bearer {token}", **headers})

        streams = await asyncio.gather(*(open_scope(scope) for scope in scopes))
        assert {s.status for s in streams} == {200}
        readers = [SseReader(s) for s in streams]
        stored_reads = count_stored_reads(buses["rest"])
        for event in first:
            await buses["launcher"].publish(event)
        expected_first = [[e for e in first if matches(scope, e)] for scope in scopes]
        got_first = await asyncio.gather(*(read_n(r, len(want)) for r, want in zip(readers, expected_first, strict=True)))
        assert stored_reads == []  # live events come with their bodies: none read back from the stream
        del buses["rest"].js.get_msg
        for scope, got, want in zip(scopes, got_first, expected_first, strict=True):
            assert seen(got) == [(e.job, e.state.value) for e in want], scope
            ids = [int(e["id"]) for e in got]
            assert ids == sorted(set(ids)), scope  # in stream order, none twice

        # A quarter of the streams go away and come back with Last-Event-ID while the
        # second half is being published: what they missed comes from the stream, the
        # rest from the hand-out, each event once.
        leaving = set(range(0, len(scopes), 4))
        for n in leaving:
            streams[n].close()

        async def publish_second() -> None:
            for event in second:
                await buses["launcher"].publish(event)
                await asyncio.sleep(0.01)

        async def come_back(n: int):
            await asyncio.sleep(0.01 * (n % 20))  # spread over the publishing
            return await open_scope(scopes[n], **{"Last-Event-ID": got_first[n][-1]["id"]})

        publishing = asyncio.create_task(publish_second())
        back = await asyncio.gather(*(come_back(n) for n in sorted(leaving)))
        await publishing
        for n, stream in zip(sorted(leaving), back, strict=True):
            streams[n], readers[n] = stream, SseReader(stream)
        expected_second = [[e for e in second if matches(scope, e)] for scope in scopes]
        got_second = await asyncio.gather(*(read_n(r, len(want)) for r, want in zip(readers, expected_second, strict=True)))
        for n, (got, want) in enumerate(zip(got_second, expected_second, strict=True)):
            assert seen(got) == [(e.job, e.state.value) for e in want], (n, scopes[n])
            ids = [int(e["id"]) for e in got_first[n] + got]
            assert ids == sorted(set(ids)), (n, scopes[n])
        quiet = await asyncio.gather(*(r.quiet_for(1.5) for r in readers[::10]))
        assert quiet == [[]] * len(quiet)  # nothing more, nothing twice
        for stream in streams:
            stream.close()


async def test_a_stream_that_falls_behind_is_told_to_reconnect_and_loses_nothing(api, buses):
    server, tokens, app = api
    hub = app[events.HUB]
    user = USERS[1]
    job_life = life(f"{user}~slow", user, *STATES)
    async with ClientSession(timeout=ClientTimeout(total=None, sock_read=None)) as session:
        hub.queue_limit = 0  # this stream's queue is full at the first event it is handed
        try:
            stream = await open_stream(session, server, tokens[user])
        finally:
            hub.queue_limit = events.STREAM_QUEUE_EVENTS
        reader = SseReader(stream)
        await buses["launcher"].publish(job_life[0])
        told = await reader.next_event()
        assert (told["event"], told["id"]) == ("reconnect", str(told["data"]["lastEventId"]))
        with pytest.raises(EOFError):  # and the stream ends
            await reader.next_event(timeout=5.0)
        for event in job_life[1:]:
            await buses["launcher"].publish(event)
        resumed = SseReader(await open_stream(session, server, tokens[user],
                                              **{"Last-Event-ID": str(told["data"]["lastEventId"])}))
        got = await read_n(resumed, 3)
        assert seen(got) == [(f"{user}~slow", s.value) for s in STATES]
        assert await resumed.quiet_for(1.0) == []
        resumed.response.close()


async def test_after_nats_is_killed_and_back_every_stream_gets_every_later_event_once(api, buses, nats_server):
    # Last in this module: the server restarts under the module's connections.
    server, tokens, _ = api
    user = USERS[2]
    jobs = [f"{user}~restart{n}" for n in range(2)]
    lives = [life(job, user, *STATES) for job in jobs]
    scopes: list[tuple[str | None, str | None]] = [(user, None), (None, None), (user, jobs[1])]
    async with ClientSession(timeout=ClientTimeout(total=None, sock_read=None)) as session:
        streams = []
        for scope in scopes:
            token = tokens[ADMIN if scope[0] is None else scope[0]]
            params = {"job": scope[1]} if scope[1] else {}
            streams.append(await session.get(server.make_url("/api/v2/events"), params=params,
                                             headers={"Authorization": f"Bearer {token}"}))
        readers = [SseReader(s) for s in streams]
        before = [life_[0] for life_ in lives]
        after = [life_[step] for step in (1, 2) for life_ in lives]
        for event in before:
            await buses["launcher"].publish(event)
        for scope, reader in zip(scopes, readers, strict=True):
            want = [e for e in before if matches(scope, e)]
            assert seen(await read_n(reader, len(want))) == [(e.job, e.state.value) for e in want]

        nats_server.stop(kill=True)  # the hub's consumer (in memory) goes with it
        nats_server.start()
        for event in after:
            await publish_when_back(buses["launcher"], event)
        for scope, reader in zip(scopes, readers, strict=True):
            want = [e for e in after if matches(scope, e)]
            got = await read_n(reader, len(want))
            assert seen(got) == [(e.job, e.state.value) for e in want], scope
            assert [int(e["id"]) for e in got] == sorted({int(e["id"]) for e in got}), scope
        quiet = await asyncio.gather(*(r.quiet_for(1.5) for r in readers))
        assert quiet == [[]] * len(readers)  # nothing twice
        for stream in streams:
            stream.close()


async def publish_when_back(bus: Bus, event: JobStateChanged) -> None:
    """Publish once NATS answers again (the event's id makes a repeat a no-op)."""
    for _ in range(300):
        try:
            await bus.publish(event)
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise AssertionError("NATS did not come back within 30 s")
