"""At most `live_finished_job_max` finished jobs stay live (services/rest/history/expiry.py):
past it the oldest-finished are archived first, whatever their age, against a real
nats-server and rest's app with its SQLite history (the projection and the background
sweep paused: the test applies events and sweeps itself):

- with a bound of 3 and 8 finished jobs, the 5 oldest-finished leave pai_jobs, one
  job.archived each; the 3 newest and the running jobs stay; a second sweep does nothing;
  the purge markers of the archived records expire (the history holds their names), and
  rest's index holds no deleted name for them;
- an archived job reads the same from the history; the portal's overview still counts
  it by state and shows it among the owner's recent jobs;
- a sweep that dies after publishing, or after purging, leaves it to the next sweep,
  which finishes the page without a second job.archived.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import msgspec
import nats.js.errors
import pytest
import sqlalchemy as sa
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.messages import JobState
from libs.common.records import AttemptRecord, JobRecord
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket
from services.rest import auth, jobs_api
from services.rest.app import create_app
from services.rest.history import consumer, expiry, projection, schema, store
from services.rest.history.wiring import HISTORY
from services.rest.records import SubmittedJob
from tests.fixtures import history_events as ev
from tests.fixtures.settings import IN_PROCESS_ENV
from tests.fixtures.waiting import eventually

BOUND = 3
FINISHED = 8
NOW_OFFSET = 10.0  # each job 10 s after the previous one
MARKER_SECONDS = 1.0


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # the stream's job.archived messages are counted: this module's alone


async def _never(*_, **__):  # the projection and the background sweep paused: the test drives them
    await asyncio.Event().wait()


@pytest.fixture
async def rest(nats_server, tmp_path) -> AsyncIterator[dict]:
    paused = pytest.MonkeyPatch()
    paused.setattr(consumer, "run", _never)
    paused.setattr(expiry, "run", _never)
    platform = await Bus.connect(nats_server.url, name="count-bound-test", **nats_server.login("platform"))
    await platform.bootstrap()
    bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    # A day-long grace period: only the count bound archives anything here.
    # The event stream's duplicate window as rest reads it (the server's stream keeps its
    # own): how long the purge marker of an archived job's record stays, here a second.
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path), live_finished_job_max=BOUND,
                         live_finished_job_seconds=10 ** 9, rest_rate_limit_burst=10_000,
                         nats_events_duplicate_window_seconds=MARKER_SECONDS)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    app = await create_app(ctx)
    server = TestServer(app)
    await server.start_server()
    ctx.set_ready()
    owner = f"ann{uuid.uuid4().hex[:6]}"  # each test its own user: its jobs, its recent jobs
    token = await auth.create_user(bus, owner)
    index = app[jobs_api.INDEX]
    await eventually(lambda: asyncio.sleep(0, index.ready), timeout=10.0, every=0.1)
    async with ClientSession() as session:

        async def call(path: str):
            async with session.get(server.make_url(path), headers={"Authorization": f"Bearer {token}"}) as resp:
                return resp.status, json.loads(await resp.read())

        yield {"ctx": ctx, "engine": app[HISTORY].engine, "platform": platform, "call": call, "owner": owner, "index": index}
    await server.close()
    await bus.close()
    await platform.close()
    paused.undo()


async def _jobs(platform: Bus, engine, owner: str) -> tuple[list[str], list[str]]:
    """8 finished jobs (the first finished first) and 2 running, in the buckets as the
    services leave them and in the history as the projection does."""
    finished = [f"{owner}~done{i}" for i in range(FINISHED)]
    running = [f"{owner}~run{i}" for i in range(2)]
    events = []
    jobs_kv, status_kv = await platform.kv(Bucket.JOBS), await platform.kv(Bucket.JOB_STATUS)
    for i, jid in enumerate(finished + running):
        at = ev.T0 + i * NOW_OFFSET
        done = jid in finished
        user, name = ids.split_job_id(jid)
        spec = ev.spec(jid)
        sub = SubmittedJob(job=jid, user=user, name=name, vc="default", spec=spec, config={"name": name},
                           submittedAt=at, published=True)
        state = JobState.SUCCEEDED if done else JobState.RUNNING
        record = JobRecord(job=jid, name=name, user=user, vc="default", spec=spec, state=state, createdTime=at,
                           launchedTime=at + 1, completedTime=at + 4 if done else None,
                           appExitCode=0 if done else None,
                           attempts=[AttemptRecord(attempt=1, state=state, createdTime=at, launchedTime=at + 1,
                                                   completedTime=at + 4 if done else None)])
        await jobs_kv.put(ids.job_key(jid), msgspec.json.encode(sub))
        await status_kv.put(ids.job_key(jid), msgspec.json.encode(record))
        events += ev.lifecycle(jid, at=at) if done else ev.lifecycle(jid, at=at)[:3]
    batch = list(enumerate(events, start=1))
    await store.apply_batch(engine, projection.project_batch(batch), len(batch), len(batch))
    return finished, running


async def _live(platform: Bus, jids: list[str]) -> set[str]:
    kv = await platform.kv(Bucket.JOBS)
    there = set()
    for jid in jids:
        try:
            entry = await kv.get(ids.job_key(jid))
        except Exception:  # noqa: BLE001 - missing or purged: not live
            continue
        if entry.value:
            there.add(jid)
    return there


async def _no_message_left(platform: Bus, jids: list[str]) -> bool:
    for jid in jids:
        try:
            await platform.js.get_last_msg(f"KV_{Bucket.JOBS.value}", f"$KV.{Bucket.JOBS.value}.{ids.job_key(jid)}")
        except nats.js.errors.NotFoundError:
            continue
        return False
    return True


async def _archived_in_history(engine) -> set[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(sa.select(schema.jobs.c.id).where(schema.jobs.c.archived_at.is_not(None)))
        return {row.id for row in rows}


async def _archived_messages(platform: Bus, owner: str) -> dict[str, int]:
    """job.archived events stored in the stream, per job of this owner."""
    info = await platform.js.stream_info(STREAM, subjects_filter=f"pai.v1.job.archived.default.{owner}.>")
    return {f"{owner}~{subject.rsplit('.', 1)[1]}": count for subject, count in (info.state.subjects or {}).items()}


async def test_past_the_bound_the_oldest_finished_are_archived_and_still_read_and_counted(rest):
    ctx, engine, platform, call, owner = rest["ctx"], rest["engine"], rest["platform"], rest["call"], rest["owner"]
    finished, running = await _jobs(platform, engine, owner)
    status, before = await call(f"/api/v2/jobs/{finished[0]}")
    assert status == 200 and before["jobStatus"]["state"] == "SUCCEEDED"

    assert await expiry.archive_due(ctx, engine) == FINISHED - BOUND
    oldest, newest = finished[:FINISHED - BOUND], finished[FINISHED - BOUND:]
    assert await _live(platform, finished + running) == set(newest + running)  # never an unfinished job
    assert await _archived_in_history(engine) == set(oldest)
    assert await _archived_messages(platform, owner) == {jid: 1 for jid in oldest}
    assert await expiry.archive_due(ctx, engine) == 0  # at the bound: nothing more
    # Their records' purge markers expire: nothing of them stays in pai_jobs' stream.
    assert await eventually(lambda: _no_message_left(platform, oldest)), "purge markers still stored"
    assert await _live(platform, newest + running) == set(newest + running)
    # rest's index let them go as archived, not as deletions: no name held for them
    # (memory that would grow with every job archived), and the list shows them.
    index = rest["index"]
    keys = [ids.job_key(jid) for jid in oldest]
    assert await eventually(lambda: asyncio.sleep(0, not any(index.get(key) for key in keys)))
    assert not any(key in index.purged for key in keys)
    status, listed = await call(f"/api/v2/jobs?username={owner}")
    assert status == 200 and {row["debugId"] for row in listed} == set(finished + running)

    # The launcher drops an archived job's record once it has no files (none here).
    status_kv = await platform.kv(Bucket.JOB_STATUS)
    for jid in oldest:
        await status_kv.delete(ids.job_key(jid))
    status, after = await call(f"/api/v2/jobs/{finished[0]}")
    assert status == 200
    keep = ("state", "createdTime", "completedTime", "appExitCode", "username", "virtualCluster")
    assert {k: after["jobStatus"][k] for k in keep} == {k: before["jobStatus"][k] for k in keep}
    status, config = await call(f"/api/v2/jobs/{finished[0]}/config")
    assert status == 200 and config == {"name": ids.split_job_id(finished[0])[1]}

    # The portal's overview counts every job, live or archived, and lists the newest as recent.
    async def counted():
        status, body = await call("/api/v2/portal/overview")
        assert status == 200, body
        got = (body["jobsByState"]["SUCCEEDED"], body["jobsByState"]["RUNNING"],
               [row["debugId"] for row in body["myRecentJobs"]])
        return got if got[:2] == (FINISHED, 2) else None

    succeeded, run, recent = await eventually(counted) or (None, None, None)
    assert (succeeded, run) == (FINISHED, 2)
    assert recent == list(reversed(finished + running))[:8]  # newest first: archived ones among them


@pytest.mark.parametrize("dies", ["after-publish", "after-purge"])
async def test_a_sweep_that_dies_mid_page_is_finished_by_the_next_without_doubles(rest, dies):
    ctx, engine, platform, owner = rest["ctx"], rest["engine"], rest["platform"], rest["owner"]
    finished, running = await _jobs(platform, engine, owner)
    oldest = finished[:FINISHED - BOUND]

    class Died(Exception):
        pass

    real_update = expiry._update_many

    async def update_dies_at_marking(engine_, rows, **values):
        if "archived_at" in values:
            raise Died
        await real_update(engine_, rows, **values)

    async def purge_dies(ctx_, keys):
        raise Died

    with pytest.MonkeyPatch.context() as crash:
        if dies == "after-publish":
            crash.setattr(expiry, "_purge_records", purge_dies)
        else:
            crash.setattr(expiry, "_update_many", update_dies_at_marking)
        with pytest.raises(Died):
            await expiry.archive_due(ctx, engine)
    archived = await _archived_in_history(engine)
    assert not archived & set(finished)  # nothing marked: the next sweep does the page again
    live = await _live(platform, finished)
    assert live == (set(finished) if dies == "after-publish" else set(finished) - set(oldest))

    assert await expiry.archive_due(ctx, engine) == FINISHED - BOUND
    assert await _live(platform, finished + running) >= set(running)
    assert not await _live(platform, oldest)
    assert set(oldest) <= await _archived_in_history(engine)
    assert await _archived_messages(platform, owner) == {jid: 1 for jid in oldest}  # each once, redone or not
