"""kill -9 nats-server mid-workload and start it again on the same store and port:
every service reconnects, nothing submitted before is lost or run twice."""

from __future__ import annotations

import asyncio
import uuid
import warnings

import pytest

from tests.chaos.harness import (
    assert_each_task_started_once,
    chaos_job,
    dead_services,
    start,
    states,
    wait_all_final,
)

pytestmark = pytest.mark.chaos

NATS_DOWN_SECONDS = 2.0


async def test_services_reconnect_after_nats_is_killed_and_no_job_is_lost_or_run_twice(platform, starts_dir):
    tag = uuid.uuid4().hex[:6]
    # Six 4-CPU jobs on the 16 CPUs of VC default: four run when NATS dies, two wait
    # in the queue; a two-role job in VC research runs beside them.
    jobs = {f"admin~nats-{n}-{tag}": {"main": 1} for n in range(6)}
    for job in jobs:
        await platform.submit(chaos_job(job.split("~")[1], starts_dir, ["sleep 1.5"], cpu=4))
    multi = f"admin~nats-multi-{tag}"
    jobs[multi] = {"ps": 1, "worker": 2}
    await platform.submit(chaos_job(multi.split("~")[1], starts_dir, ["sleep 1.5"], roles=jobs[multi], vc="research"))
    await platform.wait_state(next(iter(jobs)), "RUNNING")

    await asyncio.to_thread(platform.platform.kill_nats)
    await asyncio.sleep(NATS_DOWN_SECONDS)
    await asyncio.to_thread(platform.platform.start_nats)

    # A service that gave up while NATS was away is started again, as `pai up`'s
    # supervisor does (its state is on the bus); it is reported as a warning.
    died = dead_services(platform)
    for service in died:
        warnings.warn(f"{service} exited while NATS was down; started again", stacklevel=1)
        await start(platform, service)

    final = await wait_all_final(platform, jobs, timeout=60)
    assert states(final) == dict.fromkeys(jobs, "SUCCEEDED")
    assert_each_task_started_once(starts_dir, jobs)

    # The API takes and runs new work again.
    later = f"admin~nats-later-{tag}"
    await platform.submit(chaos_job(later.split("~")[1], starts_dir, ["true"]))
    await platform.wait_state(later, "SUCCEEDED")
    listed = {row["name"] for row in await platform.client.request("GET", "/api/v2/jobs")}
    assert {job.split("~")[1] for job in [*jobs, later]} <= listed


async def test_while_nats_is_away_the_api_answers_503_at_once_and_the_supervisor_brings_it_back(platform, starts_dir):
    """kill -9 of nats-server under `pai up`'s supervision: meanwhile every API call
    is a quick JSON 503 with Retry-After (never a hang or an empty 504), then NATS
    is started again by the supervisor and the platform runs new work by itself."""
    import threading
    import time

    import aiohttp

    from tests.chaos.harness import wait_all_final

    # A crash, not kill_nats: that one tells supervision to leave NATS down for the test to start.
    await asyncio.to_thread(platform.platform.nats.stop, kill=True)
    headers = {"Authorization": f"Bearer {platform.conn.token}"}
    async with aiohttp.ClientSession() as http:
        for path in ("/api/v2/jobs", "/api/v2/users/me"):
            started = time.monotonic()
            async with http.get(f"{platform.conn.url}{path}", headers=headers) as resp:
                body = await resp.json()
                took = time.monotonic() - started
                assert resp.status == 503, body
                assert resp.headers["Retry-After"] == "1"
            assert body["code"] == "ServiceUnavailable" and "message bus" in body["message"]
            assert took < 1.0, f"{path} took {took:.2f}s to say NATS is away"

    supervisor = threading.Thread(target=platform.platform.supervise, daemon=True)
    supervisor.start()
    try:
        job = f"admin~after-nats-{uuid.uuid4().hex[:6]}"
        deadline = time.monotonic() + 60
        while True:  # the client retries, as the 503 asks it to
            try:
                await platform.submit(chaos_job(job.split("~")[1], starts_dir, ["true"]))
                break
            except Exception:
                assert time.monotonic() < deadline, "the API never recovered after NATS was restarted"
                await asyncio.sleep(1.0)
        final = await wait_all_final(platform, [job], timeout=60)
        assert states(final) == {job: "SUCCEEDED"}
        assert platform.platform.nats.proc.poll() is None, "nats-server is not running again"
    finally:
        platform.platform.request_stop()
        await asyncio.to_thread(supervisor.join, 5)
