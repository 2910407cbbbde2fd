"""What a task sees (OpenPAI's PAI_* environment) and the ports it is given."""

from __future__ import annotations

import msgspec
import pytest

from libs.common.exitspecs import PORTS_EXHAUSTED_EXIT_CODE
from libs.common.messages import JobState, TaskPlacement
from services.launcher.core import PeerAddress, Placed, StartTask, Submitted, task_env
from tests.unit.launcher.builders import JOB, Driver, job_spec, role, started


def two_roles_three_instances() -> Driver:
    """ps x1 (http and ssh ports, no GPU) and worker x2 (two nccl ports, one GPU each), over two nodes."""
    spec = job_spec(
        role("ps", 1, ports={"ssh": 1, "http": 1}),
        role("worker", 2, ports={"nccl": 2}, gpu=1),
    )
    driver = Driver(spec)
    driver.submit()
    return driver


def place_two_nodes(driver: Driver) -> list[StartTask]:
    placements = [
        TaskPlacement(role="ps", index=0, node="n1", hostIp="10.1.0.1"),
        TaskPlacement(role="worker", index=0, node="n1", hostIp="10.1.0.1", gpus=[3]),
        TaskPlacement(role="worker", index=1, node="n2", hostIp="10.1.0.2", gpus=[0]),
    ]
    actions = driver.handle(Placed(job=JOB, attempt=1, tasks=placements, id="p"))
    return [a for a in actions if isinstance(a, StartTask)]


