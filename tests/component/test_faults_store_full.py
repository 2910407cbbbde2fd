"""A full JetStream store, against a real nats-server whose streams are tiny: rest
answers 507 with a JSON body saying so and Retry-After, keeps nothing of a refused
submission (no job accepted that is not stored), keeps running, and takes the same
submission once room is made."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.js.errors
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus, store_is_full
from libs.common.busauth import load_or_create_credentials
from libs.common.config import Config, load_config
from libs.common.jetstream_limits import StoreLimits, store_settings
from libs.common.messages import StopRequested
from libs.common.natsserver import NatsServer
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket, Kind, job_subject
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
_users = iter(range(1000))
EVENTS_BYTES = 64 * 1024
JOBS_BYTES = 48 * 1024


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """A server whose event stream and job bucket hold a few dozen KiB."""
    root = tmp_path_factory.mktemp("nats-tiny")
    base = store_settings(Config())
    settings = msgspec.structs.replace(
        base,
        events=msgspec.structs.replace(base.events, max_bytes=EVENTS_BYTES),
        buckets={**base.buckets, Bucket.JOBS: StoreLimits(max_bytes=JOBS_BYTES)},
    )
    with NatsServer(root / "store", auth=load_or_create_credentials(root / "nats-credentials.json")) as srv:
        srv.bootstrap(settings)
        yield srv


@pytest.fixture
async def admin(tiny_store) -> AsyncIterator[Bus]:
    bus = await Bus.connect(tiny_store.url, name="test-admin", **tiny_store.login("platform"))
    yield bus
    await bus.js.purge_stream(STREAM)
    await bus.js.purge_stream(f"KV_{Bucket.JOBS.value}")
    await bus.close()


@pytest.fixture
async def api(tiny_store, tmp_path) -> AsyncIterator[Any]:
    bus = await Bus.connect(tiny_store.url, name="rest", **tiny_store.login("rest"))
    ctx = ServiceContext(name="rest", config=load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path)), bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    user = f"carol{RUN}{next(_users)}"
    token = await auth.create_user(bus, user)
    async with ClientSession() as session:

        async def submit(name: str) -> tuple[int, Any, dict]:
            body = (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
                    "    commands:\n      - echo hi\n").encode()
            headers = {"Content-Type": "text/yaml", "Authorization": f"Bearer {token}"}
            async with session.post(server.make_url("/api/v2/jobs"), data=body, headers=headers) as resp:
                return resp.status, json.loads(await resp.read()), dict(resp.headers)

        async def get(path: str) -> tuple[int, Any]:
            async with session.get(server.make_url(path), headers={"Authorization": f"Bearer {token}"}) as resp:
                return resp.status, json.loads(await resp.read())

        submit.get = get  # type: ignore[attr-defined]
        submit.user = user  # type: ignore[attr-defined]
        yield submit
    await server.close()
    await bus.close()


async def fill_events(admin: Bus) -> None:
    """Publish until the event stream refuses: JetStream's own refusal, nothing faked."""
    for n in range(10_000):
        try:
            await admin.publish(StopRequested(id=f"filler/{RUN}/{n}", job=f"filler~f{n % 50}", vc="default",
                                              by="x" * 500), attempts=1)
        except Exception as exc:  # noqa: BLE001 - the refusal is what we wait for
            assert store_is_full(exc), exc
            return
    raise AssertionError("the event stream never filled")


async def fill_jobs_bucket(admin: Bus) -> None:
    kv = await admin.kv(Bucket.JOBS)
    for n in range(10_000):
        try:
            await kv.put(f"filler.f{n}", b"x" * 1000)
        except nats.js.errors.APIError as exc:
            assert store_is_full(exc), exc
            return
    raise AssertionError("the job bucket never filled")


async def submitted_events(admin: Bus, job: str) -> int:
    """How many JobSubmitted of `job` the stream holds (0 or 1: the id dedupes)."""
    try:
        await admin.js.get_last_msg(STREAM, job_subject(Kind.JOB_SUBMITTED, "default", job))
        return 1
    except nats.js.errors.NotFoundError:
        return 0


def assert_store_full_answer(status: int, body: Any, headers: dict) -> None:
    assert status == 507, body
    assert body["code"] == "InsufficientStorage" and "full" in body["message"]
    assert int(headers["Retry-After"]) > 0


async def test_a_submission_the_event_stream_has_no_room_for_is_refused_whole_then_taken(admin, api):
    job = f"{api.user}~nospace"
    await fill_events(admin)
    status, body, headers = await api("nospace")
    assert_store_full_answer(status, body, headers)
    # Nothing half-way: no record (GET says no such job), no event.
    assert (await api.get(f"/api/v2/jobs/{job}"))[0] == 404
    assert await submitted_events(admin, job) == 0

    await admin.js.purge_stream(STREAM)  # an admin makes room
    status, body, _ = await api("nospace")  # the very same submission, not a 409
    assert status == 202, body
    assert await submitted_events(admin, job) == 1
    assert (await api.get(f"/api/v2/jobs/{job}"))[0] == 200


async def test_a_submission_the_job_bucket_has_no_room_for_is_refused_and_nothing_published(admin, api):
    job = f"{api.user}~nobucket"
    await fill_jobs_bucket(admin)
    status, body, headers = await api("nobucket")
    assert_store_full_answer(status, body, headers)
    assert await submitted_events(admin, job) == 0
    # rest keeps answering what needs no room.
    assert (await api.get("/api/v2/users/me"))[0] == 200

    await admin.js.purge_stream(f"KV_{Bucket.JOBS.value}", subject=f"$KV.{Bucket.JOBS.value}.filler.>")
    status, body, _ = await api("nobucket")
    assert status == 202, body
    assert await submitted_events(admin, job) == 1
