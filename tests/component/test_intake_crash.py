"""rest killed in the middle of a submission (its task cancelled), against a real
nats-server: whatever step it died at, the job it recorded is published exactly
once -- by the next rest's sweep when the event is not out, and not again when it
is -- a resubmission stays a 409, and nothing is answered 202 that is not stored.

Intake writes no "published" mark (services/rest/intake.py): the restarted rest
learns what is out from the event stream. JetStream's dedupe would hide a second
publish of the same id within its window, so each test also counts the publishes
the restarted rest makes: a sweep that published what was already out would be
caught here, not hidden.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats.errors
import pytest

from libs.common import ids
from libs.common.bus import Bus
from libs.common.subjects import Bucket, Kind, job_subject
from services.rest import auth, intake, jobs_api
from tests.component.rest_replica import Rest, fail_at_send, record_of, stored_ids

RUN = uuid.uuid4().hex[:6]
# The restarted rest's sweep takes a record once it is UNPUBLISHED_AFTER_SECONDS old,
# every SWEEP_SECONDS, after its index loaded; a loaded machine gets a good margin.
SWEEP_WAIT_SECONDS = intake.UNPUBLISHED_AFTER_SECONDS + intake.SWEEP_SECONDS + 30


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def platform_bus(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="platform", **nats_server.login("platform"))
    yield bus
    await bus.close()


async def killed_during_submission(rest: Rest, token: str, job: str, *, after_publish: bool) -> None:
    """Submit `job` to `rest` and cancel the request's task at the publish of its
    JobSubmitted: before it is sent, or just after it was stored (its ack never
    seen). Returns once the task is gone and the client saw no 202."""
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    dying = asyncio.Event()

    async def cut_short(subj, send):
        if subj != subject:
            return await send()
        if after_publish:
            await send()
        dying.set()
        asyncio.current_task().cancel()  # the process dies here: nothing after this line runs
        await asyncio.sleep(3600)

    fail_at_send(rest, cut_short)
    submitting = asyncio.ensure_future(rest.submit(token, job.split("~", 1)[1]))
    await asyncio.wait_for(dying.wait(), timeout=30)
    try:
        status, _ = await asyncio.wait_for(submitting, timeout=30)
    except (Exception, asyncio.CancelledError):  # noqa: BLE001 - the connection dropped: no answer
        status = None
    assert status != 202, "a submission cut short was answered as accepted"


async def wait_until_settled(rest: Rest, job: str) -> None:
    """Until the restarted rest's sweep has dealt with the record (published it, or
    found it out), through its real timer."""
    key = ids.job_key(job)
    index = rest.server.app[jobs_api.INDEX]
    began = time.monotonic()
    while not (index.ready and index.get(key) is not None and key not in index.unpublished):
        assert time.monotonic() - began < SWEEP_WAIT_SECONDS, "the sweep never settled the record"
        await asyncio.sleep(0.2)


async def test_rest_killed_between_the_record_and_the_publish_the_next_rest_publishes_it_once(
        nats_server, platform_bus, tmp_path):
    user = f"kim{RUN}"
    job = f"{user}~beforepublish"
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    async with Rest(nats_server, tmp_path) as first:
        token = await auth.create_user(first.bus, user)
        await killed_during_submission(first, token, job, after_publish=False)
    # It left the record and no event.
    assert (await record_of(platform_bus, job)) is not None
    assert await stored_ids(platform_bus, subject) == []

    async with Rest(nats_server, tmp_path) as second:
        await wait_until_settled(second, job)
        assert second.published == [f"{job}/submitted"]
        assert await stored_ids(platform_bus, subject) == [f"{job}/submitted"]
        # The job exists: sending it again is a conflict, and publishes nothing.
        status, body = await second.submit(token, "beforepublish")
        assert status == 409, body
        # Later sweeps leave it alone, however old it gets.
        assert await second.intake.sweep_once(now=time.time() + 3600) == 0
        assert second.published == [f"{job}/submitted"]


async def test_rest_killed_after_the_publish_before_answering_the_next_rest_publishes_nothing(
        nats_server, platform_bus, tmp_path):
    user = f"lee{RUN}"
    job = f"{user}~afterpublish"
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    async with Rest(nats_server, tmp_path) as first:
        token = await auth.create_user(first.bus, user)
        await killed_during_submission(first, token, job, after_publish=True)
    assert await stored_ids(platform_bus, subject) == [f"{job}/submitted"]

    async with Rest(nats_server, tmp_path) as second:
        await wait_until_settled(second, job)
        # Found in the stream: not published again (the dedupe window would have
        # hidden a second publish; the count does not).
        assert second.published == []
        assert await stored_ids(platform_bus, subject) == [f"{job}/submitted"]
        status, body = await second.submit(token, "afterpublish")
        assert status == 409, body


async def test_two_replicas_one_killed_mid_submission_the_other_publishes_it_once(
        nats_server, platform_bus, tmp_path):
    """No restart: the surviving replica's own sweep finds the record through its index."""
    user = f"max{RUN}"
    job = f"{user}~replica"
    subject = job_subject(Kind.JOB_SUBMITTED, "default", job)
    async with Rest(nats_server, tmp_path / "b") as survivor:
        async with Rest(nats_server, tmp_path / "a") as dying:
            token = await auth.create_user(dying.bus, user)
            await killed_during_submission(dying, token, job, after_publish=False)
        # Jobs the survivor accepted itself meanwhile are published by it, not looked up.
        status, body = await survivor.submit(token, "ownjob")
        assert status == 202, body
        await wait_until_settled(survivor, job)
        await wait_until_settled(survivor, f"{user}~ownjob")
        assert sorted(survivor.published) == sorted([f"{job}/submitted", f"{user}~ownjob/submitted"])
        assert await stored_ids(platform_bus, subject) == [f"{job}/submitted"]


async def test_a_record_the_store_does_not_answer_for_is_not_accepted_nor_published(
        nats_server, platform_bus, tmp_path):
    user = f"ned{RUN}"
    job = f"{user}~nostore"
    async with Rest(nats_server, tmp_path) as rest:
        token = await auth.create_user(rest.bus, user)
        record_subject = f"$KV.{Bucket.JOBS.value}.{ids.job_key(job)}"

        async def not_answered(subj, send):
            if subj == record_subject:
                raise nats.errors.TimeoutError
            return await send()

        store_answers_again = fail_at_send(rest, not_answered)
        status, body = await rest.submit(token, "nostore")
        assert status == 503, body
        assert await record_of(platform_bus, job) is None
        assert rest.published == []
        assert await stored_ids(platform_bus, job_subject(Kind.JOB_SUBMITTED, "default", job)) == []
        # Once the store answers, the same submission is taken (not a 409).
        store_answers_again()
        status, body = await rest.submit(token, "nostore")
        assert status == 202, body
        assert rest.published == [f"{job}/submitted"]
