"""Every PAI_* variable OpenPAI's rest server and runtime give a task, from the pure env
builder (services/launcher/core/env.py), variable by variable."""

from __future__ import annotations

import pytest

from libs.common.protocol.model import Completion, JobSpec, Resources, TaskRole
from services.launcher.core.env import PeerAddress, task_env

SPEC = JobSpec(
    name="train",
    user="alice",
    virtualCluster="vision",
    taskRoles=[
        TaskRole(name="ps", instances=1, resources=Resources(cpu=2, memoryMB=4096, gpu=0, ports={"http": 1, "ssh": 1})),
        TaskRole(name="worker", instances=2, shmMB=2048,
                 completion=Completion(minFailedInstances=2, minSucceededInstances=1),
                 resources=Resources(cpu=8, memoryMB=32768, gpu=4, ports={"nccl": 2})),
    ],
)
PEERS = {
    ("ps", 0): PeerAddress(hostIp="10.0.0.1", ports={"http": [20001], "ssh": [20000]}),
    ("worker", 0): PeerAddress(hostIp="10.0.0.1", ports={"nccl": [20002, 20003]}),
    ("worker", 1): PeerAddress(hostIp="10.0.0.2", ports={"nccl": [20000, 20001]}),
}


def env_of(role: str, index: int) -> dict[str, str]:
    return task_env(spec=SPEC, job="alice~train", attempt=1, role=role, index=index, task_attempt=0,
                    peers=PEERS, gpus=[0, 1, 2, 3] if role == "worker" else [])


WORKER_1 = env_of("worker", 1)
PS_0 = env_of("ps", 0)


@pytest.mark.parametrize(("name", "value"), [
    # the job (rest server's runtime-env.js)
    ("PAI_JOB_NAME", "alice~train"),
    ("PAI_FRAMEWORK_NAME", "alice~train"),
    ("PAI_USER_NAME", "alice"),
    ("PAI_USERNAME", "alice"),
    ("PAI_DEFAULT_FS_URI", ""),
    ("PAI_TASK_ROLE_COUNT", "2"),
    ("PAI_TASK_ROLES_NUM", "2"),
    ("PAI_JOB_TASK_ROLE_COUNT", "2"),
    ("PAI_TASK_ROLE_LIST", "ps,worker"),
    ("PAI_JOB_TASK_ROLE_LIST", "ps,worker"),
    ("PAI_JOB_TASK_COUNT", "3"),
    ("PAI_TASKS_NUM", "3"),
    # each role
    ("PAI_TASK_ROLE_TASK_COUNT_ps", "1"),
    ("PAI_TASK_ROLE_TASK_COUNT_worker", "2"),
    ("PAI_RESOURCE_ps", "0,2,4096,0"),
    ("PAI_RESOURCE_worker", "4,8,32768,2048"),
    ("PAI_MIN_FAILED_TASK_COUNT_ps", "1"),
    ("PAI_MIN_FAILED_TASK_COUNT_worker", "2"),
    ("PAI_MIN_SUCCEEDED_TASK_COUNT_ps", "-1"),
    ("PAI_MIN_SUCCEEDED_TASK_COUNT_worker", "1"),
    # each task and port (runtime's framework_parser.py)
    ("PAI_HOST_IP_ps_0", "10.0.0.1"),
    ("PAI_HOST_IP_worker_1", "10.0.0.2"),
    ("PAI_PORT_LIST_worker_0_nccl", "20002,20003"),
    ("PAI_worker_0_nccl_PORT", "20002,20003"),
    ("PAI_ps_0_http_PORT", "20001"),
    ("PAI_TASK_ROLE_ps_HOST_LIST", "10.0.0.1:20001"),
    ("PAI_TASK_ROLE_worker_HOST_LIST", "10.0.0.1:20002,10.0.0.2:20000"),
    ("PAI_TASK_ROLE_INSTANCES", "ps:0,worker:0,worker:1"),
    # the task itself
    ("PAI_CURRENT_TASK_ROLE_NAME", "worker"),
    ("PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", "1"),
    ("PAI_TASK_INDEX", "1"),
    ("PAI_TASK_ROLE_INDEX", "1"),
    ("PAI_TASK_ROLE_NO", "1"),
    ("PAI_CURRENT_CONTAINER_IP", "10.0.0.2"),
    ("PAI_CONTAINER_HOST_IP", "10.0.0.2"),
    ("PAI_CONTAINER_HOST_nccl_PORT_LIST", "20000,20001"),
    ("PAI_CONTAINER_HOST_PORT_LIST", "nccl:20000,20001;"),
    ("PAI_CURRENT_TASK_ROLE_TASK_COUNT", "2"),
    ("PAI_CURRENT_TASK_ROLE_CPU_COUNT", "8"),
    ("PAI_CURRENT_TASK_ROLE_MEM_MB", "32768"),
    ("PAI_CURRENT_TASK_ROLE_SHM_MB", "2048"),
    ("PAI_CURRENT_TASK_ROLE_GPU_COUNT", "4"),
    ("PAI_CURRENT_TASK_ROLE_MIN_FAILED_TASK_COUNT", "2"),
    ("PAI_CURRENT_TASK_ROLE_MIN_SUCCEEDED_TASK_COUNT", "1"),
    ("PAI_JOB_ATTEMPT_ID", "1"),
    ("PAI_TASK_ATTEMPT_ID", "0"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
    ("PAI_GPU_COUNT", "4"),
])
def test_a_worker_sees_openpais_variable(name: str, value: str) -> None:
    assert WORKER_1[name] == value


@pytest.mark.parametrize(("name", "value"), [
    ("PAI_TASK_INDEX", "0"),
    ("PAI_TASK_ROLE_NO", "0"),
    ("PAI_CONTAINER_HOST_http_PORT_LIST", "20001"),
    ("PAI_CONTAINER_HOST_ssh_PORT_LIST", "20000"),
    ("PAI_CONTAINER_HOST_PORT_LIST", "http:20001;ssh:20000;"),
    ("PAI_CURRENT_CONTAINER_PORT", "20001"),
    ("PAI_CONTAINER_HOST_PORT", "20001"),
    ("PAI_CONTAINER_SSH_PORT", "20000"),
    ("CUDA_VISIBLE_DEVICES", ""),
])
def test_the_ps_sees_its_http_and_ssh_ports(name: str, value: str) -> None:
    assert PS_0[name] == value


def test_labels_a_task_lacks_are_not_invented() -> None:
    assert not {"PAI_CURRENT_CONTAINER_PORT", "PAI_CONTAINER_HOST_PORT", "PAI_CONTAINER_SSH_PORT"} & WORKER_1.keys()


def test_a_task_placed_before_its_peers_sees_only_the_placed_ones() -> None:
    alone = task_env(spec=SPEC, job="alice~train", attempt=1, role="worker", index=0, task_attempt=0,
                     peers={("worker", 0): PEERS[("worker", 0)]}, gpus=[0])
    assert alone["PAI_TASK_ROLE_INSTANCES"] == "worker:0"
    assert "PAI_HOST_IP_ps_0" not in alone and alone["PAI_CONTAINER_HOST_IP"] == "10.0.0.1"
    assert alone["PAI_JOB_TASK_COUNT"] == "3"  # the job's size, placed or not
