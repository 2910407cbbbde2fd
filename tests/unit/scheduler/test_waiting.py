"""Waiting jobs: reasons a person can act on, no head-of-line blocking, no starvation, cancel."""

from __future__ import annotations

import pytest

from services.scheduler.core import Submit, Tick

from .builders import Harness, Place, Wait, only, placed_jobs, role, spec, waits

NEVER = [
    ("unknown-vc", "mixed-skus", dict(vc="nope"), "VC nope does not exist (VCs: ops, prod, research)"),
    ("unknown-sku", "mixed-skus", dict(vc="research", sku="A100"), "no sku A100 in the cluster"),
    ("sku-not-in-vc", "mixed-skus", dict(vc="prod", sku="T4"), "no sku T4 in VC prod (it has V100)"),
    ("pinned-only-sku", "mixed-skus", dict(vc="ops", sku="T4"), "sku T4 of VC ops is only in its pinned cells"),
    ("pinned-elsewhere", "mixed-skus", dict(vc="research", pinned="ops-t4"),
     "pinned cell ops-t4 is not pinned to VC research"),
    ("more-than-quota", "mixed-skus", dict(vc="prod", gpus=4, instances=2),
     "needs 8 V100 cells at once but VC prod is guaranteed only 4"),
    ("task-bigger-than-node", "mixed-skus", dict(vc="research", sku="V100", gpus=5),
     "task worker[0] needs 5 V100 cells on one node but the largest V100 node has 4"),
    ("gpus-on-cpu-sku", "mixed-skus", dict(vc="ops", sku="CPU", gpus=1),
     "task role worker asks for 1 GPUs but sku CPU has none"),
    ("more-than-cluster-for-opportunistic", "two-racks", dict(vc="speech", priority="oppo", gpus=4, instances=5),
     "needs 20 A100 cells at once but the cluster has only 16"),
]


@pytest.mark.parametrize("fixture,kwargs,expected", [(f, k, e) for _, f, k, e in NEVER], ids=[i for i, *_ in NEVER])
def test_job_that_can_never_fit_waits_with_a_reason_that_says_so(fixture, kwargs, expected):
    h = Harness(fixture)
    decisions = h.submit("job", **kwargs)
    [wait] = only(decisions, Wait)
    assert wait.reason.startswith("cannot be placed as submitted: ")
    assert expected in wait.reason
    assert h.reason("job") == wait.reason


def test_capacity_reason_names_vc_sku_counts_and_queue_position():
    h = Harness("two-racks")
    h.submit("big", vc="speech", gpus=4, instances=2)
    h.submit("first", vc="speech", gpus=4)
    h.submit("second", vc="speech", gpus=2)
    assert h.reason("first") == "waiting in VC speech for 4 A100 cells (0 free of 8 guaranteed); 0 jobs ahead"
    assert h.reason("second") == "waiting in VC speech for 2 A100 cells (0 free of 8 guaranteed); 1 job ahead"
    assert h.reason("big") is None


def test_reason_counts_follow_the_cluster_without_new_wait_decisions():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=4)
    h.submit("b", vc="speech", gpus=3)
    decisions = h.submit("wide", vc="speech", gpus=4, instances=2)
    assert list(waits(decisions)) == ["alice~wide"]
    assert "(1 free of 8 guaranteed)" in h.reason("wide")
    decisions = h.release("b")
    assert waits(decisions) == {}  # same kind of wait, only the counts changed
    assert "(4 free of 8 guaranteed)" in h.reason("wide")


def test_wait_is_sent_again_when_the_kind_of_wait_changes():
    h = Harness("two-racks")
    h.submit("low", vc="speech", priority="test", gpus=4, instances=2)
    decisions = h.submit("high", vc="speech", priority="prod", gpus=4, instances=2)
    assert waits(decisions)["alice~high"].startswith("waiting for 1 preempted job to release their cells")


