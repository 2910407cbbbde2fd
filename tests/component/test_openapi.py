"""The OpenAPI document against the served API: every route aiohttp serves is in
the document and every documented operation is served; the document and the
reference page are public; and schemathesis, driving the served document with
bounded generated requests, finds no 5xx and no response outside the schema
(the job, VC, cluster and info operations, which the document's `jobs` fragment
owns).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.logs import LOG_SUBJECT, LogReply
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import auth
from services.rest.app import create_app
from services.rest.openapi import document
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
METHODS = {"get", "put", "post", "delete", "patch"}
# Operations schemathesis drives: those of the jobs fragment (the others talk to the
# runtime, the monitor or stream forever, and have their own tests).
FUZZED_TAGS = ("jobs", "cluster", "docs")
# Bounded so the whole run stays under 40 s on two busy cores (schemathesis keeps
# generating until the time budget when the examples per operation allow more).
MAX_EXAMPLES = 20
MAX_SECONDS = 25


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # schemathesis writes jobs and tags; keep them out of other modules' lists


@pytest.fixture(scope="module")
async def served(nats_server, tmp_path_factory) -> AsyncIterator[tuple[TestServer, str, web.Application]]:
    platform = await Bus.connect(nats_server.url, name="openapi-test", **nats_server.login("platform"))
    view = ClusterView(virtualClusters=[{"name": "default", "skus": [{"sku": "cpu", "guaranteed": 4, "used": 0,
                                                                        "opportunistic": 0, "total": 4}]}],
                       skuTypes={"cpu": {"gpu": 0, "cpu": 1, "memory": 1024, "maxLeafCellsPerNode": 4}})
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))

    async def logs(msg):
        await msg.respond(msgspec.json.encode(LogReply(found=True, data=b"output")))

    subscription = await platform.nc.subscribe(LOG_SUBJECT, cb=logs)
    rest_bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("rest")), rest_rate_limit_burst=1_000_000,
                         rest_rate_limit_per_second=1_000_000.0)
    ctx = ServiceContext(name="rest", config=config, bus=rest_bus)
    app = await create_app(ctx)
    server = TestServer(app)
    await server.start_server()
    ctx.set_ready()
    token = await auth.ensure_admin(rest_bus, f"root{RUN}")
    yield server, token, app
    await server.close()
    await subscription.unsubscribe()
    await rest_bus.close()
    await platform.close()


def _served_operations(app: web.Application) -> set[tuple[str, str]]:
    found = set()
    for route in app.router.routes():
        method = route.method.lower()
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("formatter") or info.get("path")
        if method in METHODS and path:
            found.add((method, path))
    return found


def _documented_operations() -> set[tuple[str, str]]:
    return {(method, path) for path, item in document()["paths"].items() for method in item if method in METHODS}


def _identity_routes() -> set[tuple[str, str]]:
    from services.rest.identity import routes

    return {(r.method.lower(), r.path) for r in routes.routes}


async def test_every_served_route_is_documented_and_every_documented_one_is_served(served):
    _, _, app = served
    served_ops = _served_operations(app)
    documented = _documented_operations()
    undocumented = served_ops - documented
    if importlib.util.find_spec("services.rest.openapi.identity") is None:
        # The identity fragment is written with the identity routes; until it is, the
        # assembler leaves it out and only those routes may be missing.
        undocumented -= _identity_routes()
    assert undocumented == set(), f"routes served but not in the OpenAPI document: {sorted(undocumented)}"
    assert documented - served_ops == set(), f"documented but not served: {sorted(documented - served_ops)}"


async def test_document_and_reference_page_are_public(served):
    server, _, _ = served
    async with ClientSession() as session:
        async with session.get(server.make_url("/api/v2/openapi.json")) as resp:
            assert resp.status == 200
            doc = await resp.json()
        async with session.get(server.make_url("/api/v2/docs")) as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            page = await resp.text()
    assert doc["openapi"].startswith("3.1")
    assert "/api/v2/jobs/{job}/tag" in doc["paths"] and "JobRow" in doc["components"]["schemas"]
    assert doc["paths"]["/api/v2/info"]["get"]["security"] == []
    # The page renders from the document itself: no script or style from anywhere else.
    assert 'fetch("/api/v2/openapi.json")' in page and "http://" not in page and "https://" not in page


def _schemathesis() -> list[str] | None:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("schemathesis")
    return [found] if found else None


async def test_schemathesis_finds_no_server_error_and_no_response_outside_the_schema(served, tmp_path):
    command = _schemathesis()
    if command is None:
        pytest.skip("schemathesis is not installed (pip install -e .[test])")
    server, token, _ = served
    # A job of the admin's own, so generated calls can also reach an existing job.
    async with ClientSession() as session:
        body = (f"protocolVersion: 2\nname: fuzzed{RUN}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
                f"    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}\n    commands: [echo hi]\n")
        async with session.post(server.make_url("/api/v2/jobs"), data=body.encode(),
                                headers={"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"}) as resp:
            assert resp.status == 202, await resp.text()
    args = [*command, "run", str(server.make_url("/api/v2/openapi.json")),
            "--checks", "not_a_server_error,response_schema_conformance,content_type_conformance",
            "--header", f"Authorization: Bearer {token}",
            "--max-examples", str(MAX_EXAMPLES), "--phases", "examples,fuzzing", "--workers", "1",
            "--max-time", str(MAX_SECONDS), "--request-timeout", "20", "--seed", "1", "--no-color",
            "--report", "junit", "--report-junit-path", str(tmp_path / "junit.xml")]
    for tag in FUZZED_TAGS:
        args += ["--include-tag", tag]
    # In tmp_path: schemathesis keeps its example database in the working directory.
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=MAX_SECONDS + 60)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    assert "No issues found" in text or "passed" in text.lower(), text[-3000:]
