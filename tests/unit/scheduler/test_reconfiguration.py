"""Restart and reconfiguration: Restore re-occupies running jobs' cells exactly (work-preserving)."""

from __future__ import annotations

import yaml

from services.scheduler.cluster import load_cluster_config

from .builders import FIXTURES, Harness, Place, only, preempted_jobs, spec


def two_racks(change=None):
    data = yaml.safe_load((FIXTURES / "two-racks.yaml").read_text())
    if change is not None:
        change(data)
    return load_cluster_config(data)


def run_and_restart(config_after, jobs):
    """Run `jobs` ({name: spec kwargs}) on two-racks, then restore them into a core on `config_after`."""
    before = Harness("two-racks")
    specs = {}
    for name, kwargs in jobs.items():
        specs[name] = spec(name, **kwargs)
        before.submit_spec(specs[name])
    after = Harness(config_after)
    for name, job_spec in specs.items():
        tasks = before.placed.get(f"alice~{name}", [])
        if tasks:
            after.restore(name, job_spec, tasks)
    return before, after


def test_restart_with_the_same_config_keeps_every_job_where_it_was():
    before, after = run_and_restart(two_racks(), {
        "a": dict(vc="speech", gpus=4), "b": dict(vc="vision", gpus=2, instances=2), "c": dict(vc="speech", gpus=1)})
    assert after.log == []  # nothing is placed or preempted again
    assert [(s.name, [(k.used, k.guaranteed) for k in s.skus]) for s in after.core.vc_status()] == \
        [(s.name, [(k.used, k.guaranteed) for k in s.skus]) for s in before.core.vc_status()]
    assert after.core.restore_warnings == []
    # New work goes around the restored jobs.
    [place] = only(after.submit("d", vc="speech", gpus=3), Place)
    restored_cells = {cell for tasks in before.placed.values() for task in tasks for cell in task.leafCells}
    assert not restored_cells & set(place.tasks[0].leafCells)


def test_restored_gang_that_lost_a_node_keeps_the_tasks_that_still_exist():
    def drop_node_a2(data):
        data["physicalCluster"]["physicalCells"][0]["cellType"] = "A100-NODE"
        data["physicalCluster"]["physicalCells"][0]["cellAddress"] = "node-a1"
        del data["physicalCluster"]["physicalCells"][0]["cellChildren"]
        data["virtualClusters"]["speech"]["virtualCells"] = [{"cellType": "A100-NODE", "cellNumber": 1}]

    before, after = run_and_restart(two_racks(drop_node_a2), {"wide": dict(vc="speech", gpus=4, instances=2)})
    assert sorted(before.nodes_of("wide")) == ["node-a1", "node-a2"]
    assert any("node-a2/0 of task worker" in w and "no longer exists" in w for w in after.core.restore_warnings)
    status = {s.name: s for s in after.core.vc_status()}
    assert status["speech"].skus[0].used == 4


def test_job_of_a_removed_vc_keeps_running_as_opportunistic():
    def remove_speech(data):
        del data["virtualClusters"]["speech"]

    before, after = run_and_restart(two_racks(remove_speech), {"s": dict(vc="speech", gpus=4)})
    assert any("VC speech no longer exists" in w for w in after.core.restore_warnings)
    # Opportunistic now: when vision needs that rack (the other one is down), the job gives way.
    other_rack = "node-b1" if before.nodes_of("s")[0].startswith("node-a") else "node-a1"
    after.node(other_rack, False)
    decisions = after.submit("v", vc="vision", gpus=4, instances=2)
    assert preempted_jobs(decisions) == ["alice~s"]


def test_shrunk_quota_turns_the_extra_job_opportunistic():
    def shrink(data):
        data["virtualClusters"]["speech"]["virtualCells"][0]["cellNumber"] = 1

    before, after = run_and_restart(two_racks(shrink), {"a": dict(vc="speech", gpus=4), "b": dict(vc="speech", gpus=4)})
    assert len([w for w in after.core.restore_warnings if "opportunistic" in w]) == 1
    status = {s.name: s for s in after.core.vc_status()}
    assert (status["speech"].skus[0].used, status["speech"].skus[0].opportunistic) == (4, 4)


def test_added_rack_and_vc_are_used_and_running_jobs_stay():
    def add_rack(data):
        data["physicalCluster"]["physicalCells"].append(
            {"cellType": "A100-RACK", "cellChildren": [{"cellAddress": "node-c1"}, {"cellAddress": "node-c2"}]})
        data["virtualClusters"]["audio"] = {"virtualCells": [{"cellType": "A100-RACK", "cellNumber": 1}]}

    before, after = run_and_restart(two_racks(add_rack), {
        "a": dict(vc="speech", gpus=4), "b": dict(vc="vision", gpus=4, instances=2)})
    assert after.core.restore_warnings == []
    assert "node-c1" in after.core.node_names()
    [place] = only(after.submit("new", vc="audio", gpus=4, instances=2), Place)
    assert sorted(task.node for task in place.tasks) == ["node-c1", "node-c2"]


def test_restored_incremental_job_gets_its_missing_tasks_later():
    h = Harness("two-racks")
    job = spec("steps", vc="speech", gpus=4, instances=2, gang=False)
    first = Harness("two-racks")
    [place] = only(first.submit_spec(job), Place)
    one_task = [place.tasks[0]]
    decisions = h.restore("steps", job, one_task)
    assert decisions == []
    [rest] = only(h.tick(), Place)
    assert rest.tasks[0].index == place.tasks[1].index and not rest.partial


def test_restore_reports_a_cell_held_twice():
    h = Harness("two-racks")
    first = Harness("two-racks")
    a = spec("a", vc="speech", gpus=1)
    [place] = only(first.submit_spec(a), Place)
    h.restore("a", a, place.tasks)
    h.restore("b", spec("b", vc="speech", gpus=1), place.tasks)
    assert any("already held by alice~a" in w for w in h.core.restore_warnings)
