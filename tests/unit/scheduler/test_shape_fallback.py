"""Shape fallback (`SchedulingPolicy(shape_fallback=...)`): a guaranteed job that fits its VC's unused
quota in count, but in no cell its VC holds (each holds some small job of the VC and the VC may
bind no more), runs at once on idle cells outside the quota as borrowed work: opportunistic while
it runs (preemptible, not counted in the quota), guaranteed again when it is queued once more.

On two-racks, speech's quota is two nodes of 4 GPUs; below, a 2-GPU and a 3-GPU job of speech sit
on one node each, so 3 of speech's 8 GPUs are unused but no node of it has 3 free.
"""

from __future__ import annotations

import pytest

from services.scheduler.core import Restore

from .builders import Harness, Preempt, only, placed_jobs, preempted_jobs, spec


def _fragmented_speech(fallback: str | None, *, vision_first: bool = False) -> Harness:
    h = Harness("two-racks", shape_fallback=fallback)
    if vision_first:  # vision binds its rack (b): every idle cell outside speech's nodes is vision's
        assert placed_jobs(h.submit("v1", vc="vision", gpus=1)) == ["alice~v1"]
    assert placed_jobs(h.submit("s1", vc="speech", gpus=2)) == ["alice~s1"]
    assert placed_jobs(h.submit("s2", vc="speech", gpus=3)) == ["alice~s2"]
    assert h.nodes_of("s1") != h.nodes_of("s2")
    return h


def _speech_status(h: Harness):
    [status] = [vc for vc in h.core.vc_status() if vc.name == "speech"]
    return status.skus[0]


@pytest.mark.parametrize("fallback, placed", [(None, False), ("idle", True), ("unheld", True)])
def test_a_guaranteed_job_with_no_room_for_its_shape_runs_on_idle_cells_outside_its_quota(fallback, placed):
    h = _fragmented_speech(fallback)
    decisions = h.submit("s3", vc="speech", gpus=3)
    assert placed_jobs(decisions) == (["alice~s3"] if placed else [])
    if not placed:
        assert "enough cells are free but not on few enough nodes" in h.reason("s3")
        return
    assert h.nodes_of("s3")[0].startswith("node-b")  # vision's rack, which no VC holds yet
    assert h.core.entry("alice~s3").borrowed
    assert "placed on borrowed idle cells" in h.core._jobs["alice~s3"].history[-1][1]
    status = _speech_status(h)
    assert (status.used, status.opportunistic) == (5, 3)  # not counted in speech's quota


def test_a_job_over_its_vcs_unused_quota_does_not_fall_back():
    h = _fragmented_speech("idle")
    assert placed_jobs(h.submit("s3", vc="speech", gpus=4)) == []  # 3 unused: beyond the quota, it waits


@pytest.mark.parametrize("fallback, placed", [("idle", True), ("unheld", False)])
def test_unheld_falls_back_only_onto_cells_no_vc_holds(fallback, placed):
    h = _fragmented_speech(fallback, vision_first=True)
    assert placed_jobs(h.submit("s3", vc="speech", gpus=3)) == (["alice~s3"] if placed else [])


def test_a_fallback_job_is_preempted_like_borrowed_work_and_comes_back_guaranteed():
    h = _fragmented_speech("idle")
    h.submit("s3", vc="speech", gpus=3)
    decisions = h.submit("v8", vc="vision", gpus=4, instances=2)  # vision needs its whole rack
    assert preempted_jobs(decisions) == ["alice~s3"]
    [preempt] = only(decisions, Preempt)
    assert "borrowed cells" in preempt.reason and "waits again as a guaranteed job" in preempt.reason
    assert placed_jobs(h.finish_preempted(decisions)) == ["alice~v8"]
    record = h.core._jobs["alice~s3"]
    assert (record.attempt, record.opportunistic, record.borrowed) == (1, False, False)
    assert "waiting in VC speech" in h.reason("s3")  # no idle cell left anywhere
    assert placed_jobs(h.release("s1")) == ["alice~s3"]  # room in its VC: placed there, guaranteed
    assert not h.core.entry("alice~s3").borrowed
    assert _speech_status(h).opportunistic == 0


@pytest.mark.parametrize("borrowed", [True, False])
def test_a_restarted_scheduler_restores_a_fallback_job_as_borrowed_work(borrowed):
    before = _fragmented_speech("idle")
    before.submit("s3", vc="speech", gpus=3)
    after = Harness("two-racks", shape_fallback="idle")
    # The fallback job first, as a restart may list it.
    for name, gpus in (("s3", 3), ("s1", 2), ("s2", 3)):
        job = f"alice~{name}"
        mark = borrowed and before.core.entry(job).borrowed
        after.attempts[job] = 0
        after.handle(Restore(job=job, attempt=0, spec=spec(name, vc="speech", gpus=gpus),
                             tasks=before.placed[job], borrowed=mark))
    after.tick()
    opportunistic = sorted(job.id for job in after.core._jobs.values() if job.opportunistic)
    if borrowed:
        assert after.core.restore_warnings == []
        assert opportunistic == ["alice~s3"] and after.core.entry("alice~s3").borrowed
    else:  # unmarked, s3 is bound into speech's quota in vision's rack: s1 and s2 no longer can be
        assert opportunistic == ["alice~s1", "alice~s2"]
        assert len([w for w in after.core.restore_warnings if "opportunistic" in w]) == 2
