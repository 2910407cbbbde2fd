"""The monitor as users run it (`python -m services.monitor`) against a real
nats-server: events in, /metrics and the `pai_nodes` bucket out.

Every test starts its own monitor process (so counters start at zero) and uses
job and VC names of its own: the stream and the durable consumer "monitor" are
shared with the rest of the session, and JetStream dedupes by event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from libs.common.bus import Bus, get_json
from libs.common.ids import job_key
from libs.common.messages import (
    ExitSpec,
    JobState,
    JobStateChanged,
    JobSubmitted,
    NodeStatus,
    TaskExited,
    TaskVerdict,
    encode,
    subject_of,
)
from libs.common.natsserver import NatsServer, free_port
from libs.common.protocol.model import JobSpec
from libs.common.records import JobRecord, encode_job_record
from libs.common.subjects import Bucket
from services.monitor.core import NodeSample, node_key

REPO = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 20.0


class Scrape:
    """One /metrics answer, sample by sample."""

    def __init__(self, text: str):
        self.text = text
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))


class Monitor:
    def __init__(self, proc: subprocess.Popen, port: int, http: aiohttp.ClientSession):
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"
        self.http = http

    async def scrape(self) -> Scrape:
        async with self.http.get(f"{self.base}/metrics") as resp:
            assert resp.status == 200
            return Scrape(await resp.text())

    async def until(self, condition: Callable[[Scrape], bool], what: str = "") -> Scrape:
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            assert self.proc.poll() is None, "the monitor exited"
            scrape = await self.scrape()
            if condition(scrape):
                return scrape
            if time.monotonic() > deadline:
                pai = "\n".join(line for line in scrape.text.splitlines() if RUN in line)
                wanted = f" (wanted {what})" if what else ""
                pytest.fail(f"metrics never matched{wanted}; lines of this run:\n{pai}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def monitor_process(nats: NatsServer, data_dir: Path, node: str) -> AsyncIterator[Monitor]:
    port = free_port()
    env = {
        **os.environ,
        "PAI_NATS_URL": nats.url,
        **nats.env("monitor"),  # logs in as the monitor, allowed only what it owns
        "PAI_MONITOR_PORT": str(port),
        "PAI_DATA_DIR": str(data_dir),
        "PAI_NODE_SAMPLE_SECONDS": "0.2",
        "NODE_NAME": node,
    }
    proc = subprocess.Popen([sys.executable, "-m", "services.monitor"], cwd=REPO, env=env)
    try:
        async with aiohttp.ClientSession() as http:
            monitor = Monitor(proc, port, http)
            await wait_ready(monitor)
            yield monitor
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_ready(monitor: Monitor) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        assert monitor.proc.poll() is None, "the monitor exited at start"
        with contextlib.suppress(aiohttp.ClientError):
            async with monitor.http.get(f"{monitor.base}/readyz") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.1)
    pytest.fail("the monitor never became ready")


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """This module's own server (see tests/conftest.py, own_nats_server)."""
    return own_nats_server


@pytest.fixture
async def bus(nats_server) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_server.url, name="monitor-test", **nats_server.login("platform"))
    await b.bootstrap()
    yield b
    await b.close()


@pytest.fixture
async def monitor(nats_server, bus, tmp_path) -> AsyncIterator[Monitor]:
    async with monitor_process(nats_server, tmp_path, f"node-{RUN}") as m:
        yield m


# --- events ---------------------------------------------------------------------


def job(name: str) -> str:
    return f"alice~{name}{RUN}"


def submitted(jid: str, vc: str) -> JobSubmitted:
    user, name = jid.split("~")
    spec = JobSpec(name=name, user=user, virtualCluster=vc)
    return JobSubmitted(id=f"{jid}/submitted", job=jid, at=time.time(), spec=spec)


def state(jid: str, vc: str, to: JobState, *, attempt: int = 1, since: float | None = None) -> JobStateChanged:
    return JobStateChanged(
        id=f"{jid}/{attempt}/state/{to}", job=jid, vc=vc, user="alice", attempt=attempt, state=to, sinceSubmit=since
    )


async def redeliver(bus: Bus, event) -> None:
    """The same event once more, as the monitor sees a redelivery: a new stream
    message (another Nats-Msg-Id, so JetStream keeps it) carrying the same event."""
    await bus.js.publish(subject_of(event), encode(event), headers={"Nats-Msg-Id": f"redelivery/{uuid.uuid4()}"})


def waiting_count(vc: str) -> Callable[[Scrape], bool]:
    return lambda s: s.value("pai_jobs", state="WAITING", vc=vc) == 1


# --- tests ----------------------------------------------------------------------


