"""rest's job index against a real nats-server, connected as rest: it loads what the
three buckets hold, follows every later write and delete, and starts again from
scratch when NATS comes back after a restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import pytest

from libs.common import ids
from libs.common.bus import Bus
from libs.common.messages import JobState
from libs.common.protocol import parse_job
from libs.common.subjects import Bucket
from services.rest.job_index import JobIndex
from services.rest.records import SubmittedJob

JOB = """protocolVersion: 2
name: {name}
type: job
taskRoles:
  main:
    instances: 1
    commands: ["true"]
"""


def submission(user: str, name: str) -> bytes:
    parsed = parse_job(JOB.format(name=name).encode(), content_type="text/yaml", user=user)
    return msgspec.json.encode(SubmittedJob(job=ids.job_id(user, name), user=user, name=name, vc="default",
                                            spec=parsed.spec, config=parsed.config, submittedAt=time.time()))


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout  # generous: the machine may be loaded
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
async def buses(own_nats_server):
    platform = await Bus.connect(own_nats_server.url, name="index-test-platform", **own_nats_server.login("platform"))
    await platform.bootstrap()
    rest = await Bus.connect(own_nats_server.url, name="index-test-rest", **own_nats_server.login("rest"))
    yield platform, rest
    await rest.close()
    await platform.close()


async def test_empty_buckets_make_a_ready_empty_index(buses):
    platform, rest = buses
    # First in this module, on a server of its own: the three buckets have never held a value.
    index = JobIndex()
    stopping = asyncio.Event()
    task = asyncio.ensure_future(index.run(rest, stopping))
    try:
        await until(lambda: index.ready, "an empty index to be ready")
        assert index.jobs == {}
        await (await platform.kv(Bucket.JOBS)).put("bob.first", submission("bob", "first"))
        await until(lambda: index.get("bob.first") is not None, "the first submission")
    finally:
        stopping.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_index_loads_the_buckets_then_follows_writes_and_deletes(buses):
    platform, rest = buses
    jobs, status, schedule = [await platform.kv(b) for b in (Bucket.JOBS, Bucket.JOB_STATUS, Bucket.SCHEDULE)]
    await jobs.put("ann.old", submission("ann", "old"))  # there before the index starts
    await status.put("ann.old", b'{"state": "RUNNING", "attempt": 2, "ignored": {"deep": [1, 2]}}')
    index = JobIndex()
    stopping = asyncio.Event()
    task = asyncio.ensure_future(index.run(rest, stopping))
    try:
        await until(lambda: index.ready, "the index to load")
        old = index.get("ann.old")
        assert old is not None and old.brief.name == "old" and old.status.state == JobState.RUNNING
        assert old.status.attempt == 2 and old.schedule is None

        await schedule.put("ann.new", b'{"attempt": 1, "placed": false, "reason": "VC default is full"}')
        await jobs.put("ann.new", submission("ann", "new"))  # its schedule entry came first: joined
        await until(lambda: index.get("ann.new") is not None, "the new submission")
        assert index.get("ann.new").schedule.reason == "VC default is full"

        await status.put("ann.old", b'{"state": "SUCCEEDED", "completedTime": 5.0}')
        await until(lambda: index.get("ann.old").status.state == JobState.SUCCEEDED, "the status change")

        await schedule.delete("ann.new")
        await until(lambda: index.get("ann.new").schedule is None, "the schedule entry's deletion")
        await status.purge("ann.old")
        await until(lambda: index.get("ann.old").status is None, "the status purge")
        await jobs.delete("ann.old")
        await until(lambda: index.get("ann.old") is None, "the submission's deletion")

        await jobs.put("ann.bad", b'{"not": "a submission"}')  # skipped loudly, the watch goes on
        await jobs.put("ann.after", submission("ann", "after"))
        await until(lambda: index.get("ann.after") is not None, "the submission after an unreadable one")
        assert index.get("ann.bad") is None and index.ready
    finally:
        stopping.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
