"""A node whose agent goes silent is lost: its task ends (PodNodeLost), the job runs
again on the other node, and nothing new is placed on the lost one. Admins
cordon a node through the API and the reason reaches the jobs that wait.

Two nodes from tests/fixtures/clusters/two-nodes.yaml, both on this machine
(the local backend), each with a node agent of its own (`python -m
services.monitor --agent`, NODE_NAME=node-a / node-b); the platform's monitor
runs in cluster mode (node health only, no agent for this host).

The platform mails through a real SMTP server (aiosmtpd, in this process) with
one admin address and a rules document of one rule, NodeNotReady, evaluated
every half second: the admin gets one mail when a node is lost, none again
within the repeat interval, and a resolve notice when its agent is back. A
job's owner who asks for status mail (jobStatusChangeNotification) gets it
when the job succeeds and when it fails.
"""

from __future__ import annotations

import asyncio
import email
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from email.message import Message
from pathlib import Path

import msgspec
import pytest
from aiosmtpd.controller import Controller

from cli.client import ApiError, Client, Connection
from cli.up import Platform
from libs.common.natsserver import free_port
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests/fixtures/clusters/two-nodes.yaml"
LOST_AFTER_SECONDS = 3.0
ADMIN = "ops@cluster.example"
# Only the rule under test, so every mail the admin gets is about it; the lost
# node's NodeStatus fires it (its own silence threshold is left at the default).
RULES = """\
repeatInterval: 1h
rules:
  - name: NodeNotReady
    when: node_not_ready
    for: 0s
    severity: critical
    actions: [email-admin]
    sendResolved: true
    summary: "node {node} is not ready: {reason}"
"""


class Inbox:
    """What the SMTP server received (aiosmtpd calls handle_DATA from its own thread)."""

    def __init__(self):
        self.mails: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.mails.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"

    def about(self, node: str, since: int = 0) -> list[tuple[list[str], str]]:
        """(recipients, subject) of the NodeNotReady mails naming `node`, from mail number `since` on."""
        return [(to, str(m["Subject"])) for to, m in self.mails[since:]
                if "NodeNotReady" in str(m["Subject"]) and node in str(m["Subject"])]


