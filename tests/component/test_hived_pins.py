"""Roles of one job pinned to different pinned cells, as a user sees it: rest takes the job
(or refuses an unknown pin at submit, naming the field), the scheduler service places each
role in its own pinned cell (tests/fixtures/clusters/pinned-cells.yaml: VC team has pin-a =
node p1 and pin-b = node p2)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import Config, load_config
from libs.common.schedule import ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable
from services.rest import auth
from services.rest.app import create_app
from services.scheduler.core import SchedulerCore
from services.scheduler.service import CONSUMED, CONSUMED_KINDS, SchedulerShell
from tests.conftest import platform_bus
from tests.fixtures.settings import IN_PROCESS_ENV
from tests.unit.scheduler.builders import cluster

RUN = uuid.uuid4().hex[:6]
USER = f"pin{RUN}"


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # the scheduler restores from whole buckets


@pytest.fixture(scope="module")
async def scheduler(nats_server) -> AsyncIterator[SchedulerCore]:
    async with platform_bus(nats_server, durables=[Durable.SCHEDULER]):
        pass
    bus = await Bus.connect(nats_server.url, name="scheduler", **nats_server.login("scheduler"))
    ctx = ServiceContext(name="scheduler", config=Config(), bus=bus)
    core = SchedulerCore(cluster("pinned-cells"), clock=time.time)
    shell = SchedulerShell(ctx, core)
    await shell.restore()
    await shell.publish_view()  # the cluster view rest checks pins against
    consuming = asyncio.create_task(bus.consume_batches(Durable.SCHEDULER, CONSUMED_KINDS, CONSUMED,
                                                        shell.handle_batch, stopping=ctx.stopping, ordered=True))
    yield core
    ctx.stopping.set()
    consuming.cancel()
    await asyncio.gather(consuming, return_exceptions=True)
    await bus.close()


@pytest.fixture(scope="module")
async def rest(nats_server, scheduler, tmp_path_factory) -> AsyncIterator[tuple[ClientSession, TestServer, str, Bus]]:
    bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("rest")))
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    admin = await auth.ensure_admin(bus, f"root{RUN}")
    async with ClientSession() as session:
        group = {"groupname": f"team{RUN}", "extension": {"acls": {"virtualClusters": ["team"]}}}
        async with session.post(server.make_url("/api/v2/groups"), json=group,
                                headers={"Authorization": f"Bearer {admin}"}) as resp:
            assert resp.status == 201, await resp.text()
        token = await auth.create_user(bus, USER, grouplist=["default", f"team{RUN}"])
        yield session, server, token, bus
    await server.close()
    await bus.close()


def pinned_job(name: str, ps_pin: str, worker_pin: str) -> str:
    return json.dumps({
        "protocolVersion": 2, "name": name, "type": "job", "defaults": {"virtualCluster": "team"},
        "taskRoles": {role: {"instances": 1, "commands": ["sleep 1"],
                             "resourcePerInstance": {"gpu": gpus, "cpu": 1, "memoryMB": 512}}
                      for role, gpus in (("ps", 1), ("worker", 2))},
        "extras": {"hivedScheduler": {"taskRoles": {"ps": {"pinnedCellId": ps_pin},
                                                    "worker": {"pinnedCellId": worker_pin}}}},
    })


async def post(rest, body: str) -> tuple[int, dict]:
    session, server, token, _ = rest
    async with session.post(server.make_url("/api/v2/jobs"), data=body.encode(),
                            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


async def test_roles_pinned_apart_run_each_in_its_pinned_cell(rest):
    status, body = await post(rest, pinned_job(f"apart{RUN}", "pin-a", "pin-b"))
    assert status == 202, body
    schedule = await rest[3].kv(Bucket.SCHEDULE)
    deadline = time.monotonic() + 30
    entry = None
    while time.monotonic() < deadline:
        try:
            stored = await schedule.get(f"{USER}.apart{RUN}")
        except Exception:  # noqa: BLE001 - not written yet
            stored = None
        if stored is not None and stored.value:
            entry = msgspec.json.decode(stored.value, type=ScheduleEntry)
            if entry.placed:
                break
        await asyncio.sleep(0.1)
    assert entry is not None and entry.placed, entry
    assert sorted((t.role, t.node) for t in entry.tasks) == [("ps", "p1"), ("worker", "p2")]


async def test_an_unknown_pin_is_refused_at_submit_naming_the_field(rest):
    status, body = await post(rest, pinned_job(f"nowhere{RUN}", "pin-a", "pin-z"))
    assert status == 400, body
    (error,) = body["details"]["errors"]
    assert error["path"] == "extras.hivedScheduler.taskRoles.worker.pinnedCellId"
    assert "pin-z" in error["message"] and "pin-a, pin-b" in error["message"]
