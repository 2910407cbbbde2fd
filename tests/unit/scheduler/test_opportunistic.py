"""Opportunistic work without thrash: which borrowed cells a guaranteed job takes back.

Opportunistic jobs restart from scratch when preempted, so when a guaranteed job must
take back borrowed cells it takes those of the most recently started opportunistic jobs
(the least work thrown away), and only as many as it needs; it never preempts while
free cells it may use would do.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from libs.common.protocol.model import JobSpec, Resources, TaskRole
from services.scheduler.cluster import (
    ClusterConfig,
    load_cluster_config,
    local_cluster_config,
)
from services.scheduler.core import Submit

from .builders import (
    Harness,
    Place,
    Preempt,
    only,
    placed_jobs,
    preempted_jobs,
    quota_leaves,
)
from .test_properties import Launcher, operations


def _fill_with_opportunistic_jobs(h: Harness, count: int, *, gpus: int = 4, every_s: float = 100.0) -> list[str]:
    """`count` opportunistic jobs from VC speech, one node each, started `every_s` apart (oldest first)."""
    names = []
    for n in range(count):
        name = f"borrower{n}"
        assert placed_jobs(h.submit(name, vc="speech", priority="oppo", gpus=gpus)) == [f"alice~{name}"]
        names.append(name)
        h.clock.advance(every_s)
    return names


def test_guaranteed_job_takes_back_the_cells_of_the_youngest_opportunistic_job():
    h = Harness("two-racks")
    borrowers = _fill_with_opportunistic_jobs(h, 4)  # every GPU of the cluster is borrowed
    decisions = h.submit("owner", vc="vision", gpus=4)
    assert preempted_jobs(decisions) == ["alice~borrower3"]  # started last: the least work lost
    [preempt] = only(decisions, Preempt)
    assert "VC vision needs these cells for guaranteed job alice~owner" in preempt.reason
    [place] = only(h.finish_preempted(decisions), Place)
    assert place.job == "alice~owner"
    assert all(h.is_running(name) for name in borrowers[:3])


def test_youngest_first_goes_on_in_age_order_and_takes_only_what_is_needed():
    h = Harness("two-racks")
    _fill_with_opportunistic_jobs(h, 4)
    decisions = h.submit("owner", vc="vision", gpus=4, instances=2)  # two nodes: the two youngest
    assert sorted(preempted_jobs(decisions)) == ["alice~borrower2", "alice~borrower3"]
    assert placed_jobs(h.finish_preempted(decisions)) == ["alice~owner"]
    assert h.is_running("borrower0") and h.is_running("borrower1")


def test_guaranteed_job_uses_free_cells_of_its_quota_before_taking_borrowed_ones():
    h = Harness("two-racks")
    _fill_with_opportunistic_jobs(h, 3)  # one node stays free
    decisions = h.submit("owner", vc="vision", gpus=4)
    assert preempted_jobs(decisions) == []
    assert placed_jobs(decisions) == ["alice~owner"]


def test_a_long_running_opportunistic_job_is_not_thrown_away_again_and_again():
    """Guaranteed jobs come and go on a full cluster. Each takes back the cells of the job
    that borrowed them last, a job that just started; the one that has run for hours keeps
    running. Taking the first borrowed cells in cell order instead would kill and restart it
    each time, losing all its work every time (thrash)."""
    h = Harness("two-racks")
    _fill_with_opportunistic_jobs(h, 4, every_s=3600.0)  # borrower0 has run for 4 hours
    for cycle in range(4):
        h.submit(f"late{cycle}", vc="speech", priority="oppo", gpus=4)  # waits: nothing idle
        decisions = h.submit(f"owner{cycle}", vc="vision", gpus=4)
        assert len(preempted_jobs(decisions)) == 1
        assert "alice~borrower0" not in preempted_jobs(decisions)
        h.finish_preempted(decisions)
        h.clock.advance(60.0)
        h.release(f"owner{cycle}")  # the guaranteed job ends; the waiting borrower starts on its node
        h.clock.advance(60.0)
    assert h.is_running("borrower0")


@pytest.mark.parametrize("at_back, order", [(True, ["fresh", "borrower3", "later"]),
                                             (False, ["borrower3", "fresh", "later"])])
def test_a_preempted_opportunistic_job_queues_again_behind_the_jobs_already_waiting(at_back, order):
    """On a full cluster the cells that free up go to waiting opportunistic jobs one by one. A job
    preempted there queues again at the back, as a new arrival would: jobs that have waited since
    before the preemption (and never ran) start first; jobs that arrive after it still come after it."""
    h = Harness("two-racks", requeue_at_back=at_back)
    _fill_with_opportunistic_jobs(h, 4)  # every GPU of the cluster is borrowed
    h.submit("fresh", vc="speech", priority="oppo", gpus=4)  # waits: nothing idle
    decisions = h.submit("owner", vc="vision", gpus=4)
    assert preempted_jobs(decisions) == ["alice~borrower3"]
    assert placed_jobs(h.finish_preempted(decisions)) == ["alice~owner"]
    h.submit("later", vc="speech", priority="oppo", gpus=4)
    started = []
    for ending in ["owner", "borrower0", "borrower1"]:  # one node frees up at a time
        h.clock.advance(60.0)
        started += [job.removeprefix("alice~") for job in placed_jobs(h.release(ending))]
    assert started == order


def test_opportunistic_work_goes_to_cells_no_vc_holds_before_holes_in_a_vcs_cells():
    h = Harness("two-racks")
    h.submit("owner", vc="vision", gpus=1)  # vision binds one rack; 7 of its GPUs stay idle
    vision_rack = {"node-a1", "node-a2"} if h.nodes_of("owner")[0].startswith("node-a") else {"node-b1", "node-b2"}
    h.submit("borrower", vc="speech", priority="oppo", gpus=4)
    assert not set(h.nodes_of("borrower")) & vision_rack  # vision's next job would take those holes first


def _speech_borrowers_and_a_guaranteed_job(h: Harness) -> tuple[set[str], list]:
    """speech's two opportunistic jobs fill the rack vision does not hold; a guaranteed job of
    speech then preempts the younger one. Returns vision's rack and what followed the preemption."""
    h.submit("owner", vc="vision", gpus=1)
    vision_rack = {"node-a1", "node-a2"} if h.nodes_of("owner")[0].startswith("node-a") else {"node-b1", "node-b2"}
    h.submit("old", vc="speech", priority="oppo", gpus=4)
    h.clock.advance(600)
    h.submit("young", vc="speech", priority="oppo", gpus=4)
    assert not (set(h.nodes_of("old")) | set(h.nodes_of("young"))) & vision_rack
    decisions = h.submit("speaker", vc="speech", gpus=4)  # speech must bind a node of the other rack
    assert preempted_jobs(decisions) == ["alice~young"]
    return vision_rack, h.finish_preempted(decisions)


