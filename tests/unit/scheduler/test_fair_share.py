"""Fair share among the users of a VC (issue 31): within a VC and a priority, the user holding
the smallest dominant share of the VC's cells goes first (fairness.py), ties by submission.

Table tests on the `two-racks` cluster, VC `vision` (8 one-GPU cells): each case submits jobs
of one GPU as users A, B, C (in the order written), then frees cells by releasing running jobs
oldest first, and reads which user's job got each freed cell."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from libs.common.protocol.model import PRIORITY_CLASSES, JobSpec, Resources, TaskRole
from services.scheduler.core import Cancel, NodeHealth, Place, Submit, Tick
from services.scheduler.core.queues import Queues

from .builders import Harness, spec
from .test_bucket_equivalence import SHAPES, VCS, Twins


@pytest.fixture(autouse=True, params=[2.0, 0.0], ids=["moved-one-by-one", "lists-sorted-again"])
def resort_share(request, monkeypatch):
    """Every test twice: the queue moving each re-tagged job, and sorting its lists again (as it does
    when the re-tags are a large share of the lane, `RESORT_SHARE`)."""
    monkeypatch.setattr(Queues, "RESORT_SHARE", request.param)
    return request.param


def run(submissions: list[tuple[str, int, str]], releases: int, **options) -> str:
    """Submit (user, count, priority class) in order, then release the oldest running job `releases` times;
    the users whose jobs the freed cells went to, in order (e.g. "BBAA")."""
    h = Harness("two-racks", **options)
    running: list[str] = []
    seq = 0

    def note(decisions) -> str:
        got = ""
        for decision in decisions:
            if isinstance(decision, Place):
                running.append(decision.job)
                got += decision.job.split("~")[0]
        return got

    for user, count, priority in submissions:
        for _ in range(count):
            seq += 1
            note(h.submit_spec(spec(f"j{seq}", vc="vision", gpus=1, priority=priority, user=user)))
    order = ""
    for _ in range(releases):
        job = running.pop(0)
        order += note(h.release(job))
    return order


CASES = [
    pytest.param([("A", 40, "test"), ("B", 32, "test")], 16, "BBBBAAAABBBBAAAA",
                 id="40-queued-then-32-interleave-not-wait"),
    pytest.param([("A", 9, "test"), ("B", 1, "test")], 2, "BA",
                 id="a-user-with-running-jobs-yields-to-one-with-none"),
    pytest.param([("A", 10, "prod"), ("B", 2, "test")], 2, "AA",
                 id="priorities-dominate-shares"),
    pytest.param([("A", 3, "test"), ("B", 3, "test"), ("C", 2, "test"), ("A", 1, "test"), ("B", 1, "test")],
                 8, "AB", id="equal-shares-go-by-submission"),
    pytest.param([("A", 8, "test"), ("A", 2, "test"), ("B", 1, "test"), ("C", 1, "test")], 3, "BCA",
                 id="users-with-nothing-running-before-the-one-holding-all"),
]


@pytest.mark.parametrize(("submissions", "releases", "expected"), CASES)
def test_freed_cells_go_to_the_user_with_the_smallest_share(submissions, releases, expected):
    assert run(submissions, releases) == expected


def test_without_fair_share_the_queue_is_arrival_order():
    assert run([("A", 40, "test"), ("B", 32, "test")], 16, fair_share=False) == "A" * 16


def test_a_waiting_job_position_follows_its_users_share():
    """What `pai status` says (position in the queue) is the fair order, not arrival."""
    h = Harness("two-racks")
    for i in range(10):
        h.submit_spec(spec(f"a{i}", vc="vision", gpus=1, priority="test", user="A"))
    h.submit_spec(spec("b0", vc="vision", gpus=1, priority="test", user="B"))
    assert h.core.waiting_reason("B~b0").endswith("; 0 jobs ahead")  # submitted last, B holds nothing
    assert h.core.waiting_reason("A~a8").endswith("; 1 job ahead")
    assert h.core.waiting_reason("A~a9").endswith("; 2 jobs ahead")


def test_a_gang_still_waits_for_all_its_cells_and_lets_smaller_jobs_by():
    """Fairness reorders; it does not split gangs or block the queue behind one that does not fit."""
    h = Harness("two-racks", gang_priority_after_s=10_000)
    for i in range(8):
        h.submit_spec(spec(f"a{i}", vc="vision", gpus=1, priority="test", user="A"))
    h.submit_spec(spec("bgang", vc="vision", gpus=1, instances=4, priority="test", user="B"))
    h.submit_spec(spec("a8", vc="vision", gpus=1, priority="test", user="A"))
    # B's gang goes first in the queue (B holds nothing) but needs 4 cells: the one freed goes to A's job.
    assert [d.job for d in h.release("A~a0") if isinstance(d, Place)] == ["A~a8"]
    placed = []
    for job in ("A~a1", "A~a2", "A~a3", "A~a4"):
        placed += [d for d in h.release(job) if isinstance(d, Place)]
    assert [(d.job, len(d.tasks)) for d in placed] == [("B~bgang", 4)]


def test_a_users_backlog_moves_in_the_queue_only_while_another_user_waits_beside_it():
    """A release moves every tag of its user. Alone in their priority, their tags are all 0 and
    nothing moves; once another user queues there, their jobs take their shares' places; when that
    user's job is placed, they are alone again. validate_state() checks after every event that the
    queue is in the order the users' shares say."""
    h = Harness("two-racks")
    moved: list[str] = []
    fair = h.core._fair
    retag = fair._move
    fair._move = lambda changes: (moved.extend(record.id for record, _ in changes), retag(changes))
    for i in range(30):
        h.submit_spec(spec(f"a{i}", vc="vision", gpus=1, priority="test", user="A"))
    for i in range(4):  # A holds all 8 cells and 22 jobs wait: each release places the next of A's
        assert [d.job for d in h.release(f"A~a{i}") if isinstance(d, Place)] == [f"A~a{8 + i}"]
    assert moved == []
    h.submit_spec(spec("b0", vc="vision", gpus=1, priority="test", user="B"))
    assert len(moved) == 18  # A's waiting jobs, tagged behind their 8 cells
    lane = h.core._queues.lanes["vision"]
    assert [record.id for record in lane[:2]] == ["B~b0", "A~a12"]
    moved.clear()
    assert [d.job for d in h.release("A~a4") if isinstance(d, Place)] == ["B~b0"]
    # The release re-tags A's 18 while B waits (their share shrank); B's placement leaves A alone: 0 again.
    assert moved == [f"A~a{i}" for i in range(12, 30)] * 2
    moved.clear()
    for i in range(5, 9):
        assert [d.job for d in h.release(f"A~a{i}") if isinstance(d, Place)] == [f"A~a{7 + i}"]
    assert moved == []


