"""The monitor's alerts as people meet them: the monitor (`python -m services.monitor`)
against a real nats-server, rest's API served in this process, mail to a real SMTP
server (aiosmtpd).

- a job that asks for status-change mail mails its owner on success and on failure,
  once each, with the cause and solution;
- alert rules changed over the API take effect without a restart: an alert fires,
  is listed, is announced on the bus and mailed to the admins; a resolve notice
  follows; invalid rules are refused naming the rule and the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from email.message import Message
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from aiosmtpd.controller import Controller

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.ids import job_key
from libs.common.messages import (
    EventDeadLettered,
    ExitSpec,
    JobState,
    JobStateChanged,
    JobSubmitted,
    encode,
    subject_of,
)
from libs.common.natsserver import free_port
from libs.common.protocol.model import JobSpec
from libs.common.records import AttemptRecord, JobRecord, encode_job_record
from libs.common.schedule import ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.monitor.alerts.store import RuleDocument
from services.monitor.core.samples import GpuSample, NodeSample, encode_node_sample, node_key
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

REPO = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 30.0
ADMIN_MAIL = "ops@example.com"

# The rules this module's monitor starts with: nothing about nodes fires until an
# admin lowers the disk threshold over the API.
START_RULES = """
rules:
- name: NodeFilesystemUsage
  when: node_disk_usage
  threshold: 99
  summary: "the data disk of {node} is {value}% full"
  actions: [email-admin]
- name: JobFailed
  when: job_failed
  window: 1h
  sendResolved: false
  actions: [email-owner]
