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
