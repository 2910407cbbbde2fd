"""Where jobs land: topology (buddies), skus, pinned cells, leaf cells per task, gangs, bad nodes."""

from __future__ import annotations

import pytest

from .builders import Harness, Place, Wait, only, placed_jobs, role, spec


def test_two_one_gpu_tasks_land_on_buddy_gpus():
    h = Harness("eight-gpu-node")
    decisions = h.submit("pair", vc="team", gpus=1, instances=2)
    [place] = only(decisions, Place)
    assert sorted(gpu for task in place.tasks for gpu in task.gpus) == [0, 1]
    assert {task.node for task in place.tasks} == {"big"}


@pytest.mark.parametrize("first_gpus,second_gpus,expected", [
    (1, 1, [1]),        # the buddy of GPU 0, not a GPU of the other switch
    (1, 2, [2, 3]),     # the other switch of the same socket keeps socket 4-7 whole
    (2, 4, [4, 5, 6, 7]),
    (1, 4, [4, 5, 6, 7]),
], ids=["1-then-1", "1-then-2", "2-then-4", "1-then-4"])
def test_later_jobs_fill_the_smallest_fitting_cell(first_gpus, second_gpus, expected):
    h = Harness("eight-gpu-node")
    h.submit("first", vc="team", gpus=first_gpus)
    [place] = only(h.submit("second", vc="team", gpus=second_gpus), Place)
    assert place.tasks[0].gpus == expected


def test_gang_spanning_nodes_uses_buddy_nodes_of_one_rack():
    h = Harness("two-racks")
    [place] = only(h.submit("wide", vc="vision", gpus=4, instances=2), Place)
    assert sorted(task.node for task in place.tasks) in (["node-a1", "node-a2"], ["node-b1", "node-b2"])


def test_gang_is_all_or_nothing():
    h = Harness("two-racks")
    h.submit("small", vc="speech", gpus=1)
    decisions = h.submit("gang", vc="speech", gpus=4, instances=2)
    assert placed_jobs(decisions) == []
    assert "alice~gang" in {w.job for w in only(decisions, Wait)}
    decisions = h.release("small")
    [place] = only(decisions, Place)
    assert place.job == "alice~gang" and len(place.tasks) == 2 and not place.partial


def test_incremental_job_is_placed_task_by_task():
    h = Harness("two-racks")
    h.submit("small", vc="speech", gpus=1)
    [first] = only(h.submit("steps", vc="speech", gpus=4, instances=2, gang=False), Place)
    assert len(first.tasks) == 1 and first.partial
    [second] = only(h.release("small"), Place)
    assert second.job == "alice~steps" and len(second.tasks) == 1 and not second.partial
    assert {first.tasks[0].index, second.tasks[0].index} == {0, 1}


def test_affinity_groups_are_separate_gangs():
    h = Harness("two-racks")
    h.submit("small", vc="speech", gpus=1)
    job = spec("groups", vc="speech", roles=[
        role("ps", instances=1, gpus=4, group="a"), role("worker", instances=1, gpus=4, group="b")])
    [place] = only(h.submit_spec(job), Place)
    assert len(place.tasks) == 1 and place.partial
    [rest] = only(h.release("small"), Place)
    assert not rest.partial


@pytest.mark.parametrize("sku,gpus,expected_sku,expected_nodes", [
    ("T4", 1, "T4", {"10.0.1.1"}),
    ("V100", 1, "V100", {"10.0.0.1", "10.0.0.2"}),
    (None, 4, "V100", {"10.0.0.1", "10.0.0.2"}),  # only the V100 nodes of the VC have 4 GPUs
    (None, 2, "V100", {"10.0.0.1", "10.0.0.2"}),  # any sku of the VC: the first that fits
], ids=["job-sku-T4", "job-sku-V100", "no-sku-needs-4", "no-sku"])
def test_sku_selection(sku, gpus, expected_sku, expected_nodes):
    h = Harness("mixed-skus")
    [place] = only(h.submit("job", vc="research", gpus=gpus, sku=sku), Place)
    assert place.tasks[0].skuType == expected_sku
    assert place.tasks[0].node in expected_nodes


def test_role_level_sku_overrides_job_sku():
    h = Harness("mixed-skus")
    job = spec("roles", vc="research", sku="V100", roles=[role("a", gpus=1), role("b", gpus=1, sku="T4")])
    places = only(h.submit_spec(job), Place)
    by_role = {task.role: task.skuType for place in places for task in place.tasks}
    assert by_role == {"a": "V100", "b": "T4"}


