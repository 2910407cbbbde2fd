"""High availability of the single-active services: the scheduler and the launcher
run as two replicas, one active through the lease in KV. kill -9 of the active
replica mid-workload (and no restart of it) hands the work to the standby, which
rebuilds its state before deciding: no job is lost and no task attempt runs twice.

The takeover time (kill to the standby answering /readyz) is printed; the lease
is `LEASE_SECONDS` long, so it is at most that plus one standby check.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from libs.common.natsserver import free_port
from libs.common.service import LEASE_SECONDS
from tests.chaos.harness import assert_each_task_started_once, chaos_job, states, wait_all_final

pytestmark = pytest.mark.chaos

REPO = Path(__file__).resolve().parents[2]


def start_standby(platform, name: str) -> tuple[subprocess.Popen, int]:
    """A second replica of `name`, as a second pod would be: same bus, own port."""
    port = free_port()
    env = platform._env(name)
    env["PAI_REPLICA"] = "standby"
    env[f"PAI_{name.upper()}_PORT"] = str(port)
    log = open(platform.logs / f"{name}-standby.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", f"services.{name}"], env=env, stdout=log, stderr=log,
                            cwd=REPO, start_new_session=True)
    return proc, port


def ready(port: int) -> bool:
    """Leading: /readyz answers 200 "ready" (a standby answers 200 too, "standby":
    ready for Kubernetes, since it is healthy, but not the active replica)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return resp.status == 200 and json.load(resp).get("status") == "ready"
    except (OSError, ValueError):
        return False


async def takeover_seconds(standby: subprocess.Popen, port: int, killed_at: float) -> float:
    deadline = killed_at + LEASE_SECONDS * 3
    while time.monotonic() < deadline:
        assert standby.poll() is None, "the standby exited"
        if await asyncio.to_thread(ready, port):
            return time.monotonic() - killed_at
        await asyncio.sleep(0.1)
    raise AssertionError(f"the standby did not take over within {LEASE_SECONDS * 3:.0f}s")


@pytest.mark.parametrize("service", ["launcher", "scheduler"])
@pytest.mark.timeout(240)
async def test_the_standby_takes_over_when_the_active_replica_is_killed(platform, starts_dir, service):
    standby, port = start_standby(platform.platform, service)
    try:
        await asyncio.sleep(1.0)
        assert standby.poll() is None and not ready(port), "the standby must wait, not run beside the active one"

        tag = uuid.uuid4().hex[:6]
        jobs = {f"admin~ha-{service}-{n}-{tag}": {"main": 1} for n in range(4)}
        for job in list(jobs)[:2]:
            await platform.submit(chaos_job(job.split("~")[1], starts_dir, ["sleep 2"], cpu=4))
        await platform.wait_state(next(iter(jobs)), "RUNNING")

        os.kill(platform.platform.procs[service].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # Submitted while no replica is active: they wait for the standby.
        for job in list(jobs)[2:]:
            await platform.submit(chaos_job(job.split("~")[1], starts_dir, ["sleep 1"], cpu=4))
        took = await takeover_seconds(standby, port, killed_at)
        print(f"{service} takeover: {took:.2f}s")

        final = await wait_all_final(platform, jobs, timeout=90)
        assert states(final) == dict.fromkeys(jobs, "SUCCEEDED"), [
            (d["jobStatus"].get("appExitSpec"), d["jobStatus"].get("appExitDiagnostics"))
            for d in final.values() if d and d["jobStatus"]["state"] != "SUCCEEDED"]
        assert_each_task_started_once(starts_dir, jobs)
    finally:
        standby.send_signal(signal.SIGKILL)
        standby.wait()
