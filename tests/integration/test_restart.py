"""`pai up` stopped and started again on the same data dir keeps every job."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import pytest

from cli.up import Platform
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration


async def start(config) -> Api:
    plat = Platform(config, print_fn=lambda *_: None)
    conn = await asyncio.to_thread(plat.start)
    return Api(plat, conn)


async def test_restarting_pai_up_mid_run_keeps_every_job(tmp_path):
    config = platform_config(tmp_path / "pai")
    tag = uuid.uuid4().hex[:6]
    done, running, waiting, later = (f"{kind}-{tag}" for kind in ("done", "running", "waiting", "later"))
    marker = tmp_path / "runs"
    api = await start(config)
    try:
        await api.submit(job_yaml(done, ["echo finished"]))
        await api.wait_state(f"admin~{done}", "SUCCEEDED")
        # Counts its own starts, so the test sees it ran again after the restart.
        await api.submit(job_yaml(running, [f"echo start >> {marker}", "sleep 3"]))
        await api.wait_state(f"admin~{running}", "RUNNING")
        # Both nodes of the VC whole, at once: it fits the VC but waits while
        # the running job holds a cell.
        needs_every_cell = job_yaml(waiting, ["true"], roles={"main": 2}).replace("cpu: 1,", "cpu: 8,")
        await api.submit(needs_every_cell)
        await api.wait_state(f"admin~{waiting}", "WAITING")
    finally:
        await asyncio.to_thread(api.platform.stop)

    api = await start(config)
    try:
        assert (await api.job(f"admin~{done}"))["jobStatus"]["state"] == "SUCCEEDED"
        waiting_detail = await api.job(f"admin~{waiting}")
        assert waiting_detail["jobStatus"]["state"] == "WAITING"
        assert waiting_detail["jobStatus"]["waitingReason"]
        # The job the shutdown interrupted runs again, without using its retry budget.
        detail = await api.wait_state(f"admin~{running}", "SUCCEEDED", timeout=40)
        assert detail["jobStatus"]["retries"] == 0
        assert marker.read_text().count("start") == 2
        # And the platform still takes new work.
        await api.submit(job_yaml(later, ["true"]))
        await api.wait_state(f"admin~{later}", "SUCCEEDED")
        names = {row["name"] for row in await api.client.request("GET", "/api/v2/jobs")}
        assert {done, running, waiting, later} <= names
    finally:
        await asyncio.to_thread(api.platform.stop)


async def test_a_second_pai_up_on_a_data_dir_in_use_is_refused_and_disturbs_nothing(tmp_path):
    config = platform_config(tmp_path / "pai")
    job = f"admin~busy-{uuid.uuid4().hex[:6]}"
    api = await start(config)
    try:
        await api.submit(job_yaml(job.split("~")[1], ["sleep 3"]))
        await api.wait_state(job, "RUNNING")
        # What a user does who forgot the first one: `pai up` again, on the same data dir.
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli.main", "up", "--data-dir", str(config.data_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(second.communicate(), timeout=30)
        said = "".join((out + err).decode().split())  # rich wraps long lines, even mid-word
        assert second.returncode == 1, said
        expected = f"{config.data_path.resolve()} is in use by another `pai up` (pid {os.getpid()})"
        assert "".join(expected.split()) in said
        assert "PAIisup" not in said and "PAIstopped" not in said
        # The first platform and its task carried on: the job ends as it would have.
        detail = await api.wait_state(job, "SUCCEEDED", timeout=30)
        assert detail["jobStatus"]["retries"] == 0

        # The same refusal from the API a harness uses, and a stop that touches nothing.
        other = Platform(config, print_fn=lambda *_: None)
        with pytest.raises(RuntimeError, match="in use by another `pai up`"):
            await asyncio.to_thread(other.start)
        await asyncio.to_thread(other.stop)
        assert (await api.job(job))["jobStatus"]["state"] == "SUCCEEDED"
    finally:
        await asyncio.to_thread(api.platform.stop)

    # Once the first has stopped, the data dir is free again.
    api = await start(config)
    try:
        assert (await api.job(job))["jobStatus"]["state"] == "SUCCEEDED"
    finally:
        await asyncio.to_thread(api.platform.stop)
