"""rest and runtime scale out (the chart runs two of each).

The runtime: two replicas (`python -m services.runtime`, as two pods would run)
pull from one durable consumer, so JetStream hands each task exit to one of them.
Every failed exit gets its verdict (an exit 0 needs none), both replicas take part, and no exit is classified by
both: the verdicts the two processes report giving add up to the number of exits
(a verdict published twice would be deduplicated on the bus and hide a double
classification, so the processes' own counters are compared).

rest: two replicas behind one Service share users, tokens and jobs through the
store: a token made by one works on the other, a job taken by one is seen by the
other, and the same job sent to both at once is taken once (the other answers 409)
and announced once on the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import msgspec
import pytest

from libs.common.bus import Bus
from libs.common.messages import TaskExited, TaskVerdict
from libs.common.natsserver import free_port

REPO = Path(__file__).resolve().parents[2]
EXITS = 40
WAIT_SECONDS = 60.0
VERDICTS_METRIC = re.compile(r"^pai_runtime_verdicts_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """A server of this module's own: the runtime durable must start empty."""
    return own_nats_server


class Replica:
    """One process of a scaled-out service (`python -m services.<service>`)."""

    def __init__(self, nats, service: str, data_dir: Path, replica: str):
        self.port = free_port()
        self.data_dir = data_dir
        env = {
            **os.environ,
            "PAI_NATS_URL": nats.url,
            **nats.env(service),
            f"PAI_{service.upper()}_PORT": str(self.port),
            "PAI_DATA_DIR": str(data_dir),
            "PAI_REPLICA": replica,
        }
        self.proc = subprocess.Popen([sys.executable, "-m", f"services.{service}"], cwd=REPO, env=env)

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "a replica exited at start"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{self.port}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
        pytest.fail(f"the replica on port {self.port} never became ready")

    async def verdicts_given(self, http: aiohttp.ClientSession) -> int:
        async with http.get(f"http://127.0.0.1:{self.port}/metrics") as resp:
            text = await resp.text()
        return int(sum(float(n) for n in VERDICTS_METRIC.findall(text)))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.timeout(180)
async def test_two_runtime_replicas_share_the_exits_and_classify_each_once(nats_server, tmp_path):
    vc = f"vc{uuid.uuid4().hex[:6]}"
    bus = await Bus.connect(nats_server.url, name="scale-out-test", **nats_server.login("platform"))
    replicas = [Replica(nats_server, "runtime", tmp_path / f"runtime-{n}", f"runtime-{n}") for n in range(2)]
    verdicts: dict[str, list[TaskVerdict]] = {}

    async def receive(msg) -> None:
        verdict = msgspec.json.decode(msg.data, type=TaskVerdict)
        verdicts.setdefault(verdict.cause, []).append(verdict)

    sub = await bus.nc.subscribe(f"pai.v1.task.verdict.{vc}.>", cb=receive)
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(r.wait_ready(http) for r in replicas))
            exits = [
                TaskExited(id=f"admin~scale-{n}/1/main/0/0/exited", job=f"admin~scale-{n}", vc=vc, attempt=1,
                           role="main", index=0, exitCode=1 + n % 3, userLogTail=f"line {n}")
                for n in range(EXITS)
            ]
            for event in exits:
                await bus.publish(event)

            deadline = time.monotonic() + WAIT_SECONDS
            while len(verdicts) < EXITS and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert sorted(verdicts) == sorted(e.id for e in exits), f"{EXITS - len(verdicts)} exits got no verdict"
            # A second classification would come after the first: give it time.
            await asyncio.sleep(1.0)
            given = [await r.verdicts_given(http) for r in replicas]
        assert sum(given) == EXITS, f"replicas gave {given} verdicts for {EXITS} exits: some exit was classified twice"
        assert all(n > 0 for n in given), f"one replica did all the work: {given}"
        assert all(len(v) == 1 for v in verdicts.values()), "a verdict reached the bus twice"
    finally:
        await sub.unsubscribe()
        await bus.close()
        for replica in replicas:
            replica.stop()


def job_body(name: str) -> bytes:
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            "    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands:\n      - 'true'\n").encode()


async def submit(http: aiohttp.ClientSession, replica: Replica, token: str, name: str) -> int:
    async with http.post(f"http://127.0.0.1:{replica.port}/api/v2/jobs", data=job_body(name),
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"}) as resp:  # fmt: skip
        await resp.read()
        return resp.status


async def submitted_events(bus: Bus, jobs: set[str]) -> list[str]:
    """The job of every job.submitted event on the stream for one of `jobs`."""
    from libs.common.messages import JobSubmitted
    from libs.common.subjects import STREAM, Kind, kind_filter

    sub = await bus.js.pull_subscribe(kind_filter(Kind.JOB_SUBMITTED), stream=STREAM)
    found = []
    try:
        while True:
            try:
                msgs = await sub.fetch(100, timeout=1.0)
            except Exception:  # noqa: BLE001 - nats-py's timeout: nothing more
                break
            for msg in msgs:
                event = msgspec.json.decode(msg.data, type=JobSubmitted)
                if event.job in jobs:
                    found.append(event.job)
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return found


@pytest.mark.timeout(180)
async def test_two_rest_replicas_share_users_and_jobs_and_take_a_job_once(nats_server, tmp_path):
    tag = uuid.uuid4().hex[:6]
    first = Replica(nats_server, "rest", tmp_path / "rest-0", "rest-0")
    replicas = [first]
    bus = await Bus.connect(nats_server.url, name="scale-out-test", **nats_server.login("platform"))
    try:
        async with aiohttp.ClientSession() as http:
            await first.wait_ready(http)
            # The second starts once the admin exists: it finds it, makes no token.
            replicas.append(Replica(nats_server, "rest", tmp_path / "rest-1", "rest-1"))
            await replicas[1].wait_ready(http)
            token = (first.data_dir / "admin-token").read_text().strip()
            assert not (replicas[1].data_dir / "admin-token").exists()

            # Alternating replicas: each job is taken by the one it reached and
            # seen by the other.
            names = [f"scale-{tag}-{n}" for n in range(6)]
            statuses = [await submit(http, replicas[n % 2], token, name) for n, name in enumerate(names)]
            assert all(200 <= s < 300 for s in statuses), statuses
            for n, name in enumerate(names):
                other = replicas[(n + 1) % 2]
                async with http.get(f"http://127.0.0.1:{other.port}/api/v2/jobs/admin~{name}",
                                    headers={"Authorization": f"Bearer {token}"}) as resp:  # fmt: skip
                    assert resp.status == 200, f"admin~{name}, taken by the other replica, is unknown here"

            # The same job sent to both at once (a client retrying on the other
            # pod): taken once, refused once.
            twice = f"scale-{tag}-twice"
            both = sorted(await asyncio.gather(*(submit(http, r, token, twice) for r in replicas)))
            assert both[1] == 409 and 200 <= both[0] < 300, both

        jobs = {f"admin~{name}" for name in [*names, twice]}
        found = await submitted_events(bus, jobs)
        assert sorted(found) == sorted(jobs), "each job must be announced on the bus exactly once"
    finally:
        await bus.close()
        for replica in replicas:
            replica.stop()
