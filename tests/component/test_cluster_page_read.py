"""The Cluster page's reads of per-node buckets in one pass (services/rest/nodes.py
`latest_values`), over real HTTP with rest logged in to a real nats-server as `rest`:
GET /api/v2/portal/utilization shows each node's latest sample once, a node whose
sample was deleted not at all, and a value that is not a sample is left out rather
than failing the page; GET /api/v2/cluster/nodes lists every node of pai_node_health."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.nodes import NodeHealthRecord, encode_health, node_key
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.monitor.core.samples import GpuSample, NodeSample, encode_node_sample
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
NODES = [f"page-{RUN}-{n:03d}" for n in range(300)]
DELETED = set(NODES[::7])


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # buckets of its own: exactly these nodes


@pytest.fixture(scope="module")
async def pages(nats_server, tmp_path_factory) -> AsyncIterator[dict[str, object]]:
    platform = await Bus.connect(nats_server.url, name="page-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    first = {node_key(node): encode_node_sample(NodeSample(node=node, at=1.0, cpuPercent=1.0)) for node in NODES}
    # The latest sample is what the page shows: the second one.
    latest = {node_key(node): encode_node_sample(NodeSample(
        node=node, at=2.0, cpuPercent=float(n % 100),
        gpus=[GpuSample(index=0, uuid=f"GPU-{n}", utilizationGpuPercent=float(n % 100))])) for n, node in enumerate(NODES)}
    await platform.kv_write_many(Bucket.NODES, first)
    await platform.kv_write_many(Bucket.NODES, latest)
    await platform.kv_write_many(Bucket.NODES, {node_key(node): None for node in DELETED})
    await platform.kv_write_many(Bucket.NODE_HEALTH, {
        node_key(node): encode_health(NodeHealthRecord(node=node, heard=True)) for node in NODES})
    samples = await platform.kv(Bucket.NODES)
    await samples.put("not-a-sample", b"[1, 2")

    bus = await Bus.connect(nats_server.url, name="page-rest", **nats_server.login("rest"))
    ctx = ServiceContext(name="rest", config=load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("page"))),
                         bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    token = await auth.create_user(bus, f"pageviewer{RUN}")
    got: dict[str, object] = {}
    async with ClientSession() as session:
        for route in ("/api/v2/portal/utilization", "/api/v2/cluster/nodes"):
            async with session.get(server.make_url(route), headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 200, await resp.text()
                got[route] = json.loads(await resp.read())
    await server.close()
    await bus.close()
    await platform.close()
    return got


def test_utilization_shows_each_live_nodes_latest_sample_once(pages):
    nodes = pages["/api/v2/portal/utilization"]["nodes"]
    assert [n["node"] for n in nodes] == sorted(set(NODES) - DELETED)
    for node in nodes:
        n = NODES.index(node["node"])
        assert (node["at"], node["cpuPercent"], node["gpus"][0]["utilizationGpuPercent"]) == (2.0, n % 100, n % 100)


def test_the_node_list_has_every_node_with_a_health_record(pages):
    listed = pages["/api/v2/cluster/nodes"]
    assert sorted(n["metadata"]["name"] for n in listed) == sorted(NODES)
    assert all(n["agentSeen"] for n in listed)
