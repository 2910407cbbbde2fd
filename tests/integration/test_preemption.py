"""A prod job preempts a test job through the whole pipeline."""

from __future__ import annotations

import uuid

import psutil
import pytest

from tests.integration.conftest import job_yaml, written

pytestmark = pytest.mark.integration


def priority(cls: str) -> str:
    return f"extras:\n  hivedScheduler:\n    jobPriorityClass: {cls}\n"


def whole_node(name: str, commands: list[str], cls: str) -> str:
    # 8 CPU cells: all of VC research's quota (one node of the test cluster).
    return job_yaml(name, commands, vc="research", extra=priority(cls)).replace("cpu: 1,", "cpu: 8,")


async def test_prod_job_preempts_test_job_which_runs_again_afterwards(platform, tmp_path):
    tag = uuid.uuid4().hex[:6]
    victim, prod = f"victim-{tag}", f"prod-{tag}"
    vid, pid_ = f"admin~{victim}", f"admin~{prod}"
    await platform.submit(whole_node(victim, [f"echo $$ > {tmp_path}/victim-$PAI_JOB_ATTEMPT_ID.pid", "sleep 600"], "test"))
    await platform.wait_state(vid, "RUNNING")
    first_pid = int(await written(tmp_path / "victim-1.pid"))

    await platform.submit(whole_node(prod, ["sleep 3"], "prod"))
    await platform.wait_state(pid_, "RUNNING", timeout=30)

    # The victim's processes really died, and it waits again, saying why.
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE
    detail = await platform.wait_state(vid, "WAITING")
    assert detail["jobStatus"]["attempt"] == 2
    assert detail["jobStatus"]["retries"] == 0  # preemption is not a retry
    assert detail["jobStatus"]["waitingReason"]
    attempts = await platform.client.request("GET", f"/api/v2/jobs/{vid}/job-attempts")
    first = [a for a in attempts if a["attempt"] == 1][0]  # PAI's number (OpenPAI's attemptIndex is 0)
    assert prod in (first["endReason"] + str(first["preemptedBy"]))
    assert first["exitSpec"] and "preempt" in first["exitSpec"]["phrase"].lower()

    # Once the prod job ends, the victim runs again.
    await platform.wait_state(pid_, "SUCCEEDED", timeout=30)
    await platform.wait_state(vid, "RUNNING", timeout=30)
    await platform.stop(vid)
    await platform.wait_state(vid, "STOPPED", timeout=30)