async def until_mail(inbox: Inbox, node: str, since: int, count: int, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    while len(found := inbox.about(node, since)) < count:
        assert time.monotonic() < deadline, f"{count} mail(s) about {node} expected; got {found}"
        await asyncio.sleep(0.2)
    return found


class Agents:
    """One node agent process per node name."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, node: str) -> None:
        env = {**self.platform._env("monitor"), "NODE_NAME": node, "PAI_MONITOR_PORT": str(free_port())}
        log = open(self.platform.logs / f"agent-{node}.log", "ab")
        self.procs[node] = subprocess.Popen(
            [sys.executable, "-m", "services.monitor", "--agent"], env=env, stdout=log, stderr=log, cwd=REPO
        )

    def stop(self, node: str) -> None:
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGKILL)  # as a machine that goes away: no goodbye
        proc.wait()

    def stop_all(self) -> None:
        for node in list(self.procs):
            self.stop(node)


@pytest.fixture(scope="module")
def smtp():
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller, inbox
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smtp):
    controller, _ = smtp
    data = tmp_path_factory.mktemp("pai-nodes")
    rules = data.parent / f"{data.name}-rules.yaml"
    rules.write_text(RULES)
    config = msgspec.structs.replace(
        platform_config(data, monitor_mode="cluster", node_lost_seconds=LOST_AFTER_SECONDS),
        cluster_file=str(CLUSTER),
        node_sample_seconds=0.5,
        smtp_host=controller.hostname,
        smtp_port=controller.port,
        admin_emails=ADMIN,
        alert_rules_file=str(rules),
        alert_evaluate_seconds=0.5,
        usage_report_weekday=-1,  # no weekly report in the admin's inbox
    )
    platform = Platform(config, print_fn=lambda *_: None)
    agents = Agents(platform)
    try:
        conn = platform.start()
        for node in ("node-a", "node-b"):
            agents.start(node)
        yield Api(platform, conn), agents
    finally:
        agents.stop_all()
        from tests.chaos.harness import _stop_quickly  # idle services are not awaited in NATS drain

        _stop_quickly(platform)


async def nodes(api: Api) -> dict[str, dict]:
    return {row["name"]: row for row in await api.client.request("GET", "/api/v2/cluster/nodes")}


async def until_node(api: Api, node: str, check, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    row: dict = {}
    while time.monotonic() < deadline:
        row = (await nodes(api)).get(node, {})
        if row and check(row):
            return row
        await asyncio.sleep(0.2)
    raise AssertionError(f"node {node} never matched; last: {row}")


def logs_of(api: Api) -> str:
    """The end of the services' logs, for a failure message."""
    ends = []
    for name in ("launcher", "runtime", "scheduler", "monitor"):
        path = api.platform.logs / f"{name}.log"
        if path.exists():
            ends.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
    return "\n".join(ends)


def task_nodes(detail: dict) -> list[str]:
    return [t.get("containerNodeName") for info in detail["taskRoles"].values() for t in info["taskStatuses"]]


@pytest.fixture
def shared_dir():
    """A directory tasks (which may run as uids of their own) can write to. Not under
    pytest's tmp_path: a concurrent pytest session makes /tmp/pytest-of-<user> 0700
    again, which locks other uids out of everything below it."""
    path = Path(tempfile.mkdtemp(prefix="pai-node-lost-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


GANG = ""
# A task retried alone (taskRetryCount) must not be retried on its lost node.
TASK_RETRY = "extras:\n  gangAllocation: false\n"


@pytest.mark.parametrize("extras", [GANG, TASK_RETRY], ids=["gang", "non-gang-task-retry"])
async def test_a_node_whose_agent_stops_is_lost_and_its_job_runs_again_elsewhere(cluster, smtp, shared_dir, extras):
    api, agents = cluster
    _, inbox = smtp
    for node in ("node-a", "node-b"):
        await until_node(api, node, lambda row: row["agentSeen"] and row["healthy"])
    mails_before = len(inbox.mails)
    name = f"lost-{uuid.uuid4().hex[:6]}"
    marker = shared_dir / "runs"
    # First run: note it and keep running (until its node is lost); a later run ends at once.
    script = f"if [ -s {marker} ]; then echo again >> {marker}; exit 0; fi; echo first >> {marker}; sleep 600"
    body = job_yaml(name, [script], retry=0, extra=extras)
    if extras == TASK_RETRY:
        body = body.replace("    instances: 1\n", "    instances: 1\n    taskRetryCount: 2\n", 1)
    await api.submit(body)
    job = f"admin~{name}"
    detail = await api.wait_state(job, "RUNNING")
    [first_node] = task_nodes(detail)
    other = "node-b" if first_node == "node-a" else "node-a"
    for _ in range(100):
        if marker.exists() and marker.read_text().strip():
            break
        await asyncio.sleep(0.1)

    agents.stop(first_node)
    row = await until_node(api, first_node, lambda r: not r["healthy"], timeout=LOST_AFTER_SECONDS + 20)
    assert row["conditions"] == ["lost"] and "no sample from its agent" in row["reason"]
    [(to, subject)] = await until_mail(inbox, first_node, mails_before, 1)
    assert to == [ADMIN] and subject.startswith("[PAI] [FIRING:1] NodeNotReady (critical)"), subject

    detail = await api.wait_state(job, {"SUCCEEDED", "FAILED"}, timeout=60)
    status = detail["jobStatus"]
    assert status["state"] == "SUCCEEDED", (status.get("appExitSpec"), status.get("appExitDiagnostics"), logs_of(api))
    assert task_nodes(detail) == [other]  # placed again, away from the lost node
    assert marker.read_text().split() == ["first", "again"]  # the first run was really ended, once
    attempts = await api.client.request("GET", f"/api/v2/jobs/{job}/job-attempts")
    # A second attempt, not a task retried in place on the lost node (non-gang, taskRetryCount 2).
    assert sorted(a["attempt"] for a in attempts) == [1, 2]
    lost_attempt = min(attempts, key=lambda a: a["attempt"])
    spec = lost_attempt["exitSpec"] or {}
    assert (spec.get("code"), spec.get("phrase")) == (-1001, "PodNodeLost"), lost_attempt
    # PodNodeLost is PAI's failure, not the job's: it did not use its jobRetryCount (0).
    assert detail["jobStatus"]["retries"] == 0

    # Nothing new goes to the lost node while it is lost.
    for i in range(2):
        await api.submit(job_yaml(f"{name}-after{i}", ["true"]))
    for i in range(2):
        after = await api.wait_state(f"admin~{name}-after{i}", "SUCCEEDED")
        assert task_nodes(after) == [other]

    # Many evaluations later, well inside the repeat interval: still that one mail.
    assert len(inbox.about(first_node, mails_before)) == 1, inbox.about(first_node, mails_before)
    assert not inbox.about(other, mails_before), "the healthy node is nobody's concern"

    # Its agent comes back: healthy again, with no one's help, and the admin hears so.
    agents.start(first_node)
    await until_node(api, first_node, lambda r: r["healthy"], timeout=30)
    *_, (to, resolved) = await until_mail(inbox, first_node, mails_before, 2)
    assert to == [ADMIN] and resolved.startswith("[PAI] [RESOLVED] NodeNotReady"), resolved


async def test_admins_cordon_a_node_and_the_reason_shows_where_jobs_wait(cluster):
    api, agents = cluster
    for node in ("node-a", "node-b"):
        await until_node(api, node, lambda row: row["agentSeen"] and row["healthy"])
    reason = f"replacing a fan {uuid.uuid4().hex[:4]}"
    for node in ("node-a", "node-b"):
        answer = await api.client.request("PUT", f"/api/v2/cluster/nodes/{node}/cordon", json_body={"reason": reason})
        assert answer["cordoned"] is True
    for node in ("node-a", "node-b"):
        row = await until_node(api, node, lambda r: r["cordoned"])
        assert row["conditions"] == ["cordoned"] and row["cordonReason"] == reason and row["cordonedBy"] == "admin"

    name = f"cordoned-{uuid.uuid4().hex[:6]}"
    await api.submit(job_yaml(name, ["true"]))
    job = f"admin~{name}"
    deadline = time.monotonic() + 20
    waiting = ""
    while time.monotonic() < deadline and reason not in waiting:
        waiting = (await api.job(job))["jobStatus"].get("waitingReason") or ""
        await asyncio.sleep(0.2)
    assert f"node-a: cordoned by admin: {reason}" in waiting, waiting

    await api.client.request("DELETE", "/api/v2/cluster/nodes/node-b/cordon")
    detail = await api.wait_state(job, "SUCCEEDED")
    assert task_nodes(detail) == ["node-b"]
    await api.client.request("DELETE", "/api/v2/cluster/nodes/node-a/cordon")
    await until_node(api, "node-a", lambda r: r["healthy"] and not r["cordoned"])


async def test_cordon_refuses_non_admins_unknown_nodes_and_a_missing_reason(cluster):
    api, _ = cluster
    with pytest.raises(ApiError) as missing:
        await api.client.request("PUT", "/api/v2/cluster/nodes/node-a/cordon", json_body={})
    assert missing.value.status == 400 and missing.value.body["details"]["errors"][0]["path"] == "reason"
    with pytest.raises(ApiError) as unknown:
        await api.client.request("PUT", "/api/v2/cluster/nodes/node-zz/cordon", json_body={"reason": "x"})
    assert unknown.value.status == 404 and "node-a" in unknown.value.body["message"]
    with pytest.raises(ApiError) as bad:
        await api.client.request("PUT", "/api/v2/cluster/nodes/no%20de/cordon", json_body={"reason": "x"})
    assert bad.value.status == 400
    name = f"bob{uuid.uuid4().hex[:4]}"
    created = await api.client.request("POST", "/api/v2/users", json_body={"username": name})
    bob = Client(Connection(url=api.conn.url, token=created["token"]))
    with pytest.raises(ApiError) as forbidden:
        await bob.request("PUT", "/api/v2/cluster/nodes/node-a/cordon", json_body={"reason": "mine now"})
    assert forbidden.value.status == 403
    assert len(await bob.request("GET", "/api/v2/cluster/nodes")) == 2  # anyone may look


async def test_an_owner_asking_for_status_mail_is_mailed_when_the_job_succeeds_and_when_it_fails(cluster, smtp):
    api, _ = cluster
    _, inbox = smtp
    owner = f"carol{uuid.uuid4().hex[:4]}"
    address = f"{owner}@example.com"
    created = await api.client.request("POST", "/api/v2/users", json_body={"username": owner, "email": address})
    carol = Api(api.platform, Connection(url=api.conn.url, token=created["token"]))
    notify = "extras:\n  jobStatusChangeNotification: true\n"
    good, bad = f"fine-{uuid.uuid4().hex[:4]}", f"broken-{uuid.uuid4().hex[:4]}"
    await carol.submit(job_yaml(good, ["true"], extra=notify))
    await carol.submit(job_yaml(bad, ["exit 3"], extra=notify))
    await carol.wait_state(f"{owner}~{good}", "SUCCEEDED")
    await carol.wait_state(f"{owner}~{bad}", "FAILED")

    def to_owner() -> list[str]:
        return [str(m["Subject"]) for to, m in inbox.mails if to == [address]]

    wanted = (f"[PAI] job {owner}~{good} succeeded", f"[PAI] job {owner}~{bad} failed")  # failed: the exit phrase follows
    deadline = time.monotonic() + 30
    while not all(any(subject.startswith(w) for subject in to_owner()) for w in wanted):
        assert time.monotonic() < deadline, to_owner()
        await asyncio.sleep(0.2)
    # Once per attempt and state, whatever the bus redelivers.
    assert len(to_owner()) == len(set(to_owner())), to_owner()