@pytest.mark.parametrize("budget, placed_again", [(1, False), (2, True), (None, True)])
def test_an_opportunistic_job_preempted_up_to_its_budget_may_borrow_a_vcs_idle_cells_again(budget, placed_again):
    """Budget 2 (the default): preempted once, it gets one more chance on the idle part of a VC's
    cells; with budget 1 it waits for cells no VC holds right away."""
    h = Harness("two-racks") if budget is None else Harness("two-racks", opportunistic_preemption_budget=budget)
    vision_rack, after = _speech_borrowers_and_a_guaranteed_job(h)
    assert ("alice~young" in placed_jobs(after)) is placed_again
    if placed_again:
        assert set(h.nodes_of("young")) <= vision_rack
    else:
        assert "no VC holds" in h.reason("young") and "preempted 1 time" in h.reason("young")


def test_a_preempted_opportunistic_job_waits_for_cells_no_vc_holds():
    """Preempted as often as its budget allows, it is not placed again in the idle part of a VC's
    cells, where that VC's next guaranteed job would preempt it again; it waits for cells no VC holds."""
    h = Harness("two-racks", opportunistic_preemption_budget=1)
    h.submit("owner", vc="vision", gpus=1)
    vision_rack = {"node-a1", "node-a2"} if h.nodes_of("owner")[0].startswith("node-a") else {"node-b1", "node-b2"}
    h.submit("old", vc="speech", priority="oppo", gpus=4)
    h.clock.advance(600)
    h.submit("young", vc="speech", priority="oppo", gpus=4)
    assert not (set(h.nodes_of("old")) | set(h.nodes_of("young"))) & vision_rack
    decisions = h.submit("speaker", vc="speech", gpus=4)  # speech must bind a node of the other rack
    assert preempted_jobs(decisions) == ["alice~young"]
    after = h.finish_preempted(decisions)
    assert placed_jobs(after) == ["alice~speaker"]
    # A whole idle node remains in vision's rack, but young waits for cells no VC holds.
    assert not h.is_running("young")
    assert "no VC holds" in h.reason("young") and "preempted 1 time" in h.reason("young")
    freed = h.nodes_of("old")
    assert placed_jobs(h.release("old")) == ["alice~young"]
    assert h.nodes_of("young") == freed


