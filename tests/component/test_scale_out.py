"""The runtime scales out: two replicas (`python -m services.runtime`, as two pods
would run) pull from one durable consumer, so JetStream hands each task exit to
one of them. Every exit gets its verdict, both replicas take part, and no exit is
classified by both: the verdicts the two processes report giving add up to the
number of exits (a verdict published twice would be deduplicated on the bus and
hide a double classification, so the processes' own counters are compared).
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


class RuntimeReplica:
    def __init__(self, nats, data_dir: Path, replica: str):
        self.port = free_port()
        env = {
            **os.environ,
            "PAI_NATS_URL": nats.url,
            **nats.env("runtime"),
            "PAI_RUNTIME_PORT": str(self.port),
            "PAI_DATA_DIR": str(data_dir),
            "PAI_REPLICA": replica,
        }
        self.proc = subprocess.Popen([sys.executable, "-m", "services.runtime"], cwd=REPO, env=env)

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "a runtime replica exited at start"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{self.port}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
        pytest.fail(f"runtime replica on port {self.port} never became ready")

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
    replicas = [RuntimeReplica(nats_server, tmp_path / f"runtime-{n}", f"runtime-{n}") for n in range(2)]
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
                           role="main", index=0, exitCode=n % 3, userLogTail=f"line {n}")
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