def test_no_head_of_line_blocking_by_a_gang_that_does_not_fit():
    h = Harness("two-racks")
    h.submit("running", vc="speech", gpus=2)
    h.submit("gang", vc="speech", gpus=4, instances=2)
    assert placed_jobs(h.submit("small", vc="speech", gpus=2)) == ["alice~small"]


def test_aged_gang_stops_backfill_until_it_fits():
    h = Harness("two-racks", gang_priority_after_s=300)
    h.submit("running", vc="speech", gpus=2)
    h.submit("gang", vc="speech", gpus=4, instances=2)
    h.tick(301)
    decisions = h.submit("small", vc="speech", gpus=1)
    assert placed_jobs(decisions) == []
    assert h.reason("small").startswith("waiting behind gang job alice~gang in VC speech, which has waited 5 min")
    assert placed_jobs(h.release("running")) == ["alice~gang"]
    assert h.reason("small").startswith("waiting in VC speech")


def test_aged_gang_does_not_hold_back_higher_priority_or_other_skus():
    h = Harness("mixed-skus", gang_priority_after_s=60)
    h.submit("running", vc="research", sku="V100", gpus=1, priority="test")
    h.submit("gang", vc="research", sku="V100", gpus=2, instances=2, priority="test")
    h.tick(61)
    assert placed_jobs(h.submit("other-sku", vc="research", sku="T4", gpus=1, priority="test")) == ["alice~other-sku"]
    decisions = h.submit("urgent", vc="research", sku="V100", gpus=1, priority="prod")
    assert placed_jobs(decisions) == ["alice~urgent"]


def test_opportunistic_waiting_reason():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=4, instances=2)
    h.submit("b", vc="vision", gpus=4, instances=2)
    h.submit("guest", vc="speech", priority="oppo", gpus=1)
    assert h.reason("guest") == ("waiting for 1 idle A100 cells anywhere in the cluster (opportunistic job; "
                                 "0 idle of 16); 0 opportunistic jobs ahead")


def test_cancel_removes_a_waiting_job_silently():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=4, instances=2)
    h.submit("b", vc="speech", gpus=1)
    assert h.cancel("b") == []
    assert h.reason("b") is None
    assert placed_jobs(h.release("a")) == []


def test_cancel_of_a_placed_job_waits_for_its_release():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=4, instances=2)
    h.submit("b", vc="speech", gpus=4)
    assert h.cancel("a") == []
    assert placed_jobs(h.release("a")) == ["alice~b"]


def test_cancelled_incremental_job_gets_no_more_tasks():
    h = Harness("two-racks")
    h.submit("other", vc="speech", gpus=4)
    h.submit("steps", vc="speech", gpus=4, instances=2, gang=False)
    h.cancel("steps")
    assert placed_jobs(h.release("other")) == []


def test_requeued_attempt_waits_again_with_a_new_attempt_number():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=4, instances=2)
    [place] = only(h.release("a", requeue=True), Place)
    assert (place.job, place.attempt) == ("alice~a", 1)


def test_duplicate_submit_is_ignored():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=1)
    job = spec("a", vc="speech", gpus=1)
    assert h.handle(Submit(job="alice~a", attempt=0, spec=job)) == []


def test_same_events_give_the_same_decisions():
    def run():
        h = Harness("mixed-skus")
        out = []
        for index in range(12):
            out += h.submit(f"j{index}", vc=["research", "prod", "ops"][index % 3], gpus=index % 3,
                            priority=["prod", "test", "oppo"][index % 3], sku=None if index % 4 else "V100")
        out += h.release("j0")
        out += h.handle(Tick())
        return out

    assert run() == run()


def test_multi_role_job_reason_counts_all_tasks_of_the_gang():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=1)
    h.submit_spec(spec("b", vc="speech", roles=[role("ps", gpus=2), role("worker", instances=2, gpus=3)]))
    assert "for 8 A100 cells" in h.reason("b")