# --- invariants under random multi-user workloads --------------------------------------------------------

USERS = ["alice", "bob", "carol"]
submit = st.tuples(st.just("submit"), st.sampled_from(USERS), st.integers(0, 1),
                   st.sampled_from(["prod", "test", "test", "oppo"]), st.sampled_from(SHAPES), st.booleans(),
                   st.booleans())
finish = st.tuples(st.just("finish"), st.integers(0, 30))
fail = st.tuples(st.just("fail"), st.integers(0, 30))
cancel = st.tuples(st.just("cancel"), st.integers(0, 60))
node = st.tuples(st.just("node"), st.integers(0, 4), st.booleans())
tick = st.tuples(st.just("tick"), st.sampled_from([1.0, 120.0, 400.0]))


class UserTwins(Twins):
    """The bucketed and the plain-scan cores fed jobs of several users; both check validate_state()
    (fair tags equal to their users' shares computed from scratch) after every event."""

    def step(self, operation) -> None:
        kind = operation[0]
        if kind == "submit":
            _, user, vc, priority, (instances, gpus), gang, lazy = operation
            self.count += 1
            job = f"{user}~j{self.count}"
            job_spec = JobSpec(
                name=f"j{self.count}", user=user, virtualCluster=VCS[vc], priorityClass=priority,
                priority=PRIORITY_CLASSES[priority], gangAllocation=gang, lazyPreemptionEnable=lazy,
                taskRoles=[TaskRole(name="w", instances=instances, resources=Resources(gpu=gpus, memoryMB=512))])
            self.bucketed.attempts[job] = self.plain.attempts[job] = 0
            self.handle(Submit(job=job, attempt=0, spec=job_spec))
        elif kind in ("finish", "fail") and self.running:
            job = sorted(self.running)[operation[1] % len(self.running)]
            self.release(job, requeue=kind == "fail")
        elif kind == "cancel" and self.count:
            number = operation[1] % self.count + 1
            for user in USERS:
                if f"{user}~j{number}" in self.bucketed.attempts:
                    self.handle(Cancel(job=f"{user}~j{number}"))
        elif kind == "node":
            nodes = self.bucketed.core.node_names()
            self.handle(NodeHealth(node=nodes[operation[1] % len(nodes)], healthy=operation[2], reason="test"))
        elif kind == "tick":
            self.bucketed.clock.advance(operation[1])
            self.plain.clock.advance(operation[1])
            self.handle(Tick())


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.one_of(submit, submit, submit, finish, fail, cancel, node, tick), min_size=1, max_size=60),
       fallback=st.sampled_from([None, "unheld"]))
def test_invariants_hold_and_buckets_decide_as_a_plain_scan_with_many_users(ops, fallback):
    twins = UserTwins(shape_fallback=fallback)
    for operation in ops:
        twins.step(operation)