def test_env_of_a_job_with_two_roles_and_three_instances() -> None:
    driver = two_roles_three_instances()
    starts = {(s.launch.key.role, s.launch.key.index): s.launch for s in place_two_nodes(driver)}
    env = starts[("worker", 1)].env

    assert env["PAI_JOB_NAME"] == "alice~train"
    assert env["PAI_USER_NAME"] == "alice"
    assert env["PAI_VIRTUAL_CLUSTER"] == "default"
    assert env["PAI_TASK_ROLE_LIST"] == "ps,worker"
    assert env["PAI_TASK_ROLE_TASK_COUNT_ps"] == "1"
    assert env["PAI_TASK_ROLE_TASK_COUNT_worker"] == "2"
    assert env["PAI_CURRENT_TASK_ROLE_NAME"] == "worker"
    assert env["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == "1"
    assert env["PAI_HOST_IP_ps_0"] == "10.1.0.1"
    assert env["PAI_HOST_IP_worker_0"] == "10.1.0.1"
    assert env["PAI_HOST_IP_worker_1"] == "10.1.0.2"
    # Ports: ps takes the lowest ports of n1 in its labels' order, worker 0 the next ones on n1;
    # worker 1 is alone on n2.
    assert env["PAI_PORT_LIST_ps_0_ssh"] == "20000"
    assert env["PAI_PORT_LIST_ps_0_http"] == "20001"
    assert env["PAI_PORT_LIST_worker_0_nccl"] == "20002,20003"
    assert env["PAI_PORT_LIST_worker_1_nccl"] == "20000,20001"
    # Host lists: ps uses its http port, worker its first label's first port.
    assert env["PAI_TASK_ROLE_ps_HOST_LIST"] == "10.1.0.1:20001"
    assert env["PAI_TASK_ROLE_worker_HOST_LIST"] == "10.1.0.1:20002,10.1.0.2:20000"
    assert env["PAI_TASK_ROLE_INSTANCES"] == "ps:0,worker:0,worker:1"
    assert env["PAI_JOB_ATTEMPT_ID"] == "1"
    assert env["PAI_TASK_ATTEMPT_ID"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["PAI_GPU_COUNT"] == "1"
    assert starts[("worker", 0)].env["CUDA_VISIBLE_DEVICES"] == "3"
    # Every task sees the same picture of its peers.
    own = ("PAI_TASK_ROLE_INDEX", "PAI_TASK_ROLE_NO")  # the task's own place
    peers = {k: v for k, v in env.items()
             if k.startswith(("PAI_HOST_IP", "PAI_PORT_LIST", "PAI_TASK_ROLE_")) and k not in own}
    for launch in starts.values():
        assert {k: launch.env[k] for k in peers} == peers


def test_a_task_without_gpus_sees_none() -> None:
    driver = two_roles_three_instances()
    ps = next(s.launch for s in place_two_nodes(driver) if s.launch.key.role == "ps")
    assert ps.env["CUDA_VISIBLE_DEVICES"] == ""
    assert ps.env["PAI_GPU_COUNT"] == "0"


def test_launch_carries_resources_commands_and_ports() -> None:
    driver = two_roles_three_instances()
    worker = next(s.launch for s in place_two_nodes(driver) if s.launch.key == driver.key("worker", 0))
    assert worker.commands == ["echo worker"]
    assert worker.gpu == 1 and worker.placement.gpus == [3] and worker.placement.node == "n1"
    assert worker.ports == {"nccl": [20002, 20003]}
    assert worker.vc == "default" and worker.user == "alice"


HOST_LIST_CASES = [
    ("http-label-wins", {"ssh": 1, "http": 1}, {"ssh": [1], "http": [2]}, "10.0.0.9:2"),
    ("first-label-otherwise", {"nccl": 2, "tb": 1}, {"nccl": [5, 6], "tb": [7]}, "10.0.0.9:5"),
    ("bare-ip-without-ports", {}, {}, "10.0.0.9"),
]


@pytest.mark.parametrize(
    ("wanted", "ports", "entry"), [c[1:] for c in HOST_LIST_CASES], ids=[c[0] for c in HOST_LIST_CASES]
)
def test_host_list_entry(wanted, ports, entry) -> None:
    spec = job_spec(role("worker", 1, ports=wanted))
    env = task_env(
        spec=spec,
        job=JOB,
        attempt=1,
        role="worker",
        index=0,
        task_attempt=0,
        peers={("worker", 0): PeerAddress(hostIp="10.0.0.9", ports=ports)},
        gpus=[],
    )
    assert env["PAI_TASK_ROLE_worker_HOST_LIST"] == entry


def test_without_gang_a_task_sees_only_the_peers_placed_so_far() -> None:
    driver = Driver(job_spec(role("worker", 2), gang=False))
    driver.submit()
    first = driver.handle(
        Placed(
            job=JOB,
            attempt=1,
            partial=True,
            tasks=[TaskPlacement(role="worker", index=0, node="n1", hostIp="10.0.0.1")],
        )
    )
    [launch] = [a.launch for a in first if isinstance(a, StartTask)]
    assert launch.env["PAI_TASK_ROLE_worker_HOST_LIST"] == "10.0.0.1"
    assert "PAI_HOST_IP_worker_1" not in launch.env

    driver.running(driver.key("worker", 0))
    assert driver.state == JobState.RUNNING  # the first task running is enough without gang

    second = driver.handle(
        Placed(
            job=JOB,
            attempt=1,
            partial=True,
            tasks=[TaskPlacement(role="worker", index=1, node="n2", hostIp="10.0.0.2")],
        )
    )
    [launch] = [a.launch for a in second if isinstance(a, StartTask)]
    assert launch.env["PAI_TASK_ROLE_worker_HOST_LIST"] == "10.0.0.1,10.0.0.2"


def test_a_gang_starts_only_when_every_task_is_placed() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.submit()
    part = driver.handle(
        Placed(job=JOB, attempt=1, partial=True, tasks=[TaskPlacement(role="worker", index=0, node="n1")])
    )
    assert started(part) == []
    rest = driver.handle(
        Placed(job=JOB, attempt=1, partial=True, tasks=[TaskPlacement(role="worker", index=1, node="n1")])
    )
    assert sorted(k.index for k in started(rest)) == [0, 1]
    driver.running(driver.key("worker", 0))
    assert driver.state == JobState.WAITING  # the gang is RUNNING only when all tasks run
    driver.running(driver.key("worker", 1))
    assert driver.state == JobState.RUNNING


def test_ports_are_unique_per_node_across_jobs_and_freed_when_a_job_ends() -> None:
    driver = two_roles_three_instances()
    place_two_nodes(driver)
    other = msgspec.structs.replace(job_spec(role("worker", 1, ports={"http": 2})), name="other")
    driver.handle(Submitted(job="alice~other", spec=other, at=0.0))
    actions = driver.handle(
        Placed(job="alice~other", attempt=1, tasks=[TaskPlacement(role="worker", index=0, node="n1")])
    )
    [launch] = [a.launch for a in actions if isinstance(a, StartTask)]
    assert launch.ports == {"http": [20004, 20005]}  # 20000-20003 are held on n1

    driver.stop()
    driver.confirm_kills(driver.log)
    assert driver.state == JobState.STOPPED
    driver.handle(Submitted(job="alice~third", spec=other, at=0.0))
    actions = driver.handle(
        Placed(job="alice~third", attempt=1, tasks=[TaskPlacement(role="worker", index=0, node="n1")])
    )
    [launch] = [a.launch for a in actions if isinstance(a, StartTask)]
    assert launch.ports == {"http": [20000, 20001]}


def test_no_free_port_fails_the_attempt_with_a_platform_exit() -> None:
    driver = Driver(job_spec(role("worker", 2, ports={"http": 2})), port_range=(30000, 30003))
    driver.submit()
    actions = driver.handle(
        Placed(
            job=JOB,
            attempt=1,
            tasks=[
                TaskPlacement(role="worker", index=0, node="n1"),
                TaskPlacement(role="worker", index=1, node="n1"),
            ],
        )
    )
    assert started(actions) == []
    assert driver.state == JobState.FAILED
    assert driver.record.appExitCode == PORTS_EXHAUSTED_EXIT_CODE
    assert "no free port on node n1" in driver.record.appExitDiagnostics[0]