async def test_job_gauges_and_submit_to_running_histogram_follow_the_events(bus, monitor):
    vc = f"vc{RUN}a"
    done, running, queued = job("done"), job("running"), job("queued")
    for event in [
        submitted(done, vc),
        submitted(running, vc),
        submitted(queued, vc),
        state(done, vc, JobState.WAITING, since=0.0),
        state(done, vc, JobState.RUNNING, since=0.02),
        state(running, vc, JobState.RUNNING, since=1.5),
        state(done, vc, JobState.SUCCEEDED, since=4.0),
    ]:
        await bus.publish(event)

    scrape = await monitor.until(lambda s: s.value("pai_jobs", state="SUCCEEDED", vc=vc) == 1)
    assert {st: scrape.value("pai_jobs", state=st, vc=vc) for st in JobState} == {
        "WAITING": 1,
        "RUNNING": 1,
        "STOPPING": 0,
        "SUCCEEDED": 1,
        "FAILED": 0,
        "STOPPED": 0,
    }
    assert scrape.value("pai_job_submit_to_running_seconds_count", vc=vc) == 2
    assert scrape.value("pai_job_submit_to_running_seconds_sum", vc=vc) == pytest.approx(1.52)
    assert scrape.value("pai_job_submit_to_running_seconds_bucket", vc=vc, le="0.02") == 1
    assert scrape.value("pai_job_submit_to_running_seconds_bucket", vc=vc, le="1.0") == 1
    assert scrape.value("pai_job_submit_to_running_seconds_bucket", vc=vc, le="2.0") == 2


async def test_a_redelivered_state_change_is_counted_once(bus, monitor):
    vc = f"vc{RUN}b"
    jid, marker = job("redelivered"), job("marker")
    running = state(jid, vc, JobState.RUNNING, since=0.3)
    await bus.publish(submitted(jid, vc))
    await bus.publish(running)
    before = await monitor.until(lambda s: s.value("pai_jobs", state="RUNNING", vc=vc) == 1)

    await redeliver(bus, running)
    await redeliver(bus, submitted(jid, vc))
    await bus.publish(submitted(marker, vc))  # handled after the redeliveries
    after = await monitor.until(waiting_count(vc))

    assert after.value("pai_jobs", state="RUNNING", vc=vc) == 1
    assert after.value("pai_job_submit_to_running_seconds_count", vc=vc) == 1
    def delta(kind: str) -> float:
        return after.value("pai_events_total", kind=kind) - before.value("pai_events_total", kind=kind)

    assert (delta("job.state"), delta("job.submitted")) == (0, 1)


async def test_task_exits_are_counted_as_success_or_by_verdict_phrase(bus, monitor):
    vc = f"vc{RUN}c"
    jid = job("tasks")

    def exited(index: int, code: int) -> TaskExited:
        return TaskExited(
            id=f"{jid}/1/w/{index}/0/exited", job=jid, vc=vc, attempt=1, role="w", index=index, exitCode=code
        )

    def verdict(index: int, code: int, phrase: str) -> TaskVerdict:
        return TaskVerdict(
            id=f"{jid}/1/w/{index}/0/verdict",
            job=jid,
            vc=vc,
            attempt=1,
            role="w",
            index=index,
            exitCode=code,
            spec=ExitSpec(code=code, phrase=phrase),
        )

    for event in [
        exited(0, 0),
        verdict(0, 0, "Succeeded"),
        exited(1, 0),
        exited(2, 137),
        verdict(2, 137, "ContainerOOMKilled"),
    ]:
        await bus.publish(event)
    scrape = await monitor.until(lambda s: s.value("pai_task_exits_total", vc=vc, outcome="ContainerOOMKilled") == 1)
    assert scrape.value("pai_task_exits_total", vc=vc, outcome="success") == 2
    assert scrape.value("pai_task_exits_total", vc=vc, outcome="Succeeded") is None


async def test_node_status_events_show_in_node_up(bus, monitor):
    other = f"10.9.{RUN}.1"
    lost = NodeStatus(id=f"node/{other}/down", job="", node=other, healthy=False, at=time.time(), reason="NodeLost")
    await bus.publish(lost)
    scrape = await monitor.until(lambda s: s.value("pai_node_up", node=other) == 0)
    assert scrape.value("pai_node_up", node=f"node-{RUN}") == 1  # this machine, sampled
    # pai_node_count{ready,...} counts the nodes the node health heard from: this one.
    counted = sum(v for (name, _), v in scrape.samples.items() if name == "pai_node_count")
    assert counted >= 1


