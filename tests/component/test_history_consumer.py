"""rest's history consumer against a real nats-server, logged in as rest (its NATS
permissions allow the `history` durable): events become rows, a crash before the
ack (after the commit, or before it) loses nothing and doubles nothing."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from libs.common.bus import Bus
from libs.common.subjects import STREAM, Durable
from services.rest.history import consumer, query, store
from tests.conftest import platform_bus
from tests.fixtures import history_events as ev

ACK_WAIT = 1.0  # the test's: an unacked batch comes back after a second


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # the durable and the stream are this module's alone


@pytest.fixture
async def admin(nats_server):
    async with platform_bus(nats_server, purge=(STREAM,), durables=(Durable.HISTORY,)) as bus:
        yield bus


@pytest.fixture
async def engine(tmp_path):
    engine = await store.open_store(store.dsn_for("", tmp_path))
    yield engine
    await engine.dispose()


class Crash(Exception):
    """The process dies here (nothing after it runs: no ack)."""


@contextlib.asynccontextmanager
async def running(nats_server, engine, apply_batch=store.apply_batch):
    bus = await Bus.connect(nats_server.url, name="test-rest", **nats_server.login("rest"))
    task = asyncio.ensure_future(consumer.run(bus, engine, asyncio.Event(), ack_wait=ACK_WAIT, apply_batch=apply_batch))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Crash):
            await task
        await bus.close()


async def _until(check, timeout: float = 15.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the history did not get there in time")
        await asyncio.sleep(0.05)


async def _finished(engine, count: int):
    total, rows = await query.list_jobs(engine, query.JobFilter(states=frozenset({"SUCCEEDED", "FAILED"})))
    return rows if total == count else None


async def test_events_on_the_bus_become_history_rows(admin, nats_server, engine):
    await admin.publish_many(ev.lifecycle("alice~one") + ev.lifecycle("bob~two", at=ev.T0 + 5, exit_code=3))
    async with running(nats_server, engine):
        rows = await _until(lambda: _finished(engine, 2))
    assert {r["debugId"]: r["state"] for r in rows} == {"alice~one": "SUCCEEDED", "bob~two": "FAILED"}
    last = (await admin.js.stream_info(STREAM)).state.last_seq
    assert (await store.progress(engine))[0] == last  # resumable from here


@pytest.mark.parametrize("when", ["after-commit", "before-commit"])
async def test_a_crash_before_the_ack_loses_nothing_and_doubles_nothing(admin, nats_server, engine, when):
    job = f"carol~crash-{when}"  # (event ids are deduplicated by the stream, purged or not)
    events = ev.lifecycle(job)
    await admin.publish_many(events)
    crashed = asyncio.Event()

    async def dies_once(engine_, ops, last_seq, count):
        if not crashed.is_set():
            crashed.set()
            if when == "after-commit":
                await store.apply_batch(engine_, ops, last_seq, count)  # committed, never acked
            raise Crash
        await store.apply_batch(engine_, ops, last_seq, count)

    async with running(nats_server, engine, dies_once) as first:
        await _until(lambda: asyncio.sleep(0, crashed.is_set()))
        with pytest.raises(Crash):
            await first
    if when == "before-commit":
        assert await query.list_jobs(engine, query.JobFilter()) == (0, [])
    async with running(nats_server, engine):  # the restarted rest: the unacked events come back
        await _until(lambda: _finished(engine, 1))
        await _until(lambda: _applied_at_least(engine, len(events) * (2 if when == "after-commit" else 1)))
    total, (row,) = await query.list_jobs(engine, query.JobFilter())
    assert total == 1 and row["state"] == "SUCCEEDED"
    logged = await query.job_events(engine, job)
    assert [e["reason"] for e in logged] == ["Submitted", "Running", "Succeeded"]  # each once
    (attempt,) = await query.job_attempts(engine, job)
    assert len(attempt["tasks"]) == 1


async def _applied_at_least(engine, count: int) -> bool:
    return (await store.progress(engine))[1] >= count
