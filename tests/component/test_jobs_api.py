"""The rest of the v2 job API against a real nats-server: one attempt and its tasks,
task logs, tags, a job's events, the job list's filters, order and paging, one VC,
sku types, cluster info, and the submit-time "can never fit" refusal.

The launcher's job documents and the scheduler's cluster view are written here
as those services would write them; these tests are about rest's answers.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.logs import LOG_SUBJECT, LogReply, LogRequest
from libs.common.messages import ExitSpec, JobState, TaskState
from libs.common.records import AttemptRecord, JobRecord, TaskRecord, Transition, encode_job_record
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
OWNER, OTHER, ADMIN = f"alice{RUN}", f"bob{RUN}", f"root{RUN}"
SKUS = {"cpu": {"gpu": 0, "cpu": 1, "memory": 1024, "maxLeafCellsPerNode": 8}}
VIEW = ClusterView(
    virtualClusters=[{"name": "default", "skus": [{"sku": "cpu", "guaranteed": 6, "used": 2, "opportunistic": 1,
                                                    "total": 8, "unhealthy": 0}], "queued": 3, "running": 1}],
    skuTypes=SKUS,
)


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # this module writes the cluster view every rest reads


def job_yaml(name: str, *, instances: int = 1, role: str = "main") -> bytes:
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  {role}:\n    instances: {instances}\n"
            f"    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}\n    commands: [echo hi]\n").encode()


class Api:
    def __init__(self, server: TestServer, session: ClientSession, tokens: dict[str, str | None]):
        self.server, self.session, self.tokens = server, session, tokens

    async def call(self, who: str, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
                   ) -> tuple[int, Any, dict]:
        headers = {"Content-Type": content_type}
        if self.tokens.get(who):
            headers["Authorization"] = f"Bearer {self.tokens[who]}"
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        async with self.session.request(method, self.server.make_url(path), data=data, headers=headers) as resp:
            raw = await resp.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            return resp.status, parsed, dict(resp.headers)


@pytest.fixture(scope="module")
async def platform(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="jobs-api-test", **nats_server.login("platform"))
    await (await bus.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(VIEW))

    async def logs(msg):
        req = msgspec.json.decode(msg.data, type=LogRequest)
        await msg.respond(msgspec.json.encode(LogReply(found=True, data=f"log of {req.role}[{req.index}] "
                                                                         f"attempt {req.attempt}".encode())))

    subscription = await bus.nc.subscribe(LOG_SUBJECT, cb=logs)
    yield bus
    await subscription.unsubscribe()
    await bus.close()


@pytest.fixture(scope="module")
async def api(platform, nats_server, tmp_path_factory) -> AsyncIterator[Api]:
    rest_bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("rest")), rest_rate_limit_burst=10_000)
    ctx = ServiceContext(name="rest", config=config, bus=rest_bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    tokens: dict[str, str | None] = {"anonymous": None, "admin": await auth.ensure_admin(rest_bus, ADMIN)}
    tokens["owner"] = await auth.create_user(rest_bus, OWNER)
    tokens["other"] = await auth.create_user(rest_bus, OTHER)
    async with ClientSession() as session:
        yield Api(server, session, tokens)
    await server.close()
    await rest_bus.close()


async def submit(api: Api, who: str, name: str, **kwargs) -> str:
    status, body, _ = await api.call(who, "POST", "/api/v2/jobs", job_yaml(name, **kwargs), content_type="text/yaml")
    assert status == 202, body
    return body["job"]


async def write_status(platform: Bus, jid: str, record: JobRecord) -> None:
    await (await platform.kv(Bucket.JOB_STATUS)).put(ids.job_key(jid), encode_job_record(record))


def failed_then_running(jid: str, spec) -> JobRecord:
    now = time.time() + 10  # after the submission
    crashed = TaskRecord(role="main", index=0, state=TaskState.FAILED, exitCode=3, completedTime=now - 5,
                         exitSpec=ExitSpec(code=3, phrase="UserError"), node="n1", launchedTime=now - 9)
    first = AttemptRecord(attempt=1, state=JobState.FAILED, createdTime=now - 10, completedTime=now - 5,
                          tasks=[crashed], exitCode=3, endReason="retry 1/1 after exit code 3", isRetryCounted=True)
    second = AttemptRecord(attempt=2, state=JobState.RUNNING, createdTime=now - 4, launchedTime=now - 3,
                           tasks=[TaskRecord(role="main", index=0, state=TaskState.RUNNING, node="n1",
                                             launchedTime=now - 3, taskAttempt=0)])
    user, name = ids.split_job_id(jid)
    return JobRecord(job=jid, name=name, user=user, vc="default", spec=spec, state=JobState.RUNNING, attempt=2,
                     retries=1, createdTime=now - 10, attempts=[first, second], history=[
                         Transition(at=now - 9, from_=JobState.WAITING, to=JobState.RUNNING, attempt=1),
                         Transition(at=now - 5, from_=JobState.RUNNING, to=JobState.WAITING,
                                    why="retry 1/1 after exit code 3", attempt=2),
                         Transition(at=now - 3, from_=JobState.WAITING, to=JobState.RUNNING, attempt=2)])


# --- attempts, tasks, logs, events ----------------------------------------------------------


async def test_one_attempt_its_tasks_logs_and_events(api, platform):
    jid = await submit(api, "owner", f"retried{RUN}")
    kv = await platform.kv(Bucket.JOBS)
    from services.rest.records import SubmittedJob

    spec = msgspec.json.decode((await kv.get(ids.job_key(jid))).value, type=SubmittedJob).spec
    await write_status(platform, jid, failed_then_running(jid, spec))

    # OpenPAI's routes number attempts from 0; PAI's own number rides along as `attempt`.
    status, first, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/0")
    assert status == 200, first
    assert (first["attemptIndex"], first["attempt"], first["state"], first["isLatest"], first["frameworkName"]) == (
        0, 1, "FAILED", False, jid)
    assert first["taskRoles"]["main"]["taskStatuses"][0]["containerExitCode"] == 3
    status, second, _ = await api.call("admin", "GET", f"/api/v2/jobs/{jid}/job-attempts/1")
    assert (status, second["state"], second["isLatest"]) == (200, "RUNNING", True)
    status, listed, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/")  # a trailing slash too
    assert status == 200 and [(a["attemptIndex"], a["attempt"]) for a in listed] == [(1, 2), (0, 1)]
    status, text, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/healthz")
    assert (status, text) == (200, "ok")

    # OpenPAI's task routes under /attempts/{from 0}: the task's attempts, and where their logs are.
    task_path = f"/api/v2/jobs/{jid}/attempts/0/taskRoles/main/taskIndex/0/attempts"
    status, task, _ = await api.call("owner", "GET", task_path)
    assert (status, task["jobAttemptId"], task["taskState"], task["taskRoleName"]) == (200, 0, "FAILED", "main"), task
    assert task["attempts"][-1]["containerExitCode"] == 3
    last = task["attempts"][-1]["attemptId"]
    status, where, _ = await api.call("owner", "GET", f"{task_path}/{last}/logs?tailMode=true")
    assert status == 200 and where["locations"][0]["name"] == "all"
    uri = where["locations"][0]["uri"]
    assert f"/api/v2/jobs/{jid}/job-attempts/1/tasks/main/0/logs?" in uri and "tailBytes=" in uri
    status, text, _ = await api.call("owner", "GET", uri[uri.index("/api/"):])  # PAI's own route: attempt 1
    assert (status, text) == (200, "log of main[0] attempt 1")
    status, body, _ = await api.call("owner", "GET", f"{task_path}/9/logs")
    assert status == 404 and "no attempt 9" in body["message"]
    status, body, _ = await api.call("other", "GET", task_path)
    assert status == 403
    status, detail, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/attempts/0")
    assert (status, detail["jobStatus"]["attemptId"], detail["jobStatus"]["state"]) == (200, 0, "FAILED")
    assert detail["taskRoles"]["main"]["taskStatuses"][0]["containerExitCode"] == 3
    status, detail, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/attempts/1")
    assert (status, detail["jobStatus"]["attemptId"], detail["jobStatus"]["state"]) == (200, 1, "RUNNING")

    status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/2")
    assert (status, body["code"]) == (404, "NoJobError") and "from 0 as OpenPAI: 0, 1" in body["message"]
    status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/first")
    assert status == 400 and body["details"]["errors"][0]["path"] == "attempt"
    status, body, _ = await api.call("other", "GET", f"/api/v2/jobs/{jid}/job-attempts/0")
    assert (status, body["code"]) == (403, "ForbiddenUserError")

    status, task, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/1/tasks/main/0")
    assert (status, task["taskState"], task["containerExitCode"], task["taskRoleName"]) == (200, "FAILED", 3, "main")
    status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/1/tasks/ghost/0")
    assert status == 404 and "no task role 'ghost'" in body["message"]
    status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/1/tasks/main/7")
    assert status == 404 and "main[7]" in body["message"]

    status, text, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/1/tasks/main/0/logs")
    assert (status, text) == (200, "log of main[0] attempt 1")
    status, _, _ = await api.call("other", "GET", f"/api/v2/jobs/{jid}/job-attempts/1/tasks/main/0/logs")
    assert status == 403
    status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/1/tasks/main/0/logs?tailBytes=-1")
    assert status == 400 and body["details"]["errors"][0]["path"] == "tailBytes"

    status, events, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/events")
    assert status == 200
    reasons = [(e["type"], e["reason"]) for e in events["data"]]
    assert reasons[0] == ("Normal", "Submitted")
    assert ("Warning", "TaskFailed") in reasons and ("Warning", "Waiting") in reasons
    failed = next(e for e in events["data"] if e["reason"] == "TaskFailed")
    assert "code 3 (UserError)" in failed["message"] and failed["involvedObject"] == f"{jid}/main/0"
    times = [e["firstTimestamp"] for e in events["data"]]
    assert times == sorted(times)
    status, warnings, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/events?type=Warning")
    assert {e["type"] for e in warnings["data"]} == {"Warning"}
    status, _, _ = await api.call("other", "GET", f"/api/v2/jobs/{jid}/events")
    assert status == 403


async def test_a_waiting_job_says_why_in_its_events(api):
    jid = await submit(api, "owner", f"fresh{RUN}")
    status, events, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/events")
    assert status == 200
    assert events["data"][-1]["reason"] == "Waiting" and "scheduler" in events["data"][-1]["message"]
    status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs/{jid}/job-attempts/0")
    assert status == 404 and "none yet" in body["message"]


# --- tags and the job list -------------------------------------------------------------------


async def test_tags_owner_or_admin_only_and_validated(api):
    jid = await submit(api, "owner", f"tagged{RUN}")
    assert (await api.call("owner", "PUT", f"/api/v2/jobs/{jid}/tag", {"value": "baseline"}))[0] == 200
    status, body, _ = await api.call("owner", "PUT", f"/api/v2/jobs/{jid}/tag", {"value": "baseline"})
    assert status == 200 and "already" in body["message"]
    assert (await api.call("admin", "PUT", f"/api/v2/jobs/{jid}/tag", {"value": "v2.1"}))[0] == 200
    status, body, _ = await api.call("other", "PUT", f"/api/v2/jobs/{jid}/tag", {"value": "mine"})
    assert (status, body["code"]) == (403, "ForbiddenUserError")
    for bad, rule in ((" spaced", "pattern"), ("x" * 65, "maxLength"), (7, "type")):
        status, body, _ = await api.call("owner", "PUT", f"/api/v2/jobs/{jid}/tag", {"value": bad})
        assert status == 400 and body["details"]["errors"][0]["rule"] == rule
    status, body, _ = await api.call("owner", "PUT", f"/api/v2/jobs/{jid}/tag", {"tag": "x"})
    assert status == 400 and body["details"]["errors"][0]["path"] == "value"
    status, _, _ = await api.call("owner", "PUT", f"/api/v2/jobs/nobody~nothing{RUN}/tag", {"value": "x"})
    assert status == 404

    status, rows, _ = await api.call("other", "GET", f"/api/v2/jobs?keyword=tagged{RUN}")
    assert [r["tags"] for r in rows] == [["baseline", "v2.1"]]
    assert (await api.call("other", "GET", f"/api/v2/jobs/{jid}"))[1]["tags"] == ["baseline", "v2.1"]
    assert (await api.call("owner", "DELETE", f"/api/v2/jobs/{jid}/tag", {"value": "baseline"}))[0] == 200
    status, body, _ = await api.call("owner", "DELETE", f"/api/v2/jobs/{jid}/tag", {"value": "baseline"})
    assert status == 200 and "not tagged" in body["message"]
    status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword=tagged{RUN}")
    assert [r["tags"] for r in rows] == [["v2.1"]]


async def test_list_filters_order_and_paging(api):
    prefix = f"page{RUN}"
    made = [await submit(api, "owner", f"{prefix}{c}") for c in "cab"]
    await submit(api, "other", f"{prefix}z")
    await api.call("owner", "PUT", f"/api/v2/jobs/{made[0]}/tag", {"value": "keep"})
    await api.call("owner", "PUT", f"/api/v2/jobs/{made[1]}/tag", {"value": "drop"})

    status, rows, headers = await api.call("other", "GET", f"/api/v2/jobs?keyword={prefix.upper()}&username={OWNER}")
    assert status == 200 and headers["X-Total-Count"] == "3"
    assert [r["name"] for r in rows] == [f"{prefix}b", f"{prefix}a", f"{prefix}c"]  # newest first by default
    status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword={prefix}&order=name,ASC")
    assert [r["name"] for r in rows] == [f"{prefix}a", f"{prefix}b", f"{prefix}c", f"{prefix}z"]
    status, page, headers = await api.call("owner", "GET",
                                           f"/api/v2/jobs?keyword={prefix}&order=name,DESC&offset=1&limit=2&withTotalCount=true")
    assert page["totalCount"] == 4 and [r["name"] for r in page["data"]] == [f"{prefix}c", f"{prefix}b"]
    status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword={prefix}&tags=keep,other")
    assert [r["name"] for r in rows] == [f"{prefix}c"]
    status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword={prefix}&tagsNotContain=keep,drop")
    assert sorted(r["name"] for r in rows) == [f"{prefix}b", f"{prefix}z"]
    status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword={prefix}&state=waiting,running&vc=default")
    assert len(rows) == 4 and {r["state"] for r in rows} == {"WAITING"}
    status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword={prefix}&state=SUCCEEDED")
    assert rows == []

    for query, path in (("order=color,ASC", "order"), ("order=name,UP", "order"), ("state=DONE", "state"),
                        ("limit=0", "limit"), ("offset=-1", "offset"), ("limit=x", "offset")):
        status, body, _ = await api.call("owner", "GET", f"/api/v2/jobs?{query}")
        assert status == 400 and body["details"]["errors"][0]["path"] == path, (query, body)


# --- the cluster ---------------------------------------------------------------------------


async def test_one_virtual_cluster_sku_types_and_info(api):
    status, vc, _ = await api.call("other", "GET", "/api/v2/virtual-clusters/default")
    assert status == 200
    assert (vc["capacity"], vc["usedCapacity"], vc["queued"], vc["running"]) == (75.0, 37.5, 3, 1)
    assert vc["resourcesGuaranteed"] == {"cpu": 6, "memory": 6 * 1024, "gpu": 0}
    assert vc["resourcesTotal"]["cpu"] == 8
    status, every, _ = await api.call("other", "GET", "/api/v2/virtual-clusters")
    assert status == 200 and every == {"default": vc}  # the list shows each VC as its own route does
    status, body, _ = await api.call("other", "GET", "/api/v2/virtual-clusters/nowhere")
    assert (status, body["code"]) == (404, "NoVirtualClusterError") and "default" in body["message"]

    status, skus, _ = await api.call("other", "GET", "/api/v2/cluster/sku-types")
    assert (status, skus) == (200, {"cpu": {"gpu": 0, "cpu": 1, "memory": 1024}})
    assert (await api.call("other", "GET", "/api/v2/cluster/sku-types?vc=default"))[1] == skus
    assert (await api.call("other", "GET", "/api/v2/cluster/sku-types?vc=nowhere"))[0] == 404

    status, info, _ = await api.call("anonymous", "GET", "/api/v2/info")
    assert status == 200 and info["launcherType"] == "local" and info["authnMethod"] == "basic"
    assert (await api.call("anonymous", "GET", "/api/v2/jobs"))[0] == 401  # the rest stays private


async def test_a_job_that_can_never_fit_its_vc_is_refused_at_submit(api):
    status, body, _ = await api.call("owner", "POST", "/api/v2/jobs", job_yaml(f"huge{RUN}", instances=7, role="wide"),
                                     content_type="text/yaml")
    assert (status, body["code"]) == (400, "InvalidParametersError")
    (error,) = body["details"]["errors"]
    assert error["path"] == "taskRoles.wide" and error["rule"] == "never_fits"
    assert "needs 7 cpu cells" in error["message"] and "has 6 cpu cells in all" in error["message"]
    assert (await api.call("owner", "GET", f"/api/v2/jobs/{OWNER}~huge{RUN}"))[0] == 404
    await submit(api, "owner", f"fits{RUN}", instances=6)


async def test_list_reads_the_index_once_it_is_ready(api, platform):
    """A job written straight to the buckets (as after another replica's intake) appears through the watch."""
    from services.rest.jobs_api import INDEX

    index = api.server.app[INDEX]
    for _ in range(100):
        if index.ready:
            break
        await asyncio.sleep(0.1)
    assert index.ready
    jid = await submit(api, "owner", f"watched{RUN}")
    kv = await platform.kv(Bucket.JOBS)
    from services.rest.records import SubmittedJob

    sub = msgspec.json.decode((await kv.get(ids.job_key(jid))).value, type=SubmittedJob)
    await write_status(platform, jid, failed_then_running(jid, sub.spec))
    for _ in range(100):
        rows = (await api.call("owner", "GET", f"/api/v2/jobs?keyword=watched{RUN}"))[1]
        if rows and rows[0]["state"] == "RUNNING":
            break
        await asyncio.sleep(0.05)
    assert rows[0]["state"] == "RUNNING" and rows[0]["retries"] == 1
    await kv.delete(ids.job_key(jid))
    for _ in range(100):
        rows = (await api.call("owner", "GET", f"/api/v2/jobs?keyword=watched{RUN}"))[1]
        if not rows:
            break
        await asyncio.sleep(0.05)
    assert rows == []


async def test_the_list_index_is_rebuilt_after_nats_restarts(api, platform, nats_server):
    """Kill -9 NATS: rest's watches die with it; once it is back, jobs stored afterwards are listed."""
    from services.rest.jobs_api import INDEX
    from services.rest.records import SubmittedJob

    index = api.server.app[INDEX]
    template_jid = await submit(api, "owner", f"beforekill{RUN}")
    template = msgspec.json.decode((await (await platform.kv(Bucket.JOBS)).get(ids.job_key(template_jid))).value,
                                   type=SubmittedJob)
    nats_server.stop(kill=True)
    await asyncio.to_thread(nats_server.proc.wait)
    nats_server.start()
    for _ in range(300):  # both clients reconnect by themselves
        if platform.nc.is_connected and index.ready:
            break
        await asyncio.sleep(0.1)
    jid = f"{OWNER}~afterkill{RUN}"
    stored = msgspec.structs.replace(template, job=jid, name=f"afterkill{RUN}", published=True)
    for _ in range(50):  # JetStream may still be recovering its store
        try:
            await (await platform.kv(Bucket.JOBS)).put(ids.job_key(jid), msgspec.json.encode(stored))
            break
        except Exception:
            await asyncio.sleep(0.2)
    rows: list = []
    for _ in range(600):  # a loaded machine may take a while to rebuild the index
        status, rows, _ = await api.call("owner", "GET", f"/api/v2/jobs?keyword=kill{RUN}&order=name,ASC")
        if status == 200 and len(rows) == 2 and index.ready:  # the list may answer from the buckets first
            break
        await asyncio.sleep(0.1)
    assert [r["name"] for r in rows] == [f"afterkill{RUN}", f"beforekill{RUN}"]
    assert index.ready