def test_an_aged_opportunistic_gang_holds_back_only_its_own_vcs_opportunistic_jobs():
    """One VC's big opportunistic gang waiting for the whole cluster must not stop every VC's
    opportunistic work (idle cells would stay unused for as long as it waits)."""
    h = Harness("two-racks", gang_priority_after_s=300)
    h.submit("running", vc="vision", priority="oppo", gpus=2)
    h.submit("gang", vc="speech", priority="oppo", gpus=4, instances=4)  # every GPU of the cluster
    h.tick(301)
    assert placed_jobs(h.submit("other-vc", vc="vision", priority="oppo", gpus=1)) == ["alice~other-vc"]
    assert placed_jobs(h.submit("same-vc", vc="speech", priority="oppo", gpus=1)) == []
    assert h.reason("same-vc").startswith("waiting behind gang job alice~gang in the opportunistic queue")


# --- HiveD's guarantee, on random workloads ------------------------------------------------------

GUARANTEE_FIXTURES = ["two-racks", "eight-gpu-node"]


def _unused_quota(launcher, vc: str, sku: str) -> int:
    """Leaf cells of the VC's quota that none of its running guaranteed jobs holds."""
    held = sum(len(task.leafCells) for job, tasks in launcher.running.items() for task in tasks
               if launcher.specs[job].virtualCluster == vc and launcher.specs[job].priority >= 0
               and not launcher.h.core.entry(job).borrowed and task.skuType == sku)
    return quota_leaves(launcher.h.config, vc)[sku] - held


@pytest.mark.parametrize("fallback", [None, "idle"])
@pytest.mark.parametrize("fixture", GUARANTEE_FIXTURES)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, share=st.floats(0.0, 1.0))
def test_a_guaranteed_job_that_fits_its_vcs_unused_quota_is_placed_at_once(fixture, fallback, ops, share):
    """Whatever other VCs and opportunistic jobs hold: placed in the same call, or as soon as the
    opportunistic jobs it preempts release their cells (and it preempts no guaranteed job; a guaranteed
    job that fell back outside its quota is borrowed work)."""
    launcher = Launcher(fixture, shape_fallback=fallback)
    for operation in ops:
        launcher.step(operation)
    for node in launcher.h.core.node_names():
        launcher.apply(launcher.h.node(node, True))
    for vc in launcher.h.config.virtualClusters:
        for sku in quota_leaves(launcher.h.config, vc):
            unused = _unused_quota(launcher, vc, sku)
            if unused <= 0:
                continue
            probe = copy.deepcopy(launcher)
            cells = max(1, round(share * unused))
            job_spec = JobSpec(name="probe", user="root", virtualCluster=vc, priorityClass="crit", priority=120,
                               skuType=sku, taskRoles=[TaskRole(name="w", instances=cells, resources=Resources(
                                   gpu=1, cpu=1, memoryMB=512))])
            probe.specs["root~probe"] = job_spec
            probe.h.attempts["root~probe"] = 0
            decisions = probe.h.handle(Submit(job="root~probe", attempt=0, spec=job_spec))
            victims = [d.job for d in decisions if isinstance(d, Preempt)]
            assert all(probe.specs[victim].priority < 0 or probe.h.core.entry(victim).borrowed
                       for victim in victims), victims
            probe.apply(decisions)  # the launcher stops the victims and releases their cells
            assert "root~probe" in probe.running, (
                f"{cells} of VC {vc}'s {unused} unused {sku} cells: {probe.h.core.waiting_reason('root~probe')}")


# --- long queues -------------------------------------------------------------------------------


