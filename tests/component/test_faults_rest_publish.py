"""rest's intake when the publish of JobSubmitted times out (it may or may not be
stored): the job is recorded, so the caller gets 202 with a warning saying the
scheduler is told later; rest's own sweep publishes the record a few seconds later,
while it runs (no restart), once. A rest killed between the record and the publish:
tests/component/test_intake_crash.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats.errors
import pytest

from libs.common import ids
from libs.common.bus import Bus
from libs.common.subjects import Kind, job_subject
from services.rest import auth, intake, jobs_api
from tests.component.rest_replica import Rest, fail_at_send, record_of, stored_ids

RUN = uuid.uuid4().hex[:6]
# The sweep runs every SWEEP_SECONDS and takes records older than UNPUBLISHED_AFTER_SECONDS;
# on a loaded machine allow it a good while more.
SWEEP_WAIT_SECONDS = intake.UNPUBLISHED_AFTER_SECONDS + intake.SWEEP_SECONDS + 20


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def platform_bus(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="platform", **nats_server.login("platform"))
    yield bus
    await bus.close()


async def test_a_submission_whose_publish_times_out_is_accepted_and_published_by_the_sweep(
    nats_server, platform_bus, tmp_path
):
    user = f"dave{RUN}"
    job = f"{user}~slowbus"
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    bus_answers = asyncio.Event()
    async with Rest(nats_server, tmp_path) as rest:
        async def timing_out_until_answering(subj, send):
            if subj == subject and not bus_answers.is_set():  # the submission's batch, its retry, the sweep
                raise nats.errors.TimeoutError
            return await send()

        fail_at_send(rest, timing_out_until_answering)
        token = await auth.create_user(rest.bus, user)
        status, answer = await rest.submit(token, "slowbus")
        assert status == 202, answer
        assert answer["job"] == job
        assert any("do not submit it again" in w for w in answer["warnings"]), answer["warnings"]
        # Recorded, not published.
        assert (await record_of(rest.bus, job)).job == job
        assert await stored_ids(platform_bus, subject) == []
        # Sending it again is a conflict: the job exists.
        status, _ = await rest.submit(token, "slowbus")
        assert status == 409

        # The bus answers again: the sweep publishes the record, rest still running.
        bus_answers.set()
        began = time.monotonic()
        while await stored_ids(platform_bus, subject) == []:
            assert time.monotonic() - began < SWEEP_WAIT_SECONDS, "the sweep did not publish the record"
            await asyncio.sleep(0.2)
        assert await stored_ids(platform_bus, subject) == [f"{job}/submitted"]
        # The index knows it is published: nothing left for the sweep.
        index = rest.server.app[jobs_api.INDEX]
        deadline = time.monotonic() + 10
        while ids.job_key(job) in index.unpublished:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await rest.intake.sweep_once(now=time.time() + 3600) == 0


async def test_a_submission_answered_202_is_published_once(nats_server, platform_bus, tmp_path):
    user = f"fred{RUN}"
    job = f"{user}~quick"
    async with Rest(nats_server, tmp_path) as rest:
        token = await auth.create_user(rest.bus, user)
        status, _ = await rest.submit(token, "quick")
        assert status == 202
        # The event is out when the answer comes; this rest knows it (no lookup, no write).
        assert await stored_ids(platform_bus, job_subject(Kind.JOB_SUBMITTED, "default", job)) == [f"{job}/submitted"]
        assert ids.job_key(job) in rest.intake.published_here
