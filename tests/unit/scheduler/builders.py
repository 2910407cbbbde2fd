"""Builders for scheduler core tests: clusters, jobs, and a harness that checks invariants."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import yaml

from libs.common.messages import TaskPlacement
from libs.common.protocol.model import PRIORITY_CLASSES, JobSpec, Resources, TaskRole
from services.scheduler.cluster import load_cluster_config
from services.scheduler.core import (
    Announce,
    Cancel,
    ClusterConfig,
    Decision,
    NodeHealth,
    Place,
    Preempt,
    Release,
    Restore,
    SchedulerCore,
    SchedulingPolicy,
    Submit,
    Tick,
    Wait,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "clusters"
SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"


def reference_hived(name: str = "") -> Path:
    """A file (or the folder) of the HiveD reference configs; skips the test when absent."""
    path = SHARED / "reference" / "hived" / name
    if not path.exists():
        pytest.skip(f"reference files not present: {path}")
    return path


def cluster(name: str) -> ClusterConfig:
    # Parsed once per file (PyYAML's pure-Python parse was much of a harness's start, and
    # the properties start hundreds); loaded and checked from a fresh copy every time.
    return load_cluster_config(copy.deepcopy(_fixture_document(name)))


@functools.cache
def _fixture_document(name: str) -> dict:
    return yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())


def quota_leaves(config: ClusterConfig, vc_name: str) -> dict[str, int]:
    """Leaf cells per sku the VC's virtual cells promise (pinned cells apart)."""
    leaves: dict[str, int] = {}
    for cell in config.virtualClusters[vc_name].virtualCells:
        cell_type = config.cellTypes[cell.cellType]
        leaves[cell_type.skuType] = leaves.get(cell_type.skuType, 0) + cell.cellNumber * cell_type.leafCellNumber
    return leaves


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def spec(name: str, *, vc: str, gpus: int = 1, instances: int = 1, priority: str = "prod", sku: str | None = None,
         gang: bool = True, lazy: bool = False, pinned: str | None = None, cpu: int = 1, memory_mb: int = 1024,
         roles: list[TaskRole] | None = None, user: str = "alice") -> JobSpec:
    return JobSpec(
        name=name, user=user, virtualCluster=vc, priorityClass=priority, priority=PRIORITY_CLASSES[priority],
        gangAllocation=gang, lazyPreemptionEnable=lazy, skuType=sku, pinnedCellId=pinned,
        taskRoles=roles or [TaskRole(name="worker", instances=instances,
                                     resources=Resources(gpu=gpus, cpu=cpu, memoryMB=memory_mb))],
    )


def role(name: str, *, instances: int = 1, gpus: int = 1, cpu: int = 1, memory_mb: int = 1024,
         sku: str | None = None, group: str | None = None, pinned: str | None = None) -> TaskRole:
    return TaskRole(name=name, instances=instances, resources=Resources(gpu=gpus, cpu=cpu, memoryMB=memory_mb),
                    skuType=sku, affinityGroupName=group, pinnedCellId=pinned)


class Harness:
    """A core plus the bookkeeping a launcher would do; checks validate_state() after every call."""

    def __init__(self, config: ClusterConfig | str, **options) -> None:
        self.config = cluster(config) if isinstance(config, str) else config
        self.clock = Clock()
        self.core = SchedulerCore(self.config, clock=self.clock, policy=SchedulingPolicy(**options))
        self.attempts: dict[str, int] = {}
        self.placed: dict[str, list[TaskPlacement]] = {}
        self.log: list[Decision] = []

    def handle(self, *events) -> list[Decision]:
        decisions = self.core.handle(*events)
        self.core.validate_state()
        for decision in decisions:
            self.log.append(decision)
            if isinstance(decision, Place):
                self.placed.setdefault(decision.job, []).extend(decision.tasks)
        return decisions

    def submit(self, job: str, **kwargs) -> list[Decision]:
        job_id = f"{kwargs.get('user', 'alice')}~{job}"
        self.attempts[job_id] = 0
        return self.handle(Submit(job=job_id, attempt=0, spec=spec(job, **kwargs)))

    def submit_spec(self, job_spec: JobSpec, attempt: int = 0) -> list[Decision]:
        job_id = f"{job_spec.user}~{job_spec.name}"
        self.attempts[job_id] = attempt
        return self.handle(Submit(job=job_id, attempt=attempt, spec=job_spec))

    def release(self, job: str, *, requeue: bool = False) -> list[Decision]:
        job_id = job if "~" in job else f"alice~{job}"
        attempt = self.attempts[job_id]
        self.placed.pop(job_id, None)
        if requeue:
            self.attempts[job_id] = attempt + 1
        return self.handle(Release(job=job_id, attempt=attempt, requeue=requeue))

    def finish_preempted(self, decisions: list[Decision]) -> list[Decision]:
        """What the launcher does with Preempt decisions: kill, then Release(requeue=True)."""
        out = []
        for decision in decisions:
            if isinstance(decision, Preempt):
                out.extend(self.release(decision.job, requeue=True))
        return out

    def cancel(self, job: str) -> list[Decision]:
        return self.handle(Cancel(job=f"alice~{job}"))

    def node(self, name: str, healthy: bool) -> list[Decision]:
        return self.handle(NodeHealth(node=name, healthy=healthy, reason="test"))

    def tick(self, seconds: float = 0.0) -> list[Decision]:
        self.clock.advance(seconds)
        return self.handle(Tick())

    def restore(self, job: str, job_spec: JobSpec, tasks: list[TaskPlacement], attempt: int = 0) -> list[Decision]:
        job_id = f"{job_spec.user}~{job}"
        self.attempts[job_id] = attempt
        return self.handle(Restore(job=job_id, attempt=attempt, spec=job_spec, tasks=tasks))

    def nodes_of(self, job: str) -> list[str]:
        return sorted(task.node for task in self.placed.get(f"alice~{job}", []))

    def cells_of(self, job: str) -> list[str]:
        return sorted(cell for task in self.placed.get(f"alice~{job}", []) for cell in task.leafCells)

    def is_running(self, job: str) -> bool:
        return f"alice~{job}" in self.placed

    def reason(self, job: str) -> str | None:
        return self.core.waiting_reason(f"alice~{job}")


def only(decisions: list[Decision], kind: type) -> list:
    return [d for d in decisions if isinstance(d, kind)]


def placed_jobs(decisions: list[Decision]) -> list[str]:
    return [d.job for d in decisions if isinstance(d, Place)]


def preempted_jobs(decisions: list[Decision]) -> list[str]:
    return [d.job for d in decisions if isinstance(d, Preempt)]


def waits(decisions: list[Decision]) -> dict[str, str]:
    return {d.job: d.reason for d in decisions if isinstance(d, Wait)}


__all__ = ["Harness", "cluster", "quota_leaves", "spec", "role", "only", "placed_jobs", "preempted_jobs", "waits",
           "Tick", "reference_hived", "Announce", "Place", "Preempt", "Wait", "FIXTURES"]
