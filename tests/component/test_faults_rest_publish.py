"""rest's intake when the publish of JobSubmitted times out (it may or may not be
stored): the job is recorded, so the caller gets 202 with a warning saying the
scheduler is told later; rest's own sweep publishes the record a few seconds later,
while it runs (no restart), once. A rest killed between the record and the publish:
tests/component/test_intake_crash.py."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import nats.errors
import nats.js.errors
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket, Kind, job_subject
from services.rest import auth, intake, jobs_api
from services.rest.app import create_app
from services.rest.records import SubmittedJob

RUN = uuid.uuid4().hex[:6]
# The sweep runs every SWEEP_SECONDS and takes records older than UNPUBLISHED_AFTER_SECONDS;
# on a loaded machine allow it a good while more.
SWEEP_WAIT_SECONDS = intake.UNPUBLISHED_AFTER_SECONDS + intake.SWEEP_SECONDS + 20


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def rest_bus(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    yield bus
    await bus.close()


def job_body(name: str) -> bytes:
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            f"    commands:\n      - echo hi\n").encode()


async def stored(bus: Bus, job: str) -> SubmittedJob:
    entry = await (await bus.kv(Bucket.JOBS)).get(ids.job_key(job))
    return msgspec.json.decode(entry.value, type=SubmittedJob)


@pytest.fixture
async def platform_bus(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="platform", **nats_server.login("platform"))
    yield bus
    await bus.close()


async def published_ids(bus: Bus, subject: str) -> list[str]:
    """The Nats-Msg-Id of every message stored on `subject` (read as the platform)."""
    found = []
    sub = await bus.js.subscribe(subject, stream=STREAM, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                return found
            found.append(msg.headers["Nats-Msg-Id"])
    finally:
        await sub.unsubscribe()


async def test_a_submission_whose_publish_times_out_is_accepted_and_published_by_the_sweep(
    rest_bus, platform_bus, tmp_path, monkeypatch
):
    user = f"dave{RUN}"
    job = f"{user}~slowbus"
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    real_publish = rest_bus.js.publish
    bus_answers = asyncio.Event()

    async def timing_out_until_answering(subj, payload=b"", *args, **kwargs):
        if subj == subject and not bus_answers.is_set():
            raise nats.errors.TimeoutError
        return await real_publish(subj, payload, *args, **kwargs)

    monkeypatch.setattr(rest_bus.js, "publish", timing_out_until_answering)
    ctx = ServiceContext(name="rest", config=load_config(env={}, data_dir=str(tmp_path)), bus=rest_bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    try:
        token = await auth.create_user(rest_bus, user)
        headers = {"Content-Type": "text/yaml", "Authorization": f"Bearer {token}"}
        async with ClientSession() as session:
            async with session.post(server.make_url("/api/v2/jobs"), data=job_body("slowbus"), headers=headers) as resp:
                status, answer = resp.status, json.loads(await resp.read())
            assert status == 202, answer
            assert answer["job"] == job
            assert any("do not submit it again" in w for w in answer["warnings"]), answer["warnings"]
            # Recorded, not published.
            assert (await stored(rest_bus, job)).job == job
            assert await published_ids(platform_bus, subject) == []
            # Sending it again is a conflict: the job exists.
            async with session.post(server.make_url("/api/v2/jobs"), data=job_body("slowbus"), headers=headers) as resp:
                assert resp.status == 409

            # The bus answers again: the sweep publishes the record, rest still running.
            bus_answers.set()
            began = time.monotonic()
            while await published_ids(platform_bus, subject) == []:
                assert time.monotonic() - began < SWEEP_WAIT_SECONDS, "the sweep did not publish the record"
                await asyncio.sleep(0.2)
            assert await published_ids(platform_bus, subject) == [f"{job}/submitted"]
            # The index knows it is published: nothing left for the sweep.
            index = server.app[jobs_api.INDEX]
            deadline = time.monotonic() + 10
            while ids.job_key(job) in index.unpublished:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert await server.app[jobs_api.INTAKE].sweep_once(now=time.time() + 3600) == 0
    finally:
        await server.close()


async def test_a_submission_answered_202_is_published_once(rest_bus, platform_bus, tmp_path):
    user = f"fred{RUN}"
    job = f"{user}~quick"
    ctx = ServiceContext(name="rest", config=load_config(env={}, data_dir=str(tmp_path)), bus=rest_bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    try:
        token = await auth.create_user(rest_bus, user)
        async with ClientSession() as session:
            async with session.post(server.make_url("/api/v2/jobs"), data=job_body("quick"),
                                    headers={"Content-Type": "text/yaml", "Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 202
        # The event is out when the answer comes; this rest knows it (no lookup, no write).
        assert await published_ids(platform_bus, job_subject(Kind.JOB_SUBMITTED, "default", job)) == [f"{job}/submitted"]
        assert ids.job_key(job) in server.app[jobs_api.INTAKE].published_here
    finally:
        await server.close()
