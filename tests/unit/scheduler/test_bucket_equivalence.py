"""The bucketed pass (queues.py) decides as a plain scan would: random small workloads are fed to two
cores, one bucketed and one where every job is a bucket of its own (`bucketed=False`: each waiting job
tried in queue order), and after every event both must give the same Place and Preempt decisions, cell
for cell. The workloads repeat a few shapes so that buckets hold several jobs, and mix priorities,
lazy preemption, gangs, failures (requeues), node outages and time passing (aged gangs)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from libs.common.protocol.model import PRIORITY_CLASSES, JobSpec, Resources, TaskRole
from services.scheduler.core import NodeHealth, Place, Preempt, Release, Submit, Tick

from .builders import Harness

VCS = ["vision", "speech"]
SHAPES = [(1, 1), (1, 1), (1, 4), (2, 4), (1, 2), (2, 1)]  # (instances, gpus): 1-GPU jobs most often

submit = st.tuples(st.just("submit"), st.integers(0, 1), st.sampled_from(["prod", "test", "oppo", "oppo"]),
                   st.sampled_from(SHAPES), st.booleans(), st.booleans())
finish = st.tuples(st.just("finish"), st.integers(0, 30))
fail = st.tuples(st.just("fail"), st.integers(0, 30))
node = st.tuples(st.just("node"), st.integers(0, 4), st.booleans())
tick = st.tuples(st.just("tick"), st.sampled_from([1.0, 120.0, 400.0]))
operations = st.lists(st.one_of(submit, submit, submit, finish, fail, node, tick), min_size=1, max_size=80)


def _outcome(decisions) -> list[tuple]:
    """What a user sees of a pass: which jobs start where, and which are preempted by whom."""
    seen = []
    for decision in decisions:
        if isinstance(decision, Place):
            seen.append(("place", decision.job, decision.attempt, decision.partial,
                         tuple((t.role, t.index, t.node, tuple(t.leafCells)) for t in decision.tasks)))
        elif isinstance(decision, Preempt):
            seen.append(("preempt", decision.job, decision.by))
    return seen


class Twins:
    """Two cores fed the same events; the bucketed one must decide as the plain scan."""

    def __init__(self, **options):
        self.bucketed = Harness("two-racks", gang_priority_after_s=300, **options)
        self.plain = Harness("two-racks", gang_priority_after_s=300, bucketed=False, **options)
        self.count = 0
        self.running: set[str] = set()
        self.release_preempted = True  # False: the caller releases them (with other events in one call)

    def handle(self, *events) -> None:
        ours = self.bucketed.handle(*events)
        reference = self.plain.handle(*events)
        assert _outcome(ours) == _outcome(reference), f"after {events!r}"
        for decision in ours:
            if isinstance(decision, Place):
                self.running.add(decision.job)
        for decision in ours:
            if isinstance(decision, Preempt):
                self.running.discard(decision.job)
                if self.release_preempted:
                    self.release(decision.job, requeue=True)

    def release(self, job: str, *, requeue: bool) -> None:
        self.running.discard(job)
        attempt = self.bucketed.attempts[job]
        if requeue:
            self.bucketed.attempts[job] = self.plain.attempts[job] = attempt + 1
        self.handle(Release(job=job, attempt=attempt, requeue=requeue))

    def step(self, operation) -> None:
        kind = operation[0]
        if kind == "submit":
            _, vc, priority, (instances, gpus), gang, lazy = operation
            self.count += 1
            job = f"alice~j{self.count}"
            job_spec = JobSpec(
                name=f"j{self.count}", user="alice", virtualCluster=VCS[vc], priorityClass=priority,
                priority=PRIORITY_CLASSES[priority], gangAllocation=gang, lazyPreemptionEnable=lazy,
                taskRoles=[TaskRole(name="w", instances=instances, resources=Resources(gpu=gpus, memoryMB=512))])
            self.bucketed.attempts[job] = self.plain.attempts[job] = 0
            self.handle(Submit(job=job, attempt=0, spec=job_spec))
        elif kind in ("finish", "fail") and self.running:
            job = sorted(self.running)[operation[1] % len(self.running)]
            self.release(job, requeue=kind == "fail")
        elif kind == "node":
            nodes = self.bucketed.core.node_names()
            self.handle(NodeHealth(node=nodes[operation[1] % len(nodes)], healthy=operation[2], reason="test"))
        elif kind == "tick":
            self.bucketed.clock.advance(operation[1])
            self.plain.clock.advance(operation[1])
            self.handle(Tick())


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, budget=st.sampled_from([1, 2]), fallback=st.sampled_from([None, "idle", "unheld"]))
def test_the_bucketed_pass_decides_as_a_plain_scan(ops, budget, fallback):
    twins = Twins(opportunistic_preemption_budget=budget, shape_fallback=fallback)
    for operation in ops:
        twins.step(operation)


# Workloads where guaranteed jobs fall back onto idle cells outside their VC's quota (shape fallback): the
# random ones above rarely get a VC's cells fragmented enough for it.
FALLBACK_WORKLOADS = [
    [("submit", 1, "oppo", (1, 4), False, True), ("submit", 0, "test", (1, 1), True, False), ("node", 4, True),
     ("tick", 120.0), ("submit", 1, "prod", (1, 2), False, False), ("submit", 0, "prod", (2, 1), True, False),
     ("node", 3, False), ("tick", 1.0), ("submit", 0, "test", (1, 2), True, False), ("tick", 400.0), ("fail", 4),
     ("submit", 0, "oppo", (1, 1), False, True), ("submit", 1, "prod", (2, 1), False, False),
     ("submit", 0, "prod", (1, 2), False, False), ("submit", 0, "oppo", (2, 1), True, False), ("finish", 10)],
    [("tick", 400.0), ("finish", 25), ("submit", 1, "test", (1, 1), False, False),
     ("submit", 0, "prod", (2, 1), False, False), ("submit", 0, "oppo", (2, 4), False, False),
     ("submit", 0, "oppo", (1, 1), True, True), ("finish", 29), ("submit", 0, "test", (1, 2), True, True),
     ("submit", 1, "prod", (2, 4), False, True), ("finish", 21), ("submit", 0, "oppo", (2, 4), True, False),
     ("finish", 10), ("submit", 0, "oppo", (2, 4), True, False), ("submit", 1, "test", (1, 2), False, False),
     ("node", 1, True), ("finish", 0), ("submit", 0, "test", (2, 1), False, True), ("node", 0, False),
     ("submit", 1, "prod", (1, 1), False, True), ("fail", 25)],
    [("submit", 0, "test", (1, 1), True, False), ("submit", 0, "prod", (1, 4), True, False),
     ("submit", 0, "oppo", (1, 1), True, True), ("tick", 120.0), ("tick", 120.0),
     ("submit", 0, "test", (1, 1), True, True), ("tick", 120.0), ("tick", 1.0),
     ("submit", 0, "oppo", (1, 1), True, True), ("submit", 0, "oppo", (2, 4), False, False),
     ("submit", 1, "prod", (2, 4), False, False), ("tick", 1.0), ("submit", 1, "oppo", (2, 1), True, False),
     ("submit", 0, "prod", (2, 4), False, False), ("fail", 3), ("finish", 16), ("node", 0, False),
     ("submit", 0, "oppo", (1, 2), True, False), ("finish", 29), ("fail", 18),
     ("submit", 0, "oppo", (1, 1), False, False), ("submit", 0, "test", (1, 1), False, True), ("fail", 15)],
]


@pytest.mark.parametrize("fallback", ["idle", "unheld"])
@pytest.mark.parametrize("budget", [1, 2])
@pytest.mark.parametrize("workload", range(len(FALLBACK_WORKLOADS)))
def test_the_bucketed_pass_decides_as_a_plain_scan_when_jobs_fall_back(workload, budget, fallback):
    twins = Twins(opportunistic_preemption_budget=budget, shape_fallback=fallback)
    for operation in FALLBACK_WORKLOADS[workload]:
        twins.step(operation)
    borrowed = [job for job in twins.bucketed.core._jobs.values() if job.borrowed]
    if fallback == "idle" and budget == 1:
        assert borrowed, "the workload no longer makes a job fall back"


def _spec(name: str, vc: str, priority: str, gpus: int) -> JobSpec:
    return JobSpec(name=name, user="alice", virtualCluster=vc, priorityClass=priority,
                   priority=PRIORITY_CLASSES[priority],
                   taskRoles=[TaskRole(name="w", instances=1, resources=Resources(gpu=gpus, memoryMB=512))])


def test_a_job_wrongly_counted_as_failed_does_not_close_its_bucket_to_a_later_one():
    """The case that once made the two differ. A job over its preemption budget (kept to cells no VC
    holds) failed, and its size was then counted as failed for the rest of the pass, so a job of the
    same size that may borrow a VC's idle cells was marked failed without being tried. With nothing
    freed since, the plain scan still tried a later job of that size (never tried before) and placed it
    ahead of the first, while the bucketed pass closed the bucket at the first: an idle node stayed idle.
    Now the borrower is tried, placed, and both agree on every step."""
    twins = Twins(opportunistic_preemption_budget=1)
    twins.release_preempted = False

    def submit(job: str, vc: str, priority: str, gpus: int) -> Submit:
        twins.bucketed.attempts[f"alice~{job}"] = twins.plain.attempts[f"alice~{job}"] = 0
        return Submit(job=f"alice~{job}", attempt=0, spec=_spec(job, vc, priority, gpus))

    twins.handle(submit("owner", "vision", "prod", 1))  # vision binds a rack: 7 idle GPUs in its cells
    twins.handle(submit("old", "speech", "oppo", 4))
    twins.step(("tick", 400.0))
    twins.handle(submit("young", "speech", "oppo", 4))
    twins.handle(submit("speaker", "speech", "prod", 4))  # speech binds the node young runs on
    assert "alice~young" not in twins.running
    twins.bucketed.attempts["alice~young"] = twins.plain.attempts["alice~young"] = 1
    # young comes back over its budget and fails first in the pass; guest (same size, may borrow vision's
    # idle node) must still be tried.
    twins.handle(Release(job="alice~young", attempt=0, requeue=True), submit("guest", "vision", "oppo", 4))
    twins.handle(submit("late", "vision", "oppo", 4))
    assert "alice~guest" in twins.running and "alice~late" not in twins.running


def _random_workload(seed: int) -> tuple[int, list[tuple]]:
    """A preemption budget and 10-80 operations, drawn as the operations above but by a seeded
    generator: longer and more varied than what the derandomized search above tries."""
    draw = random.Random(seed)
    budget = draw.choice([1, 2])
    workload = []
    for _ in range(draw.randint(10, 80)):
        kind = draw.choice(["submit"] * 4 + ["finish", "finish", "fail", "node", "tick"])
        if kind == "submit":
            workload.append(("submit", draw.randint(0, 1), draw.choice(["prod", "test", "oppo", "oppo"]),
                             draw.choice(SHAPES), draw.random() < 0.5, draw.random() < 0.5))
        elif kind in ("finish", "fail"):
            workload.append((kind, draw.randint(0, 30)))
        elif kind == "node":
            workload.append(("node", draw.randint(0, 4), draw.random() < 0.6))
        else:
            workload.append(("tick", draw.choice([1.0, 120.0, 400.0])))
    return budget, workload


# Seeds of _random_workload on which the two once decided differently (with one setting of the shape
# fallback or another; the workloads below are some of them cut down).
DIVERGED_SEEDS = [147, 161, 182, 219, 384, 463, 499, 500, 1448, 3088]


@pytest.mark.parametrize("fallback", [None, "idle", "unheld"])
@pytest.mark.parametrize("seed", DIVERGED_SEEDS)
def test_the_bucketed_pass_decides_as_a_plain_scan_on_longer_random_workloads(seed, fallback):
    budget, workload = _random_workload(seed)
    twins = Twins(opportunistic_preemption_budget=budget, shape_fallback=fallback)
    for operation in workload:
        twins.step(operation)


# Workloads on which the two once decided differently, found by random runs of 10-80 operations and cut
# down to what it takes: (shape fallback, preemption budget, operations, check of the end state).
DIVERGED_WORKLOADS = {
    # An aged gang (j2) behind the head of its bucket (j1, requeued, not aged): the plain scan looks at j2,
    # which then holds back j3; the bucketed pass left the bucket at j1 and let j3 go ahead of j2.
    "aged gang behind the head of its bucket": ("unheld", 1, [
        ("submit", 0, "test", (2, 4), True, False), ("submit", 0, "test", (2, 4), True, False), ("tick", 400.0),
        ("submit", 0, "test", (1, 4), False, True), ("submit", 0, "prod", (1, 1), False, True)],
        lambda twins: "alice~j3" not in twins.running),
    # A plan tried and dropped put the free rack it had split at the end of its free list: j1 failed, and
    # j3 (the same shape, behind it) then fitted, in the plain scan only.
    "a dropped plan reordered the free lists": (None, 2, [
        ("submit", 1, "test", (2, 4), True, False), ("submit", 1, "oppo", (1, 1), True, True), ("finish", 21),
        ("node", 3, False), ("fail", 8), ("submit", 1, "test", (2, 4), True, False)],
        lambda twins: "alice~j3" not in twins.running),
    # A 2-GPU borrower (kept to cells no VC holds) failing counted as failed for j6, whose tasks are whole
    # nodes and may go to a VC's idle node; j8 (the same shape as j6, behind it) then went first.
    "a large borrower failing counted for a whole-node job": ("unheld", 1, [
        ("submit", 1, "prod", (1, 4), True, True), ("submit", 1, "oppo", (1, 4), False, False),
        ("submit", 0, "prod", (1, 2), True, True), ("submit", 0, "oppo", (1, 2), True, False),
        ("submit", 1, "prod", (1, 2), False, False), ("submit", 0, "oppo", (2, 4), False, True),
        ("submit", 1, "test", (1, 1), True, True), ("fail", 28), ("submit", 0, "oppo", (2, 4), False, False)],
        lambda twins: "alice~j6" in twins.running),
    # The aged gang j5 fell back in the fallback walk; j6 (its bucket, held back behind it in the first
    # walk, so not one of the jobs that walk is for) fell back too in the bucketed pass only.
    "a job behind an aged gang placed in the fallback walk": ("idle", 2, [
        ("node", 2, False), ("submit", 0, "oppo", (1, 2), False, True), ("submit", 0, "prod", (1, 2), False, True),
        ("node", 1, False), ("submit", 1, "oppo", (2, 1), False, False), ("submit", 0, "prod", (1, 1), True, False),
        ("submit", 0, "prod", (2, 1), True, True), ("tick", 400.0), ("submit", 0, "test", (2, 1), True, True),
        ("node", 2, True)],
        lambda twins: "alice~j5" in twins.running and "alice~j6" not in twins.running),
    # j13 bound vision's rack, with a free node left in it; j9 had failed before, when vision could still
    # bind, and nothing was freed since: the plain scan did not try it again, the bucketed pass did.
    "a cell bound with room left": (None, 1, [
        ("submit", 1, "oppo", (1, 2), True, True), ("submit", 1, "test", (1, 1), True, False), ("fail", 1),
        ("submit", 1, "oppo", (1, 2), False, True), ("submit", 1, "prod", (1, 2), True, False),
        ("submit", 0, "oppo", (2, 1), False, False), ("submit", 1, "test", (1, 4), True, True),
        ("submit", 0, "test", (2, 4), True, True), ("finish", 23), ("submit", 1, "oppo", (1, 1), False, False),
        ("submit", 0, "test", (2, 4), False, True), ("node", 1, False), ("submit", 0, "prod", (1, 2), True, True),
        ("submit", 1, "prod", (2, 4), False, True), ("submit", 0, "test", (2, 1), False, True),
        ("submit", 0, "prod", (1, 4), True, True), ("node", 0, False), ("finish", 0), ("finish", 19),
        ("finish", 7), ("finish", 3)],
        lambda twins: "alice~j9" in twins.running),
    # j3 ended on an unhealthy node: vision's quota had room again, though no leaf was freed. j2 (ahead)
    # was not tried again; j3's next attempt (the same bucket) fell back, in the plain scan only.
    "quota freed on an unhealthy node": ("idle", 2, [
        ("submit", 1, "oppo", (1, 1), False, True), ("submit", 0, "test", (1, 4), True, True),
        ("submit", 0, "test", (1, 4), True, False), ("node", 3, False), ("finish", 0),
        ("submit", 0, "prod", (1, 4), False, False), ("fail", 30)],
        lambda twins: "alice~j2" in twins.running),
    # node-a1 came back with j1 (test) on it: j3 (prod, the same VC) may preempt it now, though no leaf
    # was freed. Only the plain scan tried j3 again (j4, tried in the pass before, had left cells
    # marked freed by its tentative preemptions).
    "a node back with preemptible work on it": ("unheld", 2, [
        ("submit", 1, "test", (1, 4), False, True), ("submit", 0, "prod", (1, 1), False, False), ("node", 0, False),
        ("node", 1, False), ("submit", 1, "prod", (1, 2), False, True), ("submit", 1, "prod", (1, 2), True, False),
        ("node", 4, True)],
        lambda twins: "alice~j3" in twins.running and "alice~j1" not in twins.running),
}


@pytest.mark.parametrize("name", list(DIVERGED_WORKLOADS))
def test_the_bucketed_pass_decides_as_a_plain_scan_where_they_once_differed(name):
    fallback, budget, workload, check = DIVERGED_WORKLOADS[name]
    twins = Twins(opportunistic_preemption_budget=budget, shape_fallback=fallback)
    for operation in workload:
        twins.step(operation)
    assert check(twins), f"{name}: the workload no longer ends as it did when it was written"
