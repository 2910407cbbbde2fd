"""A real job's life over GET /api/v2/events, all services running as processes:
an HTTP client sees WAITING -> RUNNING -> SUCCEEDED as the launcher publishes it,
and after hanging up mid-job and reconnecting with Last-Event-ID it gets what it
missed, once."""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp

from tests.integration.conftest import job_yaml

READ_TIMEOUT = 90.0  # a loaded machine: placement and launch can take a while


async def next_event(resp: aiohttp.ClientResponse) -> dict:
    fields: dict = {}
    while True:
        line = (await asyncio.wait_for(resp.content.readline(), READ_TIMEOUT)).decode().rstrip("\n")
        if not line:
            if "data" in fields:
                return fields
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(": ")
        fields[key] = json.loads(value) if key == "data" else value


async def test_a_jobs_life_over_sse_resumed_after_a_disconnect(platform, tmp_path):
    name = f"sse{uuid.uuid4().hex[:6]}"
    user = (await platform.client.request("GET", "/api/v2/users/me"))["username"]
    job = f"{user}~{name}"
    headers = {"Authorization": f"Bearer {platform.conn.token}"}
    url = f"{platform.conn.url}/api/v2/events"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        first = await session.get(url, params={"job": job}, headers=headers)
        assert first.status == 200
        # The task waits for a file the test writes, so the client can hang up while it runs.
        gate = tmp_path / "go"
        await platform.submit(job_yaml(name, [f"while [ ! -e {gate} ]; do sleep 0.2; done"]))
        seen = [await next_event(first)]
        while seen[-1]["data"]["state"] != "RUNNING":
            seen.append(await next_event(first))
        first.close()  # gone while the job runs

        gate.touch()
        await platform.wait_state(job, "SUCCEEDED", timeout=READ_TIMEOUT)
        resumed = await session.get(url, params={"job": job}, headers={**headers, "Last-Event-ID": seen[-1]["id"]})
        seen.append(await next_event(resumed))
        resumed.close()

    states = [e["data"]["state"] for e in seen]
    assert states == ["WAITING", "RUNNING", "SUCCEEDED"], states
    ids = [int(e["id"]) for e in seen]
    assert ids == sorted(set(ids))
    assert seen[-1]["data"]["exitCode"] == 0
