"""VC safety: a VC's quota is always bindable, and no VC's guaranteed jobs fragment another VC."""

from __future__ import annotations

import pytest

from .builders import Harness, Place, only, placed_jobs, preempted_jobs


def test_single_nodes_of_one_vc_pack_into_one_rack_so_a_whole_rack_stays_free():
    h = Harness("two-racks")
    h.submit("s1", vc="speech", gpus=4)
    h.submit("s2", vc="speech", gpus=4)
    racks = {node[:6] for node in h.nodes_of("s1") + h.nodes_of("s2")}
    assert len(racks) == 1
    [place] = only(h.submit("wide", vc="vision", gpus=4, instances=2), Place)
    assert {task.node[:6] for task in place.tasks} != racks


@pytest.mark.parametrize("order", [
    ["speech-small", "vision-small", "speech-node"],
    ["vision-small", "speech-small", "speech-node"],
    ["speech-node", "vision-small", "speech-small"],
], ids=["speech-first", "vision-first", "big-speech-first"])
def test_interleaved_vcs_each_get_their_full_quota(order):
    h = Harness("two-racks")
    shapes = {"speech-small": ("speech", 1), "vision-small": ("vision", 1), "speech-node": ("speech", 4)}
    for name in order:
        vc, gpus = shapes[name]
        assert placed_jobs(h.submit(name, vc=vc, gpus=gpus)) == [f"alice~{name}"]
    # Whatever came first, the rest of each quota is still there.
    assert placed_jobs(h.submit("vision-rest", vc="vision", gpus=1, instances=7))
    assert placed_jobs(h.submit("speech-rest", vc="speech", gpus=3))


def test_opportunistic_work_everywhere_does_not_take_a_vc_quota():
    h = Harness("two-racks")
    for index in range(4):
        h.submit(f"guest{index}", vc="speech", priority="oppo", gpus=4)
    assert len(h.placed) == 4
    decisions = h.submit("owner", vc="vision", gpus=4, instances=2)
    assert len(preempted_jobs(decisions)) == 2
    assert placed_jobs(h.finish_preempted(decisions)) == ["alice~owner"]


def test_vc_without_free_quota_cannot_take_another_vcs_idle_cells():
    h = Harness("two-racks")
    h.submit("s", vc="speech", gpus=4, instances=2)
    decisions = h.submit("more", vc="speech", gpus=1)
    assert placed_jobs(decisions) == []
    assert "(0 free of 8 guaranteed)" in h.reason("more")