def test_a_long_queue_in_a_busy_vc_keeps_order_and_reasons():
    h = Harness("two-racks")
    h.submit("running", vc="speech", gpus=4, instances=2)  # speech's whole quota
    for n in range(400):
        h.submit(f"waiting{n}", vc="speech", gpus=1 + n % 4)
    assert h.reason("waiting399").startswith("waiting in VC speech for 4 A100 cells (0 free of 8 guaranteed); "
                                              "399 jobs ahead")
    placed = placed_jobs(h.release("running"))
    assert placed[:3] == ["alice~waiting0", "alice~waiting1", "alice~waiting2"]  # in queue order
    assert h.reason("waiting399").startswith("waiting in VC speech")


def test_a_job_waiting_to_take_its_reserved_cells_is_reached_behind_a_job_that_cannot_fit():
    """The pass stops walking a VC's list when its quota is fully held, but never before a job
    that only waits for its victims to leave reserved cells."""
    h = Harness("two-racks")
    h.submit("low", vc="speech", priority="test", gpus=4, instances=2)
    decisions = h.submit("high", vc="speech", priority="prod", gpus=4, instances=2)
    assert preempted_jobs(decisions) == ["alice~low"]
    h.submit("urgent", vc="speech", priority="crit", gpus=4, instances=2)  # ahead in the queue, cannot fit
    assert "alice~high" in placed_jobs(h.finish_preempted(decisions))


@pytest.mark.parametrize("compact, large_placed", [(True, True), (False, False)])
def test_a_guaranteed_job_takes_borrowed_holes_in_its_vcs_cells_before_binding_another(compact, large_placed):
    """Compaction before binding: borrowed work in the idle part of a VC's cells would push the VC's
    small jobs into cells it has not bound yet, until no whole cell is left for its large job,
    which alone on its quota would have run (a sharing anomaly)."""
    # (The 3-GPU guest must be let into a VC's holes: large_borrowers_unheld would keep it out.)
    h = Harness("two-racks", compact_before_binding=compact, large_borrowers_unheld=False)
    h.submit("first", vc="speech", gpus=1)  # speech binds one node; 3 of its GPUs idle
    h.submit("small-guest", vc="vision", priority="oppo", gpus=2)  # half of speech's other node
    h.submit("vision-all", vc="vision", gpus=4, instances=2)  # vision binds the other rack
    h.submit("guest", vc="vision", priority="oppo", gpus=3)  # no idle cell outside VCs: speech's holes
    assert h.is_running("guest") and h.is_running("small-guest")
    decisions = h.submit("second", vc="speech", gpus=2)
    assert preempted_jobs(decisions) == (["alice~guest"] if compact else [])
    h.finish_preempted(decisions)
    assert h.is_running("second")
    decisions = h.submit("large", vc="speech", gpus=4)  # within speech's quota: 3 + 4 of 8 GPUs
    placed = placed_jobs(decisions) + placed_jobs(h.finish_preempted(decisions))
    assert ("alice~large" in placed) is large_placed


def _node_quota_racks() -> ClusterConfig:
    """Two racks of two 4-GPU nodes; VCs a and b own two nodes each and no VC owns a whole rack."""
    return load_cluster_config({
        "physicalCluster": {
            "skuTypes": {"gpu": {"gpu": 1}},
            "cellTypes": {"gpu-node": {"childCellType": "gpu", "childCellNumber": 4, "isNodeLevel": True},
                          "gpu-rack": {"childCellType": "gpu-node", "childCellNumber": 2}},
            "physicalCells": [{"cellType": "gpu-rack", "cellChildren": [{"cellAddress": "node-a1"},
                                                                        {"cellAddress": "node-a2"}]},
                              {"cellType": "gpu-rack", "cellChildren": [{"cellAddress": "node-b1"},
                                                                        {"cellAddress": "node-b2"}]}],
        },
        "virtualClusters": {"a": {"virtualCells": [{"cellType": "gpu-rack.gpu-node", "cellNumber": 2}]},
                            "b": {"virtualCells": [{"cellType": "gpu-rack.gpu-node", "cellNumber": 2}]}},
    })


