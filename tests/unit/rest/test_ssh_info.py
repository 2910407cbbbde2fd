"""A job's SSH info (OpenPAI's GET /api/v2/jobs/{id}/ssh, pure): one entry per running
task that exposes an `ssh` port; a task only placed (its port and host known, its server
not started) or already ended has no server to reach, and no task with one is a 404."""

from __future__ import annotations

import pytest

from libs.common.messages import JobState, TaskState
from libs.common.protocol.model import JobSpec
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from services.rest.openpai_jobs import SshInfoNotFound, ssh_info


def task(index: int, state: TaskState, *, ssh_port: int | None = 20001, host: str | None = "10.0.0.5") -> TaskRecord:
    return TaskRecord(role="worker", index=index, state=state, hostIp=host,
                      ports={"ssh": [ssh_port]} if ssh_port else {})


def record(*tasks: TaskRecord) -> JobRecord:
    return JobRecord(job="alice~j", name="j", user="alice", vc="default", spec=JobSpec(name="j", user="alice"),
                     state=JobState.RUNNING, attempts=[AttemptRecord(attempt=1, tasks=list(tasks))])


def test_only_running_tasks_with_an_ssh_port_are_listed_with_how_to_reach_them():
    info = ssh_info("alice~j", record(
        task(0, TaskState.RUNNING, ssh_port=20001),
        task(1, TaskState.WAITING, ssh_port=20002),  # placed, not started: nothing listens yet
        task(2, TaskState.SUCCEEDED, ssh_port=20003),  # ended: its server is gone
        task(3, TaskState.RUNNING, ssh_port=None),  # no ssh port
        task(4, TaskState.RUNNING, host=None),  # no host known
    ), login="alice")
    assert info == {"keyPair": None, "containers": [{
        "id": "worker-0", "taskRoleName": "worker", "taskIndex": 0, "sshIp": "10.0.0.5", "sshPort": "20001",
        "user": "alice", "sshCommand": "ssh -i alice.j -p 20001 alice@10.0.0.5"}]}


@pytest.mark.parametrize("rec", [
    None,
    record(),
    record(task(0, TaskState.WAITING), task(1, TaskState.WAITING)),
    record(task(0, TaskState.FAILED)),
])
def test_no_running_task_with_a_server_is_a_404(rec):
    with pytest.raises(SshInfoNotFound) as missing:
        ssh_info("alice~j", rec)
    assert missing.value.status == 404 and "none of its running tasks" in missing.value.message
