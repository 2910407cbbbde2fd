"""GET /api/v2/events over real HTTP, rest logged in to a real nats-server as `rest`.

The job state events come from the bus as the launcher publishes them (logged in
as `launcher`), so rest reads them with exactly the permissions it has in production.
A client sees its job's life, resumes after a disconnect with Last-Event-ID without
missing or repeating an event, and never sees another user's job.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession, ClientTimeout
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.messages import JobState, JobStateChanged
from libs.common.service import ServiceContext
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
OWNER, OTHER, ADMIN = f"sse{RUN}", f"sseother{RUN}", f"sseadmin{RUN}"
HEARTBEAT_SECONDS = 0.5
READ_TIMEOUT = 30.0  # generous: the machine is shared and loaded


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
async def buses(nats_server) -> AsyncIterator[dict[str, Bus]]:
    platform = await Bus.connect(nats_server.url, name="sse-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    rest = await Bus.connect(nats_server.url, name="sse-rest", **nats_server.login("rest"))
    launcher = await Bus.connect(nats_server.url, name="sse-launcher", **nats_server.login("launcher"))
    yield {"rest": rest, "launcher": launcher}
    for bus in (rest, launcher, platform):
        await bus.close()


@pytest.fixture(scope="module")
async def api(buses, tmp_path_factory):
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("sse")),
                         rest_events_heartbeat_seconds=HEARTBEAT_SECONDS)
    ctx = ServiceContext(name="rest", config=config, bus=buses["rest"])
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    tokens = {name: await auth.create_user(buses["rest"], name, admin=name == ADMIN) for name in (OWNER, OTHER, ADMIN)}
    yield server, tokens
    await server.close()


class SseReader:
    """A minimal EventSource: parses `id:`, `event:`, `data:` and comment lines."""

    def __init__(self, response):
        self.response = response
        self.comments = 0

    async def next_event(self, timeout: float = READ_TIMEOUT) -> dict:
        fields: dict = {}
        deadline = time.monotonic() + timeout
        while True:
            line = await asyncio.wait_for(self.response.content.readline(), max(0.1, deadline - time.monotonic()))
            if not line:
                raise EOFError("the server closed the event stream")
            text = line.decode().rstrip("\n")
            if text == "":
                if "data" in fields:
                    return fields
                continue
            if text.startswith(":"):
                self.comments += 1
                continue
            key, _, value = text.partition(": ")
            fields[key] = json.loads(value) if key == "data" else value

    async def quiet_for(self, seconds: float) -> list[dict]:
        """Every event that arrives within `seconds` (the stream stays open)."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got.append(await self.next_event(timeout=left))
            except TimeoutError:
                break
        return got


async def open_stream(session: ClientSession, server: TestServer, token: str | None, **headers: str):
    sent = dict(headers)
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return await session.get(server.make_url("/api/v2/events"), headers=sent)


def life(job: str, user: str, *states: JobState) -> list[JobStateChanged]:
    events, previous = [], None
    for state in states:
        events.append(JobStateChanged(id=f"{job}/1/state/{state.value}", job=job, vc="default", user=user, attempt=1,
                                      state=state, previous=previous, at=time.time(),
                                      exitCode=0 if state == JobState.SUCCEEDED else None))
        previous = state
    return events


