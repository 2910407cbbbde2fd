"""kill -9 the launcher while tasks run: tasks outlive it, and the next launcher
re-adopts them and learns their real exit codes."""

from __future__ import annotations

import uuid

import pytest

from tests.chaos.harness import (
    kill,
    read_starts,
    record_start,
    start,
    task_processes,
    wait_for_file,
    wait_until_gone,
)
from tests.integration.conftest import job_yaml

pytestmark = pytest.mark.chaos


async def test_tasks_outlive_a_killed_launcher_and_report_their_real_exit(platform, starts_dir, tmp_path):
    tag = uuid.uuid4().hex[:6]
    ends_early, outlives = f"adm-exit7-{tag}", f"adm-long-{tag}"
    release = tmp_path / "release"  # the long task ends only when the test says so
    await platform.submit(job_yaml(ends_early, [record_start(starts_dir), "sleep 1", "exit 7"]))
    await platform.submit(job_yaml(outlives, [record_start(starts_dir), f"while [ ! -e {release} ]; do sleep 0.1; done"]))
    for name in (ends_early, outlives):
        await platform.wait_state(f"admin~{name}", "RUNNING")
        await wait_for_file(starts_dir / f"admin~{name}-main-0.starts")

    await kill(platform, "launcher")
    # The short task ends while no launcher runs: only its exit record tells of it.
    await wait_until_gone(f"admin~{ends_early}")
    assert task_processes(f"admin~{outlives}"), "the long task died with the launcher"
    await start(platform, "launcher")

    # Re-adopted, not restarted: still running, still the first attempt.
    assert task_processes(f"admin~{outlives}")
    detail = await platform.job(f"admin~{outlives}")
    assert detail["jobStatus"]["state"] == "RUNNING"
    release.touch()

    failed = await platform.wait_state(f"admin~{ends_early}", {"SUCCEEDED", "FAILED", "STOPPED"})
    assert failed["jobStatus"]["state"] == "FAILED"
    assert failed["jobStatus"]["appExitCode"] == 7
    assert failed["taskRoles"]["main"]["taskStatuses"][0]["containerExitCode"] == 7
    succeeded = await platform.wait_state(f"admin~{outlives}", {"SUCCEEDED", "FAILED", "STOPPED"})
    assert succeeded["jobStatus"]["state"] == "SUCCEEDED"
    assert succeeded["taskRoles"]["main"]["taskStatuses"][0]["containerExitCode"] == 0
    for detail in (failed, succeeded):
        assert detail["jobStatus"]["attempt"] == 1
        assert detail["jobStatus"]["retries"] == 0

    starts = read_starts(starts_dir)
    assert {key: s.attempts for key, s in starts.items()} == {
        (f"admin~{ends_early}", "main", 0): [(1, 0)],
        (f"admin~{outlives}", "main", 0): [(1, 0)],
    }
