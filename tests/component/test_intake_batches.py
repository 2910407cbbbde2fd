"""rest's intake writing concurrent submissions together (services/rest/intake.py),
against a real nats-server: each submission is answered from its own writes, a
refused one fails alone and leaves nothing half-way, a duplicate name is refused
however the submissions are grouped; and the bus's per-write answers
(`Bus.kv_create_each`, `Bus.publish_each`) the intake reads."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors
import pytest

from libs.common import ids
from libs.common.bus import Bus, store_is_full
from libs.common.messages import StopRequested, subject_of
from libs.common.subjects import STREAM, Bucket, Kind, job_subject
from services.rest import auth
from tests.component.rest_replica import Rest, fail_at_send, record_of, stored_ids

RUN = uuid.uuid4().hex[:6]
# What JetStream answers a write to a stream with no room left (10077: maximum bytes).
NO_ROOM = {"code": 503, "err_code": 10077, "description": "maximum bytes exceeded"}


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def platform_bus(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="platform", **nats_server.login("platform"))
    yield bus
    await bus.close()


def submitted_subject(job: str) -> str:
    return job_subject(Kind.JOB_SUBMITTED, "default", job)


async def submitted_id(bus: Bus, job: str) -> str | None:
    """The id of the job's JobSubmitted in the event stream, None when it is not there
    (one lookup; the dedupe of a repeat is counted through `Rest.published`)."""
    try:
        msg = await bus.js.get_last_msg(STREAM, submitted_subject(job))
    except nats.js.errors.NotFoundError:
        return None
    return msg.headers["Nats-Msg-Id"]


async def test_concurrent_submissions_are_each_stored_and_answered(nats_server, platform_bus, tmp_path):
    user = f"ann{RUN}"
    names = [f"many{n}" for n in range(24)]
    async with Rest(nats_server, tmp_path) as rest:
        token = await auth.create_user(rest.bus, user)
        answers = await asyncio.gather(*(rest.submit(token, name) for name in names))
        for name, (status, body) in zip(names, answers, strict=True):
            assert status == 202, body
            assert body["job"] == f"{user}~{name}" and body["warnings"] == []
        for name in names:
            job = f"{user}~{name}"
            assert (await record_of(platform_bus, job)).name == name
            assert await submitted_id(platform_bus, job) == f"{job}/submitted"
        assert sorted(rest.published) == sorted(f"{user}~{name}/submitted" for name in names)


async def test_refused_writes_fail_their_own_submissions_only_and_leave_nothing_half_way(
        nats_server, platform_bus, tmp_path):
    user = f"bob{RUN}"
    no_record, no_room = f"{user}~norecord", f"{user}~noroom"
    fine = [f"fine{n}" for n in range(6)]
    async with Rest(nats_server, tmp_path) as rest:
        token = await auth.create_user(rest.bus, user)

        async def faults(subject, send):
            if subject == f"$KV.{Bucket.JOBS.value}.{ids.job_key(no_record)}":
                raise nats.errors.TimeoutError  # the store does not answer for this record
            if subject == submitted_subject(no_room):
                nats.js.errors.APIError.from_error(NO_ROOM)  # raises: the event stream has no room
            return await send()

        stores_again = fail_at_send(rest, faults)
        answers = await asyncio.gather(*(rest.submit(token, name) for name in ["norecord", "noroom", *fine]))
        statuses = {name: status for name, (status, _) in zip(["norecord", "noroom", *fine], answers, strict=True)}
        assert statuses == {"norecord": 503, "noroom": 507} | dict.fromkeys(fine, 202), answers
        # Nothing half-way: neither refused job has a record or an event; the others have both.
        for job in (no_record, no_room):
            assert await record_of(platform_bus, job) is None
            assert await submitted_id(platform_bus, job) is None
        for name in fine:
            job = f"{user}~{name}"
            assert await record_of(platform_bus, job) is not None
            assert await submitted_id(platform_bus, job) == f"{job}/submitted"

        # Once the store answers, the very same submissions are taken (not 409s).
        stores_again()
        for name in ("norecord", "noroom"):
            status, body = await rest.submit(token, name)
            assert status == 202, body
        assert await submitted_id(platform_bus, no_room) == f"{no_room}/submitted"


async def test_a_duplicate_name_is_refused_whether_submitted_together_or_later(nats_server, platform_bus, tmp_path):
    user = f"cat{RUN}"
    job = f"{user}~twice"
    async with Rest(nats_server, tmp_path) as rest:
        token = await auth.create_user(rest.bus, user)
        together = await asyncio.gather(*(rest.submit(token, name) for name in ["twice", "twice", "other"]))
        assert sorted(status for status, _ in together) == [202, 202, 409], together
        status, body = await rest.submit(token, "twice")
        assert status == 409, body
        assert "already exists" in body["message"]
        assert await stored_ids(platform_bus, submitted_subject(job)) == [f"{job}/submitted"]
        assert rest.published.count(f"{job}/submitted") == 1


async def test_the_bus_answers_each_create_and_each_publish_of_a_batch(platform_bus):
    kv = await platform_bus.kv(Bucket.JOBS)
    taken, fresh = f"bus{RUN}.taken", f"bus{RUN}.fresh"
    await kv.create(taken, b"first")
    answers = await platform_bus.kv_create_each(Bucket.JOBS, [(fresh, b"new"), (taken, b"second")])
    assert answers[0] == (await kv.get(fresh)).revision
    assert isinstance(answers[1], nats.js.errors.KeyWrongLastSequenceError)
    assert (await kv.get(taken)).value == b"first"

    events = [StopRequested(id=f"bus{RUN}/{n}", job=f"bus{RUN}~j{n}", vc="default", by="t", at=0.0) for n in range(3)]
    real_publish = platform_bus.nc.publish

    async def no_room_for_the_second(subject, payload=b"", *args, **kwargs):
        if subject == subject_of(events[1]):
            nats.js.errors.APIError.from_error(NO_ROOM)
        return await real_publish(subject, payload, *args, **kwargs)

    platform_bus.nc.publish = no_room_for_the_second
    try:
        failures = await platform_bus.publish_each(events, attempts=2)
    finally:
        del platform_bus.nc.publish
    assert failures[0] is None and failures[2] is None
    assert store_is_full(failures[1])
