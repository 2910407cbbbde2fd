"""GET /api/v2/cluster/nodes: each node shaped like a Kubernetes Node, with its
health from the monitor's pai_node_health and its cells from the scheduler's
cluster view; PAI's flat fields kept for the CLI and the portal."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.nodes import NodeHealthRecord, encode_health, node_key
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
HEALTHY, LOST, SILENT, AGENT_ONLY = (f"{kind}-{RUN}" for kind in ("healthy", "lost", "silent", "agentonly"))


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # a cluster view of its own, not another test's


@pytest.fixture(scope="module")
async def nodes(nats_server, tmp_path_factory) -> AsyncIterator[list[dict]]:
    platform = await Bus.connect(nats_server.url, name="nodes-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    view = ClusterView(
        nodes=[
            {"name": HEALTHY, "cells": [{"address": f"rack/{HEALTHY}", "cellType": "a100-node", "sku": "a100",
                                         "leafCells": 8, "pinnedCellId": None}]},
            {"name": LOST, "cells": [{"address": f"rack/{LOST}", "cellType": "cpu-node", "sku": "cpu",
                                      "leafCells": 4, "pinnedCellId": "pinned-1"}]},
            {"name": SILENT, "cells": []},
        ],
        skuTypes={"a100": {"gpu": 1, "cpu": 8, "memory": 65536}, "cpu": {"gpu": 0, "cpu": 1, "memory": 2048}},
    )
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))
    health = await platform.kv(Bucket.NODE_HEALTH)
    for record in (
        NodeHealthRecord(node=HEALTHY, heard=True, lastHeard=1_700_000_100.0, since=1_700_000_000.0),
        NodeHealthRecord(node=LOST, healthy=False, conditions=["lost"], reason="no sample for 60 s", heard=True,
                         since=1_700_000_200.0, cordoned=True, cordonReason="disk swap", cordonedBy="admin"),
        NodeHealthRecord(node=AGENT_ONLY, heard=True),
    ):
        await health.put(node_key(record.node), encode_health(record))

    bus = await Bus.connect(nats_server.url, name="nodes-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("nodes")))
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    token = await auth.create_user(bus, f"viewer{RUN}")
    async with ClientSession() as session:
        async with session.get(server.make_url("/api/v2/cluster/nodes"),
                               headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200
            listed = json.loads(await resp.read())
    await server.close()
    await bus.close()
    await platform.close()
    return listed


def by_name(nodes: list[dict]) -> dict[str, dict]:
    return {node["metadata"]["name"]: node for node in nodes}


def test_every_node_of_the_cluster_or_an_agent_is_listed_by_name(nodes):
    assert [n["name"] for n in nodes] == sorted([HEALTHY, LOST, SILENT, AGENT_ONLY])
    assert all(n["kind"] == "Node" and n["metadata"]["name"] == n["name"] for n in nodes)
    assert by_name(nodes)[AGENT_ONLY]["inClusterConfig"] is False and by_name(nodes)[HEALTHY]["inClusterConfig"]


def test_a_healthy_node_is_ready_with_its_cells_and_capacity(nodes):
    node = by_name(nodes)[HEALTHY]
    assert node["status"]["conditions"] == [{
        "type": "Ready", "status": "True", "reason": "Healthy", "message": "",
        "lastTransitionTime": "2023-11-14T22:13:20Z", "lastHeartbeatTime": "2023-11-14T22:15:00Z"}]
    assert node["cells"] == [{"address": f"rack/{HEALTHY}", "cellType": "a100-node", "sku": "a100", "leafCells": 8,
                              "pinnedCellId": None}]
    # 8 leaf cells of 1 GPU, 8 cores and 64 GiB each.
    assert node["status"]["capacity"] == {"cpu": "64", "memory": "524288Mi", "nvidia.com/gpu": "8"}
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert node["spec"] == {"unschedulable": False, "taints": []}
    assert node["metadata"]["labels"] == {"pai/sku": "a100"}
    assert (node["healthy"], node["agentSeen"], node["cordoned"]) == (True, True, False)


def test_a_lost_cordoned_node_says_why_and_takes_no_work(nodes):
    node = by_name(nodes)[LOST]
    ready, lost = node["status"]["conditions"]
    assert (ready["type"], ready["status"], ready["message"]) == ("Ready", "False", "no sample for 60 s")
    assert (lost["type"], lost["status"]) == ("lost", "True")
    assert node["spec"]["unschedulable"] is True
    assert {(t["key"], t["value"], t["effect"]) for t in node["spec"]["taints"]} == {
        ("pai/cordoned", "disk swap", "NoSchedule"), ("pai/unhealthy", "no sample for 60 s", "NoSchedule")}
    assert node["status"]["allocatable"] == {"cpu": "0", "memory": "0Mi", "nvidia.com/gpu": "0"}
    assert node["cells"][0]["pinnedCellId"] == "pinned-1"
    # PAI's flat fields, as `pai nodes` and the portal read them.
    assert (node["healthy"], node["conditions"], node["cordoned"], node["cordonReason"], node["cordonedBy"]) == (
        False, ["lost"], True, "disk swap", "admin")


def test_a_node_no_agent_reported_is_of_unknown_readiness(nodes):
    node = by_name(nodes)[SILENT]
    (ready,) = node["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("Unknown", "NoAgent")
    assert node["agentSeen"] is False and node["cells"] == [] and node["status"]["capacity"] == {}
