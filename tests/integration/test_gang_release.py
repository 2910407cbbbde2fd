"""gangReleaseEnable: false, as a user sees it: a role's finished task gives its cells back
while the rest of its job runs on, so a job waiting for them starts at once (HiveD's release
per pod). VC research is one node of 8 cpu cells (cluster-3nodes.yaml)."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.conftest import job_yaml

pytestmark = pytest.mark.integration


def holder_yaml(name: str, release, gang_release: bool) -> str:
    """ps (1 cell) runs until `release` exists; worker (7 cells) ends at once."""
    text = job_yaml(name, ["true"], roles={"ps": 1, "worker": 1}, vc="research")
    text = text.replace("  worker:\n    instances: 1\n    resourcePerInstance: {cpu: 1,",
                        "  worker:\n    instances: 1\n    resourcePerInstance: {cpu: 7,")
    text = text.replace("  ps:\n    instances: 1\n    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n"
                        "    commands:\n      - \"true\"",
                        "  ps:\n    instances: 1\n    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n"
                        f"    commands:\n      - \"while [ ! -e {release} ]; do sleep 0.1; done\"")
    return text + ("extras:\n  hivedScheduler:\n    taskRoles:\n      worker:\n"
                   f"        gangReleaseEnable: {'true' if gang_release else 'false'}\n")


async def test_a_finished_tasks_cells_go_to_a_waiting_job_while_its_job_runs_on(platform, tmp_path):
    tag = uuid.uuid4().hex[:6]
    holder, waiter = f"gang-holder-{tag}", f"gang-waiter-{tag}"
    release = tmp_path / "release"
    body = holder_yaml(holder, release, gang_release=False)
    assert "cpu: 7," in body and str(release) in body
    submitted = await platform.submit(body)
    # gangReleaseEnable is no longer reported as not acted on
    assert (submitted["warnings"], submitted["ignoredFields"]) == ([], []), submitted
    try:
        await platform.wait_state(f"admin~{holder}", "RUNNING")
        await platform.submit(job_yaml(waiter, ["true"], vc="research").replace("cpu: 1,", "cpu: 4,"))
        # The worker's 7 cells came back when it ended; ps still holds 1: the waiter's 4 fit now.
        await platform.wait_state(f"admin~{waiter}", "SUCCEEDED", timeout=30)
        detail = await platform.job(f"admin~{holder}")
        assert detail["jobStatus"]["state"] == "RUNNING"
        roles = {role: status["taskStatuses"][0]["taskState"] for role, status in detail["taskRoles"].items()}
        assert roles == {"ps": "RUNNING", "worker": "SUCCEEDED"}
    finally:
        release.touch()
    await platform.wait_state(f"admin~{holder}", "SUCCEEDED", timeout=30)
