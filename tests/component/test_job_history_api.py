"""rest's API over the history database against a real nats-server, with the history
projection paused (rest's consumer never runs): a job only the database has (its live
records expired) is listed, with its events and attempts; a job just submitted is
listed at once beside it (read-your-writes), and so are its tags."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import auth, jobs_api
from services.rest.app import create_app
from services.rest.history import consumer, projection, store
from services.rest.history.wiring import HISTORY
from tests.fixtures import history_events as ev
from tests.fixtures.settings import IN_PROCESS_ENV
from tests.fixtures.waiting import eventually

RUN = uuid.uuid4().hex[:6]
OWNER, OTHER = f"ann{RUN}", f"bob{RUN}"
OLD = f"{OWNER}~expired{RUN}"
VIEW = ClusterView(virtualClusters=[{"name": "default", "skus": [{"sku": "cpu", "guaranteed": 8, "total": 8}]}],
                   skuTypes={"cpu": {"gpu": 0, "cpu": 1, "memory": 1024, "maxLeafCellsPerNode": 8}})


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
async def api(nats_server, tmp_path_factory) -> AsyncIterator[tuple]:
    paused = pytest.MonkeyPatch()

    async def never(bus, engine, stopping, **_):  # the projection paused: nothing reaches the database
        await asyncio.Event().wait()

    paused.setattr(consumer, "run", never)
    platform = await Bus.connect(nats_server.url, name="history-api-test", **nats_server.login("platform"))
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(VIEW))
    bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("rest")), rest_rate_limit_burst=10_000)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    app = await create_app(ctx)
    server = TestServer(app)
    await server.start_server()
    ctx.set_ready()
    engine = app[HISTORY].engine
    assert engine is not None
    # A finished job the buckets no longer hold: in the database alone.
    events = ev.lifecycle(OLD, exit_code=3)
    batch = list(enumerate(events, start=1))
    await store.apply_batch(engine, projection.project_batch(batch), len(batch), len(batch))
    tokens = {"owner": await auth.create_user(bus, OWNER), "other": await auth.create_user(bus, OTHER)}
    index = app[jobs_api.INDEX]
    await eventually(lambda: asyncio.sleep(0, index.ready), timeout=10.0, every=0.1)
    async with ClientSession() as session:

        async def call(who: str, method: str, path: str, body: bytes | None = None, ctype="application/json"):
            headers = {"Authorization": f"Bearer {tokens[who]}", "Content-Type": ctype}
            async with session.request(method, server.make_url(path), data=body, headers=headers) as resp:
                return resp.status, json.loads(await resp.read())

        yield call, engine
    await server.close()
    await bus.close()
    await platform.close()
    paused.undo()


async def test_a_job_only_the_history_has_is_listed_with_its_events_and_attempts(api):
    call, _ = api
    status, rows = await call("owner", "GET", f"/api/v2/jobs?username={OWNER}")
    assert status == 200 and [(r["debugId"], r["state"]) for r in rows] == [(OLD, "FAILED")]
    status, events = await call("owner", "GET", f"/api/v2/jobs/{OLD}/events")
    assert status == 200
    assert [e["reason"] for e in events["data"]] == ["Submitted", "Running", "TaskFailed", "TaskExplained", "Failed"]
    status, warnings = await call("owner", "GET", f"/api/v2/jobs/{OLD}/events?type=Warning")
    assert [e["reason"] for e in warnings["data"]] == ["TaskFailed", "TaskExplained", "Failed"]
    status, attempts = await call("owner", "GET", f"/api/v2/jobs/{OLD}/job-attempts")
    assert status == 200 and len(attempts) == 1 and attempts[0]["state"] == "FAILED"
    (task,) = attempts[0]["taskRoles"]["worker"]["taskStatuses"]
    assert task["taskState"] == "FAILED" and task["containerExitCode"] == 3
    assert (await call("other", "GET", f"/api/v2/jobs/{OLD}/events"))[0] == 403  # the owner's and admins' only
    assert (await call("owner", "GET", f"/api/v2/jobs/{OWNER}~never{RUN}/events"))[0] == 404


async def test_a_job_just_submitted_is_listed_at_once_with_the_projection_paused(api):
    call, engine = api
    name = f"fresh{RUN}"
    yaml = (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            f"    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}\n    commands: [echo hi]\n").encode()
    status, body = await call("owner", "POST", "/api/v2/jobs", yaml, "text/yaml")
    assert status == 202, body
    fresh = body["job"]
    status, rows = await call("owner", "GET", f"/api/v2/jobs?username={OWNER}")
    assert [(r["debugId"], r["state"]) for r in rows] == [(fresh, "WAITING"), (OLD, "FAILED")]
    # Tags: the index's row at once; the database's copy written too (the tags filter reads it there).
    status, _ = await call("owner", "PUT", f"/api/v2/jobs/{fresh}/tag", b'{"value": "gold"}')
    assert status == 200
    status, rows = await call("owner", "GET", "/api/v2/jobs?tags=gold&withTotalCount=true")
    assert rows["totalCount"] == 1 and rows["data"][0]["debugId"] == fresh and rows["data"][0]["tags"] == ["gold"]
