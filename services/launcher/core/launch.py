"""What a backend needs to start one task attempt, built from the job record."""

from __future__ import annotations

from collections.abc import Mapping

from libs.common.messages import TaskPlacement
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from services.launcher.core.env import PeerAddress, task_env
from services.launcher.core.recordops import task_key
from services.launcher.core.tasks import TaskLaunch

Peers = dict[tuple[str, int], PeerAddress]


def peers_of(attempt: AttemptRecord) -> Peers:
    """Addresses of every placed task of the attempt."""
    return {
        (t.role, t.index): PeerAddress(hostIp=t.hostIp, ports=t.ports) for t in attempt.tasks if t.hostIp is not None
    }


def build_launch(
    record: JobRecord,
    attempt: AttemptRecord,
    task: TaskRecord,
    *,
    peers: Peers | None = None,
    shared_env: Mapping[str, str] | None = None,
) -> TaskLaunch:
    """The launch of `task`'s current task attempt; `peers`/`shared_env` save work for many tasks."""
    assert task.node is not None and task.hostIp is not None, "only a placed task can be launched"
    role = record.spec.role(task.role)
    env = task_env(
        spec=record.spec,
        job=record.job,
        attempt=attempt.attempt,
        role=task.role,
        index=task.index,
        task_attempt=task.taskAttempt,
        peers=peers if peers is not None else peers_of(attempt),
        gpus=task.gpus,
        shared=shared_env,
    )
    placement = TaskPlacement(
        role=task.role,
        index=task.index,
        node=task.node,
        hostIp=task.hostIp,
        gpus=list(task.gpus),
        leafCells=list(task.leafCells),
        skuType=task.skuType,
    )
    return TaskLaunch(
        key=task_key(record, attempt, task),
        vc=record.vc,
        user=record.user,
        placement=placement,
        commands=list(role.commands),
        env=env,
        cpu=role.resources.cpu,
        memoryMB=role.resources.memoryMB,
        gpu=role.resources.gpu,
        ports={label: list(ports) for label, ports in task.ports.items()},
        dockerImageUri=role.dockerImageUri,
        dockerImageAuth=role.dockerImageAuth,
        shmMB=role.shmMB,
        hostNetwork=role.hostNetwork,
        storages=list(record.spec.storages),
    )
