"""Work-preserving reconfiguration: the scheduler restarts on a changed cluster
file (a node and a VC added) and the running job keeps running."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from tests.integration.conftest import HERE, job_yaml

pytestmark = pytest.mark.integration


async def test_scheduler_restarted_with_more_cells_keeps_running_jobs(platform, tmp_path):
    plat = platform.platform
    name = f"keeps-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    release = tmp_path / "release"
    await platform.submit(job_yaml(name, [f"while [ ! -e {release} ]; do sleep 0.1; done"], vc="research"))
    before = await platform.wait_state(jid, "RUNNING")
    node = before["taskRoles"]["main"]["taskStatuses"][0]["containerNodeName"]

    original = plat.config
    try:
        await asyncio.to_thread(plat.kill_service, "scheduler")
        plat.config = msgspec.structs.replace(original, cluster_file=str(HERE / "cluster-4nodes.yaml"))
        await asyncio.to_thread(plat.start_service, "scheduler")

        vcs = {}
        for _ in range(50):
            vcs = await platform.client.request("GET", "/api/v2/virtual-clusters")
            if "extra" in vcs:
                break
            await asyncio.sleep(0.2)
        assert set(vcs) == {"default", "research", "extra"}
        detail = await platform.job(jid)
        assert detail["jobStatus"]["state"] == "RUNNING"
        assert detail["jobStatus"]["attempt"] == 1
        assert detail["taskRoles"]["main"]["taskStatuses"][0]["containerNodeName"] == node
        # The restored job still holds its cells: the VC reports them in use.
        research = {s["sku"]: s for s in vcs["research"]["skus"]}
        assert research["cpu"]["used"] >= 1

        other = f"extra-{uuid.uuid4().hex[:6]}"
        await platform.submit(job_yaml(other, ["true"], vc="extra"))
        await platform.wait_state(f"admin~{other}", "SUCCEEDED")
    finally:
        release.touch()
        await platform.wait_state(jid, "SUCCEEDED")
        await asyncio.to_thread(plat.kill_service, "scheduler")
        plat.config = original
        await asyncio.to_thread(plat.start_service, "scheduler")