@pytest.mark.parametrize("gpus,cpu,memory_mb,cells", [
    (1, 1, 1024, 1),
    (1, 12, 1024, 2),                # cpu: 12 / 6 per cell
    (1, 1, 100 * 1024, 3),           # memory: 100Gi / 48Gi per cell
    (2, 13, 1024, 3),                # the largest dimension wins
    (0, 1, 1024, 1),                 # a CPU task on a GPU sku still takes a cell, and sees no GPU
], ids=["one-gpu", "cpu-bound", "memory-bound", "max-of-dimensions", "no-gpu-request"])
def test_leaf_cells_per_task_is_max_over_resources(gpus, cpu, memory_mb, cells):
    h = Harness("mixed-skus")
    [place] = only(h.submit("job", vc="research", sku="V100", gpus=gpus, cpu=cpu, memory_mb=memory_mb), Place)
    task = place.tasks[0]
    assert len(task.leafCells) == cells
    assert len(task.gpus) == (cells if gpus else 0)


def test_cpu_only_sku_hosts_cpu_tasks():
    h = Harness("mixed-skus")
    [place] = only(h.submit("etl", vc="ops", sku="CPU", gpus=0, cpu=3, memory_mb=2048), Place)
    assert place.tasks[0].node == "10.0.2.1"
    assert len(place.tasks[0].leafCells) == 3
    assert place.tasks[0].gpus == []


def test_pinned_job_runs_on_its_pinned_cell():
    h = Harness("mixed-skus")
    [place] = only(h.submit("pinned", vc="ops", pinned="ops-t4", gpus=2), Place)
    assert place.tasks[0].node == "10.0.1.2"
    assert place.tasks[0].gpus == [0, 1]


def test_unpinned_jobs_do_not_use_pinned_cells():
    h = Harness("mixed-skus")
    h.submit("t4", vc="ops", sku="T4", gpus=1)
    assert "only in its pinned cells (ops-t4)" in h.reason("t4")


def test_guaranteed_jobs_stay_in_their_vc():
    h = Harness("mixed-skus")
    h.submit("first", vc="prod", gpus=4)
    decisions = h.submit("second", vc="prod", gpus=4)
    # research's V100 node is idle, but it is not prod's.
    assert placed_jobs(decisions) == []
    assert h.reason("second").startswith("waiting in VC prod for 4 V100 cells (0 free of 4 guaranteed)")


def test_host_ip_is_the_node_address_when_it_is_an_ip():
    h = Harness("mixed-skus")
    [place] = only(h.submit("job", vc="prod", gpus=1), Place)
    assert place.tasks[0].hostIp == place.tasks[0].node
    assert place.tasks[0].node in ("10.0.0.1", "10.0.0.2")
    h2 = Harness("two-racks")
    [place] = only(h2.submit("job", vc="speech", gpus=1), Place)
    assert place.tasks[0].hostIp == "127.0.0.1"


def test_unhealthy_node_is_avoided_and_used_again_when_healthy():
    # Without shape fallback: with it the job would run meanwhile as borrowed work on team's idle node.
    h = Harness("eight-gpu-node", shape_fallback=None)
    h.node("plain-1", False)
    h.node("plain-2", False)
    decisions = h.submit("job", vc="small", gpus=1)
    assert placed_jobs(decisions) == []
    assert "4 H100 cells of the cluster are on unhealthy nodes" in h.reason("job")
    [place] = only(h.node("plain-2", True), Place)
    assert place.tasks[0].node == "plain-2"


def test_vc_cells_move_off_an_unhealthy_node():
    h = Harness("two-racks")
    h.node("node-a1", False)
    [place] = only(h.submit("job", vc="speech", gpus=4), Place)
    assert place.tasks[0].node != "node-a1"


def test_running_job_is_not_touched_when_its_node_turns_unhealthy():
    h = Harness("two-racks")
    h.submit("job", vc="speech", gpus=4)
    node = h.nodes_of("job")[0]
    assert h.node(node, False) == []
    assert h.is_running("job")
    assert h.release("job") == []


def test_task_gets_cells_on_exactly_one_node():
    h = Harness("two-racks")
    [place] = only(h.submit("job", vc="vision", gpus=4, instances=2), Place)
    for task in place.tasks:
        assert {cell.split("/")[0] for cell in task.leafCells} == {task.node}