@pytest.mark.parametrize("anywhere, preempted", [(True, []), (False, ["alice~guest"])])
def test_binding_takes_an_idle_node_of_a_whole_rack_before_a_borrowed_node_when_no_vc_needs_racks(anywhere, preempted):
    """Buddy order binds the free nodes of split racks first, keeping whole racks free; where no VC's
    quota is a rack, that only made a VC kill the borrower on such a node while a whole rack was idle."""
    h = Harness(_node_quota_racks(), bind_anywhere=anywhere)
    h.submit("first", vc="a", gpus=4)  # a binds node-a1: rack a is split, node-a2 is a free node
    h.submit("guest", vc="a", priority="oppo", gpus=4)  # best fit among cells no VC holds: node-a2
    assert h.nodes_of("guest") == ["node-a2"]
    decisions = h.submit("owner", vc="b", gpus=1)
    assert preempted_jobs(decisions) == preempted
    h.finish_preempted(decisions)
    assert h.is_running("owner")
    assert h.nodes_of("owner") == (["node-b1"] if anywhere else ["node-a2"])


def test_binding_does_not_cut_into_a_whole_rack_a_vcs_quota_may_need():
    """two-racks: vision's quota is a whole rack, so speech's second node comes from the split rack,
    borrowed or not, whatever bind_anywhere says (VC safety)."""
    h = Harness("two-racks", bind_anywhere=True)
    h.submit("first", vc="speech", gpus=4)  # speech binds node-a1
    h.submit("guest", vc="vision", priority="oppo", gpus=4)  # node-a2, the free node of the split rack
    assert h.nodes_of("guest") == ["node-a2"]
    decisions = h.submit("second", vc="speech", gpus=4)
    assert preempted_jobs(decisions) == ["alice~guest"]
    h.finish_preempted(decisions)
    assert h.nodes_of("second") == ["node-a2"]


@pytest.mark.parametrize("rule", [True, False])
def test_a_borrower_of_half_a_node_waits_for_cells_no_vc_holds_rather_than_take_a_vcs_holes(rule):
    """A VC takes back the holes of its own cells as soon as its guaranteed work grows: a borrower of
    half a node or more placed there (on the Philly replay, 4-GPU jobs that then ran for days) is
    killed by the VC's next small job. It waits for cells no VC holds instead."""
    h = Harness(_node_quota_racks(), large_borrowers_unheld=rule)
    h.submit("first", vc="a", gpus=1)  # a binds node-a1: 3 GPUs of it idle
    for n in range(3):  # whole-node borrowers fill every node no VC holds
        h.submit(f"whole{n}", vc="b", priority="oppo", gpus=4)
    h.submit("half", vc="b", priority="oppo", gpus=2)
    assert h.is_running("half") is not rule
    if rule:
        assert "no VC holds" in h.reason("half")
    decisions = h.submit("second", vc="a", gpus=2)
    assert preempted_jobs(decisions) == ([] if rule else ["alice~half"])
    h.finish_preempted(decisions)
    assert h.is_running("second")


def test_with_one_vc_a_borrower_of_half_a_node_takes_the_vcs_idle_cells():
    """With one VC (`pai up`'s cluster) every borrower is that VC's own work, taken back only by its own
    guaranteed jobs: it runs beside them at once instead of waiting for the VC's cells to empty."""
    h = Harness(local_cluster_config(gpus=4, cpus=16, memory_mb=65536))
    h.submit("first", vc="default", gpus=1)  # the VC binds the only node: 3 GPUs of it idle
    h.submit("half", vc="default", priority="oppo", gpus=2)
    assert h.is_running("half")

def _old_borrowers_in_a_holes(h: Harness) -> None:
    """a binds one node for a 1-GPU job; whole-node borrowers fill the three nodes no VC holds, and
    1-GPU borrowers then fill a's holes; ten hours later one whole-node borrower ends."""
    h.submit("first", vc="a", gpus=1)
    for n in range(3):
        h.submit(f"whole{n}", vc="b", priority="oppo", gpus=4)
    for n in range(3):
        h.submit(f"old{n}", vc="b", priority="oppo", gpus=1)
    assert sorted(h.nodes_of("first") + [node for n in range(3) for node in h.nodes_of(f"old{n}")]) == \
        [h.nodes_of("first")[0]] * 4
    h.clock.advance(10 * 3600)