async def test_a_client_sees_its_jobs_life_and_resumes_without_gaps_or_repeats(api, buses):
    server, tokens = api
    job, others_job = f"{OWNER}~train", f"{OTHER}~train"
    waiting, running, succeeded = life(job, OWNER, JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED)
    timeout = ClientTimeout(total=None, sock_read=None)
    async with ClientSession(timeout=timeout) as session:
        owner = await open_stream(session, server, tokens[OWNER])
        other = await open_stream(session, server, tokens[OTHER])
        admin = await open_stream(session, server, tokens[ADMIN])
        assert (owner.status, owner.headers["Content-Type"]) == (200, "text/event-stream")
        owner_reader, other_reader, admin_reader = SseReader(owner), SseReader(other), SseReader(admin)

        await buses["launcher"].publish(waiting)
        first = await owner_reader.next_event()
        assert (first["event"], first["data"]["job"], first["data"]["state"]) == ("job.state", job, "WAITING")
        owner.close()  # the client goes away after WAITING ...

        await buses["launcher"].publish(running)  # ... and misses these two
        await buses["launcher"].publish(succeeded)
        await buses["launcher"].publish(life(others_job, OTHER, JobState.WAITING)[0])
        await buses["launcher"].publish(running)  # a repeated publish (same event id): stored once

        resumed = await open_stream(session, server, tokens[OWNER], **{"Last-Event-ID": first["id"]})
        reader = SseReader(resumed)
        seen = [await reader.next_event(), await reader.next_event()]
        assert [(e["data"]["job"], e["data"]["state"], e["data"]["previous"]) for e in seen] == [
            (job, "RUNNING", "WAITING"), (job, "SUCCEEDED", "RUNNING")]
        assert seen[1]["data"]["exitCode"] == 0
        assert int(first["id"]) < int(seen[0]["id"]) < int(seen[1]["id"])
        assert await reader.quiet_for(3 * HEARTBEAT_SECONDS) == []  # no repeat, not the other user's job
        assert reader.comments >= 1  # heartbeats while idle
        resumed.close()

        seen_by_other = await other_reader.next_event()
        assert (seen_by_other["data"]["job"], seen_by_other["data"]["state"]) == (others_job, "WAITING")
        assert await other_reader.quiet_for(1.0) == []
        admin_events = [await admin_reader.next_event() for _ in range(4)]
        assert [(e["data"]["job"], e["data"]["state"]) for e in admin_events] == [
            (job, "WAITING"), (job, "RUNNING"), (job, "SUCCEEDED"), (others_job, "WAITING")]
        other.close()
        admin.close()


async def test_one_job_only_and_never_anothers(api, buses):
    server, tokens = api
    job = f"{OWNER}~solo"
    async with ClientSession(timeout=ClientTimeout(total=None, sock_read=None)) as session:
        async with session.get(server.make_url("/api/v2/events"), params={"job": job},
                               headers={"Authorization": f"Bearer {tokens[OTHER]}"}) as refused:
            assert (refused.status, (await refused.json())["code"]) == (403, "ForbiddenUserError")
        async with session.get(server.make_url("/api/v2/events")) as anonymous:
            assert (anonymous.status, (await anonymous.json())["code"]) == (401, "UnauthorizedUserError")
        async with session.get(server.make_url("/api/v2/events"), headers={
                "Authorization": f"Bearer {tokens[OWNER]}", "Last-Event-ID": "yesterday"}) as bad:
            assert (bad.status, (await bad.json())["code"]) == (400, "InvalidParametersError")

        stream = await session.get(server.make_url("/api/v2/events"), params={"job": job},
                                   headers={"Authorization": f"Bearer {tokens[OWNER]}"})
        reader = SseReader(stream)
        await buses["launcher"].publish(life(f"{OWNER}~elsewhere", OWNER, JobState.WAITING)[0])
        await buses["launcher"].publish(life(job, OWNER, JobState.WAITING)[0])
        got = await reader.next_event()
        assert (got["data"]["job"], got["data"]["state"]) == (job, "WAITING")
        assert await reader.quiet_for(1.0) == []
        stream.close()


async def test_last_event_id_zero_replays_the_kept_history(api, buses):
    server, tokens = api
    job = f"{OTHER}~history"
    for event in life(job, OTHER, JobState.WAITING, JobState.RUNNING):
        await buses["launcher"].publish(event)
    async with ClientSession(timeout=ClientTimeout(total=None, sock_read=None)) as session:
        stream = await session.get(server.make_url("/api/v2/events"), params={"job": job},
                                   headers={"Authorization": f"Bearer {tokens[OTHER]}", "Last-Event-ID": "0"})
        reader = SseReader(stream)
        states = [(await reader.next_event())["data"]["state"] for _ in range(2)]
        assert states == ["WAITING", "RUNNING"]
        stream.close()