"""


class Inbox:
    def __init__(self):
        self.mails: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.mails.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"

    def to(self, address: str, words: str = "") -> list[Message]:
        return [m for rcpt, m in self.mails if address in rcpt and words in m["Subject"]]

    async def until(self, check: Callable[[], Any], what: str) -> Any:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            await asyncio.sleep(0.1)
        pytest.fail(f"never happened: {what}; mail so far: {[m['Subject'] for _, m in self.mails]}")


def text_of(message: Message) -> str:
    for part in message.walk():
        if part.get_content_type() == "text/plain":
            return part.get_payload(decode=True).decode()
    return ""


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
def smtp():
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, inbox
    controller.stop()


@pytest.fixture(scope="module")
async def bus(nats_server) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_server.url, name="alerts-test", **nats_server.login("platform"))
    await b.bootstrap()
    yield b
    await b.close()


class RestServer:
    def __init__(self, server: TestServer, tokens: dict[str, str]):
        self.server, self.tokens = server, tokens

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


@pytest.fixture(scope="module")
async def rest(bus, tmp_path_factory) -> AsyncIterator[RestServer]:
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("rest")))
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    tokens = {
        "admin": await auth.create_user(bus, f"root{RUN}", admin=True),
        "alice": await auth.create_user(bus, f"alice{RUN}", email=f"alice{RUN}@example.com"),
    }
    yield RestServer(server, tokens)
    await server.close()


class MonitorProcess:
    """`python -m services.monitor` as a cluster monitor; `restart` kills it (SIGKILL)
    and starts it again with the same settings."""

    def __init__(self, env: dict[str, str], port: int):
        self.env, self.port = env, port
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "services.monitor"], cwd=REPO, env=self.env)
        async with ClientSession() as http:
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                assert self.proc.poll() is None, "the monitor exited at start"
                with contextlib.suppress(Exception):
                    async with http.get(f"http://127.0.0.1:{self.port}/readyz") as resp:
                        if resp.status == 200:
                            return
                assert time.monotonic() < deadline, "the monitor never became ready"
                await asyncio.sleep(0.1)

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None:
            return
        self.proc.kill() if kill else self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    async def restart(self) -> None:
        self.stop(kill=True)
        await self.start()


@pytest.fixture(scope="module")
async def monitor(nats_server, bus, smtp, rest, tmp_path_factory) -> AsyncIterator[MonitorProcess]:
    controller, _ = smtp
    data = tmp_path_factory.mktemp("monitor")
    rules = data / "alert-rules.yaml"
    rules.write_text(START_RULES)
    port = free_port()
    env = {
        **os.environ, **nats_server.env("monitor"),
        "PAI_NATS_URL": nats_server.url, "PAI_MONITOR_PORT": str(port), "PAI_DATA_DIR": str(data),
        "PAI_MONITOR_MODE": "cluster", "PAI_NODE_LOST_SECONDS": "3600",
        "PAI_SMTP_HOST": controller.hostname, "PAI_SMTP_PORT": str(controller.port),
        "PAI_ADMIN_EMAILS": ADMIN_MAIL, "PAI_MAIL_FROM": "pai@cluster.example",
        "PAI_PORTAL_URL": rest.url, "PAI_ALERT_RULES_FILE": str(rules),
        "PAI_ALERT_EVALUATE_SECONDS": "0.2", "PAI_ALERT_PROBE_URLS": "-", "PAI_USAGE_REPORT_WEEKDAY": "-1",
    }
    process = MonitorProcess(env, port)
    try:
        await process.start()
        yield process
    finally:
        process.stop()


class Api:
    def __init__(self, server: TestServer, session: ClientSession, tokens: dict[str, str]):
        self.server, self.session, self.tokens = server, session, tokens

    async def call(self, who: str, method: str, path: str, *, body: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
        sent = {"Authorization": f"Bearer {self.tokens[who]}", "Content-Type": "text/yaml", **(headers or {})}
        if isinstance(body, (dict, list)):
            body, sent["Content-Type"] = json.dumps(body), "application/json"
        async with self.session.request(method, self.server.make_url(path), data=body, headers=sent) as resp:
            return resp.status, await resp.json(), resp.headers.copy()


@pytest.fixture(scope="module")
async def api(rest, monitor) -> AsyncIterator[Api]:
    async with ClientSession() as session:
        yield Api(rest.server, session, rest.tokens)


def submitted(job: str, notify: bool) -> JobSubmitted:
    user, name = job.split("~")
    spec = JobSpec(name=name, user=user, virtualCluster="default", notifyOnStateChange=notify)
    return JobSubmitted(id=f"{job}/submitted", job=job, at=time.time(), spec=spec)


def changed(job: str, state: JobState, **fields: Any) -> JobStateChanged:
    return JobStateChanged(id=f"{job}/1/state/{state}", job=job, vc="default", user=job.split("~")[0], attempt=1,
                           state=state, at=time.time(), **fields)


async def test_a_job_asking_for_status_mail_mails_its_owner_on_success_and_failure(bus, api, smtp):
    _, inbox = smtp
    owner = f"alice{RUN}@example.com"
    ok, bad, quiet = f"alice{RUN}~ok", f"alice{RUN}~bad", f"alice{RUN}~quiet"
    oom = ExitSpec(code=137, phrase="ContainerOOMKilled", reason="the task used more memory than it asked for",
                   solution=["raise memoryMB of the task role"])
    for event in (submitted(ok, True), submitted(bad, True), submitted(quiet, False),
                  changed(ok, JobState.RUNNING), changed(ok, JobState.SUCCEEDED),
                  changed(bad, JobState.FAILED, exitCode=137, exitSpec=oom),
                  changed(quiet, JobState.SUCCEEDED)):
        await bus.publish(event)

    [success] = await inbox.until(lambda: inbox.to(owner, f"job {ok} succeeded"), "the success mail")
    assert f"{api.server.make_url('')}".rstrip("/") + f"/api/v2/jobs/{ok}" in text_of(success)
    [failure] = await inbox.until(lambda: inbox.to(owner, f"job {bad} failed"), "the failure mail")
    assert failure["Subject"] == f"[PAI] job {bad} failed: ContainerOOMKilled"
    assert "the task used more memory than it asked for" in text_of(failure)
    assert "raise memoryMB of the task role" in text_of(failure)
    assert inbox.to(owner, f"job {ok} is running")

    # A redelivered event (a new stream message carrying the same event) mails nobody again.
    again = changed(ok, JobState.SUCCEEDED)
    await bus.js.publish(subject_of(again), encode(again), headers={"Nats-Msg-Id": f"redelivery/{uuid.uuid4()}"})
    await asyncio.sleep(2)
    assert len(inbox.to(owner, f"job {ok} succeeded")) == 1
    assert not inbox.to(owner, quiet), "a job that did not ask sends no status mail"
    # JobFailed (email-owner) mails the owner too, and lists the alert for them.
    await inbox.until(lambda: inbox.to(owner, "JobFailed"), "the JobFailed alert mail")
    status, body, _ = await api.call("alice", "GET", f"/api/v2/alerts?job={bad}")
    assert status == 200 and [a["rule"] for a in body["alerts"]] == ["JobFailed"]


async def put_sample(bus: Bus, node: str, disk_percent: float) -> None:
    kv = await bus.kv(Bucket.NODES)
    sample = NodeSample(node=node, at=time.time(), diskUsedBytes=int(disk_percent * 10), diskTotalBytes=1000,
                        memoryUsedBytes=1, memoryTotalBytes=100)
    await kv.put(node_key(node), encode_node_sample(sample))


async def test_rules_changed_over_the_api_take_effect_without_a_restart(bus, api, smtp, monitor):
    _, inbox = smtp
    node = f"gpu-{RUN}"
    firing_events: list[dict] = []

    async def seen(msg) -> None:
        firing_events.append(msgspec.json.decode(msg.data))

    subscription = await bus.nc.subscribe("pai.v1.alert.firing.>", cb=seen)
    await put_sample(bus, node, 80.0)
    await asyncio.sleep(1.5)
    status, body, _ = await api.call("admin", "GET", "/api/v2/alerts?state=firing")
    assert not [a for a in body["alerts"] if a["node"] == node], "80% is under the starting threshold of 99%"

    status, current, headers = await api.call("admin", "GET", "/api/v2/alerts/rules")
    assert status == 200 and current["source"] == "file" and headers["ETag"] == f'"{current["revision"]}"'
    lowered = START_RULES.replace("threshold: 99", "threshold: 50")
    status, changed_rules, _ = await api.call("admin", "PUT", "/api/v2/alerts/rules", body=lowered,
                                              headers={"If-Match": headers["ETag"]})
    assert status == 200, changed_rules
    assert changed_rules["source"] == "admin" and changed_rules["changedBy"] == f"root{RUN}"

    [mail] = await inbox.until(lambda: inbox.to(ADMIN_MAIL, f"NodeFilesystemUsage (warning) {node}"), "the alert mail")
    assert mail["Subject"].startswith("[PAI] [FIRING:1]")
    assert f"the data disk of {node} is 80.0% full" in text_of(mail)
    status, body, _ = await api.call("admin", "GET", "/api/v2/alerts?state=firing")
    [listed] = [a for a in body["alerts"] if a["node"] == node]
    assert listed["rule"] == "NodeFilesystemUsage" and listed["state"] == "firing"
    await inbox.until(lambda: [e for e in firing_events if e["labels"].get("node") == node], "the AlertFiring event")
    async with ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{monitor.port}/metrics") as resp:
            scraped = await resp.text()
    assert 'pai_alerts_firing{rule="NodeFilesystemUsage",severity="warning"} 1.0' in scraped
    assert 'pai_alert_mails_total{kind="alert",outcome="sent"}' in scraped
    status, body, _ = await api.call("alice", "GET", "/api/v2/alerts")
    assert not [a for a in body["alerts"] if a["node"] == node], "a user sees alerts about their own jobs only"

    await put_sample(bus, node, 20.0)
    [resolved] = await inbox.until(lambda: inbox.to(ADMIN_MAIL, f"[RESOLVED] NodeFilesystemUsage (warning) {node}"),
                                   "the resolve notice")
    assert len(inbox.to(ADMIN_MAIL, f"[FIRING:1] NodeFilesystemUsage (warning) {node}")) == 1, "mailed once"
    await subscription.unsubscribe()

    # The stale revision is refused: someone changed the rules since.
    status, body, _ = await api.call("admin", "PUT", "/api/v2/alerts/rules", body=START_RULES,
                                     headers={"If-Match": headers["ETag"]})
    assert status == 412, body
    status, body, _ = await api.call("admin", "POST", "/api/v2/alerts/rules/reset")
    assert status == 200 and body["source"] == "file"


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ("rules: [{name: Disk, when: node_disk_usage, threshold: 150}]", "rules[0] (Disk).threshold"),
        ("rules: [{name: Wait, when: job_waiting, actions: [cordon-node]}]", "rules[0] (Wait).actions[0]"),
        ("rules: [{name: Down, when: service_gone}]", "rules[0] (Down).when"),
    ],
)
async def test_invalid_rules_are_refused_naming_rule_and_field(api, document, path):
    status, body, _ = await api.call("admin", "PUT", "/api/v2/alerts/rules", body=document)
    assert status == 400, body
    assert path in [e["path"] for e in body["details"]["errors"]]
    assert path in body["message"]


async def test_only_admins_change_rules_or_read_the_report(api):
    status, body, _ = await api.call("alice", "PUT", "/api/v2/alerts/rules", body=START_RULES)
    assert status == 403 and body["code"] == "ForbiddenUserError"
    status, _, _ = await api.call("alice", "GET", "/api/v2/report")
    assert status == 403


async def test_the_usage_report_on_demand_and_mailed(api, smtp):
    _, inbox = smtp
    status, report, _ = await api.call("admin", "GET", "/api/v2/report?days=7")
    assert status == 200 and {"gpuHoursByVc", "gpuHoursByUser", "topJobs", "idleGpus"} <= set(report)
    assert report["mailed"] is False
    status, body, _ = await api.call("admin", "GET", "/api/v2/report?days=0")
    assert status == 400 and body["details"]["errors"][0]["path"] == "days"
    status, report, _ = await api.call("admin", "POST", "/api/v2/report?days=7")
    assert status == 200 and report["mailed"] is True
    await inbox.until(lambda: inbox.to(ADMIN_MAIL, "usage report"), "the report mail")


async def run_pai(api: Api, who: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PAI_URL": str(api.server.make_url("")).rstrip("/"), "PAI_TOKEN": api.tokens[who]}
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env,
                                   input=stdin, capture_output=True, text=True, timeout=60)


async def test_the_pai_command_reads_and_sets_rules_and_reports(api, tmp_path):
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("rules: [{name: Cpu, when: node_cpu_usage, threshold: high}]\n")
    good = tmp_path / "good.yaml"
    good.write_text(START_RULES)
    # Run side by side (each is mostly a Python start): none changes anything, the two
    # sets being refused (checked below), so no answer depends on another's.
    got, refused, stale, listed, report = await asyncio.gather(
        run_pai(api, "admin", "alerts", "rules", "get"),
        run_pai(api, "admin", "alerts", "rules", "set", str(wrong)),
        run_pai(api, "admin", "alerts", "rules", "set", str(good), "--revision", "99999"),
        run_pai(api, "alice", "alerts", "--json"),
        run_pai(api, "admin", "report", "--json", "--days", "1"),
    )
    assert got.returncode == 0, got.stderr
    assert "rules:" in got.stdout and "revision" in got.stderr
    assert refused.returncode == 2
    assert "rules[0] (Cpu).threshold" in refused.stderr.replace("\n", " ")
    assert stale.returncode == 2 and "412" in stale.stderr
    assert listed.returncode == 0 and isinstance(json.loads(listed.stdout)["alerts"], list)
    assert report.returncode == 0 and "gpuHoursByVc" in json.loads(report.stdout)


ACTION_RULES = """
rules:
- {name: EccCordon, when: gpu_ecc_double_bit, actions: [cordon-node]}
- {name: StuckJob, when: job_waiting, threshold: 1s, actions: [stop-job, tag-job]}
"""


async def test_actions_cordon_the_node_stop_and_tag_the_job(bus, api):
    node = f"ecc-{RUN}"
    requests: list[tuple[str, dict]] = []

    async def seen(msg) -> None:
        requests.append((msg.subject, msgspec.json.decode(msg.data)))

    subscriptions = [await bus.nc.subscribe("pai.v1.node.cordon.>", cb=seen),
                     await bus.nc.subscribe("pai.v1.job.stop_requested.>", cb=seen)]
    status, body, _ = await api.call("admin", "PUT", "/api/v2/alerts/rules", body=ACTION_RULES)
    assert status == 200, body
    try:
        kv = await bus.kv(Bucket.NODES)
        gpu = GpuSample(index=0, uuid="GPU-0", eccErrors={"volatile_double": 3})
        await kv.put(node_key(node), encode_node_sample(NodeSample(node=node, at=time.time(), gpus=[gpu])))
        job_yaml = (f"protocolVersion: 2\nname: stuck{RUN}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
                    "    commands:\n      - sleep 1\n")
        status, body, _ = await api.call("alice", "POST", "/api/v2/jobs", body=job_yaml)
        assert status == 202, body
        job = body["job"]

        cordons = await Inbox().until(
            lambda: [r for s, r in requests if r["kind"] == "node.cordon" and r["node"] == node], "the cordon request")
        assert cordons[0]["cordoned"] is True and cordons[0]["by"] == "alert EccCordon"
        assert cordons[0]["reason"] == f"EccCordon on {node}"
        stops = await Inbox().until(
            lambda: [r for s, r in requests if r["kind"] == "job.stop_requested" and r["job"] == job], "the stop request")
        assert stops[0]["by"] == "alert StuckJob"

        async def tagged() -> bool:
            status, rows, _ = await api.call("alice", "GET", "/api/v2/jobs?tags=alert:StuckJob")
            return status == 200 and any(row.get("name") == f"stuck{RUN}" for row in rows)

        deadline = time.monotonic() + WAIT_SECONDS
        while not await tagged():
            assert time.monotonic() < deadline, "the job was never tagged alert:StuckJob"
            await asyncio.sleep(0.2)
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()
        await api.call("admin", "POST", "/api/v2/alerts/rules/reset")


async def test_a_dead_lettered_event_is_listed_and_mailed_to_the_admins_once(bus, api, smtp):
    _, inbox = smtp
    job = f"alice{RUN}~poison"
    event = EventDeadLettered(id=f"{job}/1/placed/dead-lettered/launcher", job=job, at=time.time(),
                              consumer="launcher", eventId=f"{job}/1/placed", eventKind="job.placed",
                              subject="pai.v1.job.placed.default.x.y", deliveries=5, reason="KeyError: 'gpus'")
    await bus.publish(event)
    [mail] = await inbox.until(lambda: inbox.to(ADMIN_MAIL, "EventDeadLettered"), "the dead-letter mail")
    assert mail["Subject"] == "[PAI] [FIRING:1] EventDeadLettered (critical) " + job
    assert "KeyError: 'gpus'" in text_of(mail)
    status, body, _ = await api.call("alice", "GET", f"/api/v2/alerts?job={job}")
    assert status == 200 and [a["rule"] for a in body["alerts"]] == ["EventDeadLettered"]
    await bus.js.publish(subject_of(event), encode(event), headers={"Nats-Msg-Id": f"redelivery/{uuid.uuid4()}"})
    await asyncio.sleep(2)
    assert len(inbox.to(ADMIN_MAIL, "EventDeadLettered")) == 1


async def test_a_restarted_monitor_neither_fires_again_nor_mails_before_the_repeat_interval(bus, api, smtp, monitor):
    _, inbox = smtp
    node = f"full-{RUN}"
    firing_ids: list[str] = []

    async def seen(msg) -> None:
        event = msgspec.json.decode(msg.data)
        if event["labels"].get("node") == node:
            firing_ids.append(event["id"])

    subscription = await bus.nc.subscribe("pai.v1.alert.firing.>", cb=seen)
    status, body, _ = await api.call("admin", "PUT", "/api/v2/alerts/rules",
                                     body=START_RULES.replace("threshold: 99", "threshold: 50"))
    assert status == 200, body
    try:
        await put_sample(bus, node, 90.0)
        await inbox.until(lambda: inbox.to(ADMIN_MAIL, f"NodeFilesystemUsage (warning) {node}"), "the alert mail")
        status, body, _ = await api.call("admin", "GET", "/api/v2/alerts?state=firing")
        [before] = [a for a in body["alerts"] if a["node"] == node]

        await monitor.restart()  # SIGKILL, then the same monitor again
        await put_sample(bus, node, 90.0)
        await asyncio.sleep(3)  # many evaluations at 0.2 s
        assert len(inbox.to(ADMIN_MAIL, f"NodeFilesystemUsage (warning) {node}")) == 1, "mailed again after a restart"
        status, body, _ = await api.call("admin", "GET", "/api/v2/alerts?state=firing")
        [after] = [a for a in body["alerts"] if a["node"] == node]
        assert after["startsAt"] == before["startsAt"], "the restarted monitor fired the alert again"
        assert len(set(firing_ids)) == 1
    finally:
        await subscription.unsubscribe()
        await put_sample(bus, node, 10.0)
        await api.call("admin", "POST", "/api/v2/alerts/rules/reset")


async def test_a_restarted_monitor_knows_why_a_job_it_restored_waits(bus, api, monitor):
    job = f"alice{RUN}~queued"
    long_ago = time.time() - 2 * 3600
    spec = JobSpec(name="queued", user=f"alice{RUN}", virtualCluster="default")
    reason = "VC default has 0 of the 8 GPUs this job needs free; 3 jobs ahead of it"
    await (await bus.kv(Bucket.JOB_STATUS)).put(job_key(job), encode_job_record(JobRecord(
        job=job, name="queued", user=f"alice{RUN}", vc="default", spec=spec, createdTime=long_ago,
        attempts=[AttemptRecord(attempt=1, createdTime=long_ago)])))
    await (await bus.kv(Bucket.SCHEDULE)).put(job_key(job), msgspec.json.encode(ScheduleEntry(
        job=job, attempt=1, vc="default", reason=reason, updatedAt=long_ago)))
    rules = "rules: [{name: PaiJobPending, when: job_waiting, threshold: 1h, summary: '{job} waited {value}: {reason}'}]"
    status, body, _ = await api.call("admin", "PUT", "/api/v2/alerts/rules", body=rules)
    assert status == 200, body
    try:
        await monitor.restart()  # restores the job from the launcher's record, its reason from the scheduler's
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            status, body, _ = await api.call("alice", "GET", f"/api/v2/alerts?job={job}")
            if body["alerts"]:
                break
            assert time.monotonic() < deadline, "PaiJobPending never fired for the restored job"
            await asyncio.sleep(0.2)
        assert body["alerts"][0]["summary"] == f"{job} waited 2h00m: {reason}"
    finally:
        await api.call("admin", "POST", "/api/v2/alerts/rules/reset")


async def test_a_rule_change_written_by_another_replica_is_taken_up_from_the_bucket(bus, api, smtp):
    """What another monitor replica's change looks like to this one: a new value of
    `rules` in pai_alert_rules, which it watches."""
    _, inbox = smtp
    node = f"watched-{RUN}"
    await put_sample(bus, node, 70.0)
    kv = await bus.kv(Bucket.ALERT_RULES)
    document = RuleDocument(yaml=START_RULES.replace("threshold: 99", "threshold: 60"), by="replica-b", at=time.time())
    try:
        entry = await kv.get("rules")
        await kv.update("rules", msgspec.json.encode(document), last=entry.revision)
    except nats.js.errors.KeyNotFoundError:
        await kv.create("rules", msgspec.json.encode(document))
    try:
        await inbox.until(lambda: inbox.to(ADMIN_MAIL, f"NodeFilesystemUsage (warning) {node}"), "the alert mail")
        status, body, _ = await api.call("admin", "GET", "/api/v2/alerts/rules")
        assert body["changedBy"] == "replica-b" and "threshold: 60" in body["rules"]
    finally:
        await put_sample(bus, node, 10.0)
        await api.call("admin", "POST", "/api/v2/alerts/rules/reset")
