"""Invariants under random workloads (hypothesis): submit, finish, fail, node down/up, time passing.

After every step `validate_state()` holds (the harness checks it) and no cell is given
to two running tasks; gangs are placed whole; and at the end every VC can still get
its whole quota at once, by preempting only lower-priority or opportunistic work.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from libs.common.protocol.model import PRIORITY_CLASSES, JobSpec, Resources, TaskRole
from services.scheduler.core import Place, Preempt, Release, Submit

from .builders import Harness, quota_leaves

FIXTURES = {
    "two-racks": {"vcs": ["vision", "speech"], "skus": [None]},
    "mixed-skus": {"vcs": ["research", "prod", "ops"], "skus": [None, "V100", "T4", "CPU"]},
    "eight-gpu-node": {"vcs": ["team", "small"], "skus": [None]},
}
SHAPES = [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (2, 4), (3, 1), (1, 0)]  # (instances, gpus)

submit = st.tuples(st.just("submit"), st.integers(0, 2), st.sampled_from(["prod", "test", "oppo"]),
                   st.sampled_from(SHAPES), st.integers(0, 3), st.booleans(), st.booleans())
finish = st.tuples(st.just("finish"), st.integers(0, 30))
fail = st.tuples(st.just("fail"), st.integers(0, 30))
node = st.tuples(st.just("node"), st.integers(0, 4), st.booleans())
tick = st.tuples(st.just("tick"), st.sampled_from([1.0, 120.0, 700.0]))
operations = st.lists(st.one_of(submit, submit, finish, fail, node, tick), min_size=1, max_size=30)


class Launcher:
    """Plays the launcher against the harness and checks what it is told."""

    def __init__(self, fixture: str, **options):
        self.h = Harness(fixture, **options)
        self.fixture = fixture
        self.count = 0
        self.running: dict[str, list] = {}  # job -> task placements of its current attempt
        self.specs: dict[str, JobSpec] = {}

    def apply(self, decisions) -> None:
        for decision in decisions:
            if isinstance(decision, Place):
                tasks = self.running.setdefault(decision.job, [])
                tasks.extend(decision.tasks)
                job_spec = self.specs[decision.job]
                if job_spec.gangAllocation and not decision.partial:
                    assert len(tasks) == job_spec.task_count, f"gang {decision.job} placed in part"
                self.check_no_overlap()
        for decision in decisions:
            if isinstance(decision, Preempt):
                self.release(decision.job, requeue=True)

    def check_no_overlap(self) -> None:
        cells = [cell for tasks in self.running.values() for task in tasks for cell in task.leafCells]
        assert len(cells) == len(set(cells)), "a cell is given to two tasks"

    def release(self, job: str, *, requeue: bool) -> None:
        self.running.pop(job, None)
        attempt = self.h.attempts[job]
        if requeue:
            self.h.attempts[job] = attempt + 1
        self.apply(self.h.handle(Release(job=job, attempt=attempt, requeue=requeue)))

    def step(self, operation) -> None:
        kind = operation[0]
        setup = FIXTURES[self.fixture]
        if kind == "submit":
            _, vc_index, priority, (instances, gpus), sku_index, gang, lazy = operation
            vcs, skus = setup["vcs"], setup["skus"]
            sku = skus[sku_index % len(skus)]
            if sku == "CPU":
                gpus = 0
            self.count += 1
            name = f"j{self.count}"
            job_spec = JobSpec(
                name=name, user="alice", virtualCluster=vcs[vc_index % len(vcs)], priorityClass=priority,
                priority=PRIORITY_CLASSES[priority], gangAllocation=gang, lazyPreemptionEnable=lazy, skuType=sku,
                taskRoles=[TaskRole(name="w", instances=instances, resources=Resources(gpu=gpus, memoryMB=512))])
            self.specs[f"alice~{name}"] = job_spec
            self.h.attempts[f"alice~{name}"] = 0
            self.apply(self.h.handle(Submit(job=f"alice~{name}", attempt=0, spec=job_spec)))
        elif kind in ("finish", "fail") and self.running:
            job = sorted(self.running)[operation[1] % len(self.running)]
            self.release(job, requeue=kind == "fail")
        elif kind == "node":
            nodes = self.h.core.node_names()
            self.apply(self.h.node(nodes[operation[1] % len(nodes)], operation[2]))
        elif kind == "tick":
            self.apply(self.h.tick(operation[1]))


def assert_every_vc_can_get_its_quota(launcher: Launcher) -> None:
    """VC safety: a critical job asking for the VC's whole quota is placed at once or after preemptions
    of lower-priority and opportunistic work only."""
    for node in launcher.h.core.node_names():
        launcher.apply(launcher.h.node(node, True))
    config = launcher.h.config
    for vc_name in config.virtualClusters:
        for sku, cells in quota_leaves(config, vc_name).items():
            probe = copy.deepcopy(launcher)
            has_gpu = probe.h.config.skuTypes[sku].gpu > 0
            job_spec = JobSpec(name="probe", user="root", virtualCluster=vc_name, priorityClass="crit", priority=120,
                               skuType=sku, taskRoles=[TaskRole(name="w", instances=cells, resources=Resources(
                                   gpu=1 if has_gpu else 0, cpu=1, memoryMB=512))])
            probe.specs["root~probe"] = job_spec
            probe.h.attempts["root~probe"] = 0
            decisions = probe.h.handle(Submit(job="root~probe", attempt=0, spec=job_spec))
            for victim in (d for d in decisions if isinstance(d, Preempt) and d.by == "root~probe"):
                assert probe.specs[victim.job].priority < 120
            probe.apply(decisions)
            assert "root~probe" in probe.running, (
                f"VC {vc_name} cannot get its {cells} {sku} cells: {probe.h.core.waiting_reason('root~probe')}")


@pytest.mark.parametrize("fallback", [None, "idle"])
@pytest.mark.parametrize("fixture", list(FIXTURES))
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_random_workloads_keep_every_invariant(fixture, fallback, ops):
    launcher = Launcher(fixture, shape_fallback=fallback)
    for operation in ops:
        launcher.step(operation)
    assert_every_vc_can_get_its_quota(launcher)
