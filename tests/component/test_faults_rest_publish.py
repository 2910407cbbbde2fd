"""rest's intake when the publish of JobSubmitted times out (it may or may not be
stored): the caller gets 503 JSON with Retry-After, the job's record is kept
unpublished, and rest publishes it when it starts again, once."""

from __future__ import annotations

import json
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
from services.rest import auth
from services.rest.app import create_app, publish_pending_submissions
from services.rest.records import SubmittedJob

RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def rest_bus(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    yield bus
    await bus.close()


async def test_a_submission_whose_publish_times_out_is_answered_503_kept_and_published_at_restart(
    rest_bus, nats_server, tmp_path, monkeypatch
):
    user = f"dave{RUN}"
    job = f"{user}~slowbus"
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    real_publish = rest_bus.js.publish

    async def timing_out(subj, payload=b"", *args, **kwargs):
        if subj == subject:
            raise nats.errors.TimeoutError
        return await real_publish(subj, payload, *args, **kwargs)

    ctx = ServiceContext(name="rest", config=load_config(env={}, data_dir=str(tmp_path)), bus=rest_bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    token = await auth.create_user(rest_bus, user)
    body = (b"protocolVersion: 2\nname: slowbus\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            b"    commands:\n      - echo hi\n")
    monkeypatch.setattr(rest_bus.js, "publish", timing_out)
    try:
        async with ClientSession() as session:
            async with session.post(server.make_url("/api/v2/jobs"), data=body,
                                    headers={"Content-Type": "text/yaml", "Authorization": f"Bearer {token}"}) as resp:
                status, answer, headers = resp.status, json.loads(await resp.read()), resp.headers
    finally:
        await server.close()
    assert status == 503, answer
    assert answer["code"] == "ServiceUnavailable" and answer["message"]
    assert int(headers["Retry-After"]) > 0
    # Kept, not yet published.
    stored = await (await rest_bus.kv(Bucket.JOBS)).get(ids.job_key(job))
    assert not msgspec.json.decode(stored.value, type=SubmittedJob).published
    with pytest.raises(nats.js.errors.NotFoundError):
        await rest_bus.js.get_last_msg(STREAM, subject)

    # rest starts again with the bus answering: the submission goes out, once.
    monkeypatch.setattr(rest_bus.js, "publish", real_publish)
    assert await publish_pending_submissions(ctx) >= 1
    assert await publish_pending_submissions(ctx) == 0
    msg = await rest_bus.js.get_last_msg(STREAM, subject)
    assert msg.headers["Nats-Msg-Id"] == f"{job}/submitted"
    stored = await (await rest_bus.kv(Bucket.JOBS)).get(ids.job_key(job))
    assert msgspec.json.decode(stored.value, type=SubmittedJob).published