@pytest.mark.parametrize("limit, preempted", [(5.0, []), (None, ["alice~old2"])])
def test_compaction_gives_way_to_binding_when_its_victims_ran_long(limit, preempted):
    """Compaction takes the youngest borrower in the VC's own cells even when that one ran for hours
    (Philly 8x: 4-GPU borrowers killed after days in a VC's holes for a 1-GPU job, while a borrower
    on cells no VC holds had started minutes before). Over the limit, the VC binds another cell."""
    h = Harness(_node_quota_racks(), compaction_cost_limit=limit)
    _old_borrowers_in_a_holes(h)
    h.release("alice~whole2")
    h.submit("young", vc="b", priority="oppo", gpus=1)  # cells no VC holds first: whole2's node
    h.clock.advance(60)
    decisions = h.submit("second", vc="a", gpus=1)
    assert preempted_jobs(decisions) == preempted
    h.finish_preempted(decisions)
    assert h.is_running("second")  # placed at once either way (HiveD's guarantee)
    assert h.is_running("young")


def test_costly_compaction_still_happens_when_the_vc_may_bind_no_more():
    h = Harness(_node_quota_racks(), compaction_cost_limit=5.0)
    _old_borrowers_in_a_holes(h)
    h.release("alice~whole2")
    h.submit("big", vc="a", gpus=4)  # a binds its second node: now it may bind no more
    decisions = h.submit("second", vc="a", gpus=1)
    assert preempted_jobs(decisions) == ["alice~old2"]  # the youngest in a's cells, old as it is
    h.finish_preempted(decisions)
    assert h.is_running("second")


def _a_costly_take_back(h: Harness) -> str:
    """VC b borrows three whole nodes for 10 h; VC a binds one of them: the borrower killed there."""
    h.submit("first", vc="a", gpus=4)  # a binds node-a1
    for n in range(3):
        h.submit(f"whole{n}", vc="b", priority="oppo", gpus=4)
    h.clock.advance(10 * 3600)
    decisions = h.submit("owner", vc="a", gpus=4)  # a binds a borrowed node: 40 GPU-h thrown away
    [killed] = preempted_jobs(decisions)
    h.finish_preempted(decisions)  # the killed borrower is queued again
    return killed


def _a_borrowed_node_freed(h: Harness) -> None:
    """One of b's surviving borrowers ends: a whole node no VC holds is idle again."""
    h.release(next(f"alice~whole{n}" for n in range(3) if h.is_running(f"whole{n}")))


@pytest.mark.parametrize("reserve", [(24 * 3600.0, 8.0, 8), None])
def test_after_a_costly_take_back_opportunistic_work_leaves_idle_cells_for_binding(reserve):
    """Adaptive reserve: a borrower killed after a long run makes opportunistic work leave as many idle
    cells no VC holds, for the window, so the next VC that binds finds one idle instead of killing."""
    h = Harness(_node_quota_racks(), adaptive_reserve=reserve, reserve_after_waiting_s=None,
                compaction_cost_limit=None)
    killed = _a_costly_take_back(h)
    assert h.is_running("owner")
    _a_borrowed_node_freed(h)
    assert (killed in h.placed) is (reserve is None)  # the reserve keeps it idle for the next binding
    if reserve is not None:
        assert not placed_jobs(h.submit("small", vc="b", priority="oppo", gpus=1))  # a's holes: none idle
        h.tick(25 * 3600)  # the kill ages out of the window: the reserve drains, the node is borrowed again
        assert killed in h.placed


@pytest.mark.parametrize("waited_h, reserved", [(7, True), (5, False)])
def test_the_reserve_holds_only_once_opportunistic_work_has_waited_long(waited_h, reserved):
    """A costly take-back in a short burst leaves nothing idle; once the opportunistic job first in the
    queue has waited reserve_after_waiting_s (a sustained overload), the reserve holds."""
    h = Harness(_node_quota_racks(), adaptive_reserve=(24 * 3600.0, 8.0, 8), reserve_after_waiting_s=6 * 3600.0,
                compaction_cost_limit=None)
    killed = _a_costly_take_back(h)  # the killed borrower is first in the opportunistic queue
    h.tick(waited_h * 3600)  # it waits: no cell is idle
    assert killed not in h.placed
    _a_borrowed_node_freed(h)
    assert (killed in h.placed) is not reserved
    if reserved:  # its wait says why idle cells stay idle
        assert "4 idle cells that no VC holds are kept for VCs' guaranteed jobs" in h.reason(killed.split("~")[1])
