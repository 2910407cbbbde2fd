"""A pass looks only at the heads of its lists' buckets (jobs asking for the same thing): what a user sees
must stay as if every waiting job were tried in queue order."""

from services.scheduler.core import Release, Submit
from tests.unit.scheduler.builders import Harness, placed_jobs, preempted_jobs, spec, waits


def test_jobs_submitted_together_are_placed_in_order_and_the_rest_get_a_reason():
    h = Harness("two-racks")
    jobs = [f"job{n}" for n in range(5)]
    h.attempts.update({f"alice~{name}": 0 for name in jobs})
    decisions = h.handle(*(Submit(job=f"alice~{name}", attempt=0, spec=spec(name, vc="speech", gpus=4))
                           for name in jobs))
    assert placed_jobs(decisions) == ["alice~job0", "alice~job1"]  # speech holds two 4-GPU nodes
    reasons = waits(decisions)
    assert sorted(reasons) == ["alice~job2", "alice~job3", "alice~job4"]
    assert h.reason("job4").startswith("waiting in VC speech for 4 A100 cells (0 free of 8 guaranteed); 2 jobs ahead")
    # A node comes free: the first of the same-sized jobs gets it, the next ones keep waiting.
    assert placed_jobs(h.release("job0")) == ["alice~job2"]
    assert h.reason("job4").startswith("waiting in VC speech for 4 A100 cells (0 free of 8 guaranteed); 1 job ahead")


def test_a_small_job_behind_a_bucket_that_does_not_fit_is_still_placed():
    h = Harness("two-racks")
    h.submit("running", vc="speech", gpus=4)
    for n in range(3):
        h.submit(f"big{n}", vc="speech", gpus=4, instances=2)  # same size: one bucket, none fits
    assert placed_jobs(h.submit("small", vc="speech", gpus=1)) == ["alice~small"]
    assert h.reason("big2").startswith("waiting in VC speech for 8 A100 cells")


def test_an_aged_opportunistic_gang_bigger_than_the_free_cells_still_holds_back_its_vcs_backfill():
    """Opportunistic buckets asking for more than the free cells are not looked at, except a gang
    old enough to start holding back backfill: without that it would never be seen to age."""
    h = Harness("two-racks", gang_priority_after_s=300)
    h.submit("vision-all", vc="vision", gpus=4, instances=2)
    h.submit("speech-node", vc="speech", gpus=4)
    h.submit("speech-pair", vc="speech", gpus=2)  # 2 GPUs of 16 left free
    h.submit("gang", vc="speech", priority="oppo", gpus=4, instances=2)
    h.tick(301)
    assert placed_jobs(h.submit("speech-guest", vc="speech", priority="oppo", gpus=1)) == []
    assert h.reason("speech-guest").startswith("waiting behind gang job alice~gang")
    # Another VC's opportunistic work is not held back by speech's gang.
    assert placed_jobs(h.submit("vision-guest", vc="vision", priority="oppo", gpus=1)) == ["alice~vision-guest"]


def test_a_job_kept_to_cells_no_vc_holds_failing_does_not_hold_back_a_same_sized_borrower():
    """A job preempted up to its budget waits for cells no VC holds; its failing to fit says nothing
    about a job of the same size that may borrow a VC's idle cells (it is tried, not skipped)."""
    h = Harness("two-racks", opportunistic_preemption_budget=1)
    h.submit("owner", vc="vision", gpus=1)  # vision binds one rack: 7 idle GPUs in its cells
    h.submit("old", vc="speech", priority="oppo", gpus=4)
    h.clock.advance(600)
    h.submit("young", vc="speech", priority="oppo", gpus=4)
    decisions = h.submit("speaker", vc="speech", gpus=4)  # speech binds the node young runs on
    assert preempted_jobs(decisions) == ["alice~young"]
    h.attempts["alice~young"] = 1
    h.attempts["alice~guest"] = 0
    decisions = h.handle(Release(job="alice~young", attempt=0, requeue=True),
                         Submit(job="alice~guest", attempt=0, spec=spec("guest", vc="vision", priority="oppo", gpus=4)))
    assert placed_jobs(decisions) == ["alice~speaker", "alice~guest"]  # guest in vision's idle node
    assert "no VC holds" in h.reason("young")
