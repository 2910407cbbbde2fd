"""A running job's utilisation over time comes back from GET /api/v2/jobs/{id}/metrics:
each task's CPU and memory as the node agent sampled them (process mode, the tasks'
processes read through /proc), kept across a monitor killed -9; other users get 403,
an unknown job 404. GPU series are absent where the machine has no NVML readings
(this one); the GPU tier checks the readings themselves."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest

from tests.chaos.harness import kill, start
from tests.integration.conftest import job_yaml

pytestmark = pytest.mark.integration


async def _get(platform, path: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token or platform.conn.token}"}
    async with aiohttp.ClientSession() as session, session.get(platform.conn.url + path, headers=headers) as res:
        return res.status, await res.json()


async def _filled(platform, job: str, *, tasks: int, points: int, timeout: float = 20.0) -> dict:
    body: dict = {}
    for _ in range(int(timeout / 0.25)):
        status, body = await _get(platform, f"/api/v2/jobs/{job}/metrics")
        assert status == 200, body
        series = [t["series"] for t in body["tasks"]]
        if len(series) == tasks and all(len(s["t"]) >= points and max(s["cpuPercent"]) > 0 for s in series):
            return body
        await asyncio.sleep(0.25)
    raise AssertionError(f"{job}'s metrics did not fill: {body}")


async def test_a_running_jobs_samples_come_back_per_task_and_for_the_job(platform, tmp_path):
    name = f"busy-{uuid.uuid4().hex[:6]}"
    job = f"admin~{name}"
    release = tmp_path / "release"
    # Each task keeps a core busy (a shell loop) until released.
    await platform.submit(job_yaml(name, [f"while [ ! -e {release} ]; do :; done"], roles={"worker": 2}))
    try:
        await platform.wait_state(job, "RUNNING")
        body = await _filled(platform, job, tasks=2, points=2)
        assert [(t["taskRoleName"], t["taskIndex"]) for t in body["tasks"]] == [("worker", 0), ("worker", 1)]
        for task in body["tasks"]:
            s = task["series"]
            assert len(s["t"]) == len(s["cpuPercent"]) == len(s["memoryBytes"])
            assert all(m > 0 for m in s["memoryBytes"])
            assert "gpuPercent" not in s  # no NVML on this machine: unknown, not 0
        total = body["total"]["series"]
        assert len(total["t"]) >= 1 and max(total["cpuPercent"]) > 0
        assert body["state"] == "RUNNING"
        assert body["gpuIdle"]["idle"] is False

        # The monitor killed -9 and started again: the history carries on from what it stored.
        before = body["tasks"][0]["series"]["t"]
        await kill(platform, "monitor")
        await start(platform, "monitor")
        after = await _filled(platform, job, tasks=2, points=len(before) + 2)
        assert after["tasks"][0]["series"]["t"][:len(before) - 1] == before[:-1]  # the last may have merged more

        # A window: nothing before `from`.
        cut = after["tasks"][0]["series"]["t"][-1]
        status, windowed = await _get(platform, f"/api/v2/jobs/{job}/metrics?from={cut}")
        assert status == 200 and all(t >= cut for t in windowed["tasks"][0]["series"]["t"])
    finally:
        release.touch()
    await platform.wait_state(job, "SUCCEEDED", timeout=30)


async def test_only_the_owner_and_admins_read_a_jobs_metrics(platform):
    await platform.client.request("POST", "/api/v2/users", json_body={"username": "metrics-eve", "password": "pw-eve-12345"})
    login = await platform.client.request("POST", "/api/v2/authn/basic/login",
                                          json_body={"username": "metrics-eve", "password": "pw-eve-12345"})
    name = f"quiet-{uuid.uuid4().hex[:6]}"
    await platform.submit(job_yaml(name, ["true"]))
    status, body = await _get(platform, f"/api/v2/jobs/admin~{name}/metrics", token=login["token"])
    assert status == 403 and "admin~" + name in body["message"]
    status, body = await _get(platform, "/api/v2/jobs/admin~no-such-job-here/metrics")
    assert status == 404
    status, body = await _get(platform, f"/api/v2/jobs/admin~{name}/metrics?step=soon")
    assert status == 400 and "step" in body["message"]