async def test_the_sampler_stores_this_node_in_the_nodes_bucket(bus, monitor):
    kv = await bus.kv(Bucket.NODES)
    deadline = time.monotonic() + WAIT_SECONDS
    while (got := await get_json(kv, node_key(f"node-{RUN}"), NodeSample)) is None:
        assert time.monotonic() < deadline, "no node sample stored"
        await asyncio.sleep(0.05)
    sample: NodeSample = got[0]
    assert sample.node == f"node-{RUN}"
    assert sample.cpuCount >= 1 and 0 < sample.memoryUsedBytes <= sample.memoryTotalBytes
    assert sample.diskTotalBytes > 0
    if not sample.gpus:  # the usual case on a machine without NVIDIA GPUs: a note, not an error
        assert sample.gpuNote
    # An unlabelled gauge reads 0 from the start, before the first sample sets it:
    # wait for the values this sample must produce, not for the gauge to exist.
    # The agent labels its series with its node's name (dashboards pick a node by it).
    node = sample.node
    scrape = await monitor.until(
        lambda s: s.value("pai_node_memory_total_bytes", node=node) == sample.memoryTotalBytes
        and s.value("nvidiasmi_attached_gpus", node=node) == len(sample.gpus),
        what=f"pai_node_memory_total_bytes {sample.memoryTotalBytes}, nvidiasmi_attached_gpus {len(sample.gpus)} of {node}",
    )
    assert scrape.value("pai_node_memory_total_bytes", node=node) == sample.memoryTotalBytes
    assert scrape.value("pai_node_memory_total_bytes") is None, "no series of this machine without its node"
    assert monitor.proc.poll() is None


def job_record(jid: str, vc: str, to: JobState, attempt: int = 1) -> JobRecord:
    user, name = jid.split("~")
    spec = JobSpec(name=name, user=user, virtualCluster=vc)
    return JobRecord(job=jid, name=name, user=user, vc=vc, spec=spec, state=to, attempt=attempt)


async def test_gauges_are_rebuilt_from_the_launcher_records_after_a_restart(nats_server, bus, tmp_path):
    vc = f"vc{RUN}d"
    running, done, marker = job("kept"), job("finished"), job("after")
    status = await bus.kv(Bucket.JOB_STATUS)
    await status.put(job_key(running), encode_job_record(job_record(running, vc, JobState.RUNNING)))
    await status.put(job_key(done), encode_job_record(job_record(done, vc, JobState.FAILED, attempt=2)))
    await status.put(f"alice.broken{RUN}", b'{"not": "a job record"}')

    async with monitor_process(nats_server, tmp_path, f"node-{RUN}") as first:
        await bus.publish(submitted(running, vc))
        await bus.publish(state(running, vc, JobState.RUNNING, since=0.1))
        await first.until(lambda s: s.value("pai_job_submit_to_running_seconds_count", vc=vc) == 1)

    async with monitor_process(nats_server, tmp_path, f"node-{RUN}") as second:
        restored = await second.until(lambda s: s.value("pai_jobs", state="RUNNING", vc=vc) == 1)
        assert restored.value("pai_jobs", state="FAILED", vc=vc) == 1
        # Events older than the records change nothing.
        await redeliver(bus, state(done, vc, JobState.RUNNING, attempt=1, since=9.0))
        await redeliver(bus, submitted(running, vc))
        await bus.publish(submitted(marker, vc))
        after = await second.until(waiting_count(vc))
        assert {st: after.value("pai_jobs", state=st, vc=vc) for st in ("WAITING", "RUNNING", "FAILED")} == {
            "WAITING": 1,
            "RUNNING": 1,
            "FAILED": 1,
        }


async def test_a_dead_lettered_event_becomes_a_critical_alert_on_the_bus(bus, monitor):
    from libs.common.messages import AlertFiring, EventDeadLettered, decode
    from libs.common.subjects import STREAM, Kind, kind_filter

    jid = job("poisoned")
    letter = EventDeadLettered(
        id=f"{jid}/submitted/dead-lettered/launcher", job=jid, cause=f"{jid}/submitted", at=time.time(),
        consumer="launcher", eventId=f"{jid}/submitted", eventKind="job.submitted",
        subject=f"pai.v1.job.submitted.default.alice.{jid.split('~')[1]}", deliveries=5, reason="RuntimeError: boom",
    )
    await bus.publish(letter)
    sub = await bus.js.pull_subscribe(kind_filter(Kind.ALERT_FIRING), stream=STREAM)
    deadline = time.monotonic() + WAIT_SECONDS
    found: list[AlertFiring] = []
    while not found and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            for msg in await sub.fetch(50, timeout=0.5):
                event = decode(msg.data)
                if event.job == jid:
                    found.append(event)
    await sub.unsubscribe()
    assert found, "the monitor raised no alert for the dead-lettered event"
    assert found[0].rule == "EventDeadLettered" and found[0].severity == "critical"
    assert "RuntimeError: boom" in found[0].summary
