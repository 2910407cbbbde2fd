"""Priorities: opportunistic work spills over and gives way; intra-VC preemption, immediate and lazy."""

from __future__ import annotations

from .builders import Harness, Place, Preempt, only, placed_jobs, preempted_jobs


def test_opportunistic_job_spills_over_to_idle_cells_of_other_vcs():
    h = Harness("mixed-skus")
    [place] = only(h.submit("spill", vc="prod", priority="oppo", gpus=4, instances=2, sku="V100"), Place)
    # prod is guaranteed one V100 node; an opportunistic gang may use both.
    assert sorted(task.node for task in place.tasks) == ["10.0.0.1", "10.0.0.2"]


def test_opportunistic_job_may_use_cells_no_vc_owns():
    h = Harness("eight-gpu-node")
    h.submit("mine", vc="small", gpus=2)
    [place] = only(h.submit("extra", vc="small", priority="oppo", gpus=2), Place)
    assert place.tasks[0].node in ("plain-2", "big")


def test_guaranteed_job_preempts_opportunistic_work_of_another_vc():
    h = Harness("mixed-skus")
    h.submit("spill", vc="research", priority="oppo", gpus=4, instances=2, sku="V100")
    decisions = h.submit("owner", vc="prod", gpus=4)
    [preempt] = only(decisions, Preempt)
    assert (preempt.job, preempt.by) == ("alice~spill", "alice~owner")
    assert "opportunistic" in preempt.reason
    assert placed_jobs(decisions) == []
    assert "waiting for 1 preempted job to release their cells: alice~spill" in h.reason("owner")
    [place] = only(h.finish_preempted(decisions), Place)
    assert place.job == "alice~owner"


def test_guaranteed_job_prefers_free_cells_to_preemption():
    h = Harness("two-racks")
    h.submit("guest", vc="speech", priority="oppo", gpus=4)
    decisions = h.submit("owner", vc="vision", gpus=4)
    assert preempted_jobs(decisions) == []
    assert placed_jobs(decisions) == ["alice~owner"]
    assert h.is_running("guest")


def test_higher_priority_preempts_lower_priority_in_the_same_vc():
    h = Harness("two-racks")
    h.submit("batch", vc="speech", priority="test", gpus=4, instances=2)
    decisions = h.submit("urgent", vc="speech", priority="prod", gpus=4)
    [preempt] = only(decisions, Preempt)
    assert (preempt.job, preempt.by, preempt.vc) == ("alice~batch", "alice~urgent", "speech")
    assert "higher priority (100 > 10)" in preempt.reason
    after = h.finish_preempted(decisions)
    assert placed_jobs(after) == ["alice~urgent"]
    # The victim is queued again as a new attempt and waits for room.
    assert h.reason("batch").startswith("waiting in VC speech for 8 A100 cells")


def test_equal_priority_never_preempts():
    h = Harness("two-racks")
    h.submit("first", vc="speech", priority="prod", gpus=4, instances=2)
    decisions = h.submit("second", vc="speech", priority="prod", gpus=4)
    assert preempted_jobs(decisions) == []


def test_preemption_takes_the_fewest_and_lowest_priority_victims():
    h = Harness("two-racks")
    h.submit("test-job", vc="speech", priority="test", gpus=4)
    h.submit("prod-job", vc="speech", priority="prod", gpus=4)
    decisions = h.submit("crit-job", vc="speech", priority="crit", gpus=4)
    assert preempted_jobs(decisions) == ["alice~test-job"]


def test_reserved_cells_go_to_the_preemptor_not_to_later_jobs():
    h = Harness("two-racks")
    h.submit("batch", vc="speech", priority="test", gpus=4, instances=2)
    preempts = h.submit("urgent", vc="speech", priority="prod", gpus=4, instances=2)
    h.submit("sneaky", vc="speech", priority="prod", gpus=1)
    placed = placed_jobs(h.finish_preempted(preempts))
    assert placed == ["alice~urgent"]


def test_lazy_preemption_downgrades_instead_of_killing_when_everything_fits():
    h = Harness("mixed-skus")
    h.submit("patient", vc="research", priority="test", lazy=True, gpus=4, sku="V100")
    decisions = h.submit("urgent", vc="research", priority="prod", gpus=4, sku="V100")
    # research's quota now maps to the other V100 node; the lazy job keeps running outside it.
    assert preempted_jobs(decisions) == []
    assert placed_jobs(decisions) == ["alice~urgent"]
    assert h.is_running("patient")
    status = {vc.name: vc for vc in h.core.vc_status()}
    v100 = next(s for s in status["research"].skus if s.sku == "V100")
    assert (v100.used, v100.opportunistic) == (4, 4)
    # Now the downgraded job is opportunistic: prod taking back its node preempts it.
    decisions = h.submit("owner", vc="prod", priority="test", gpus=4)
    assert [(p.job, p.by) for p in only(decisions, Preempt)] == [("alice~patient", "alice~owner")]


def test_lazy_preemption_kills_when_nothing_else_fits():
    h = Harness("mixed-skus")
    h.submit("prod-owner", vc="prod", priority="test", gpus=4)
    h.submit("patient", vc="research", priority="test", lazy=True, gpus=4, sku="V100")
    decisions = h.submit("urgent", vc="research", priority="prod", gpus=4, sku="V100")
    assert preempted_jobs(decisions) == ["alice~patient"]
    assert h.is_running("prod-owner")


def test_opportunistic_job_never_preempts():
    h = Harness("two-racks")
    h.submit("owner", vc="speech", priority="test", gpus=4, instances=2)
    h.submit("owner2", vc="vision", priority="test", gpus=4, instances=2)
    decisions = h.submit("guest", vc="speech", priority="oppo", gpus=1)
    assert preempted_jobs(decisions) == []
    assert h.reason("guest").startswith("waiting for 1 idle A100 cells anywhere in the cluster")


def test_cancelled_preemptor_leaves_no_reservation():
    h = Harness("two-racks")
    h.submit("batch", vc="speech", priority="test", gpus=4, instances=2)
    preempts = h.submit("urgent", vc="speech", priority="prod", gpus=4, instances=2)
    h.cancel("urgent")
    after = h.finish_preempted(preempts)
    # The victim comes back as a new attempt and gets its cells again.
    assert placed_jobs(after) == ["alice~batch"]
