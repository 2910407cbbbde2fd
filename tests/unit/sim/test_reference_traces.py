"""The published traces, read as they are (skipped when ../shared is not here)."""

from __future__ import annotations

import pytest

from services.scheduler.sim.cluster import load_sim_cluster
from services.scheduler.sim.readers import read_trace
from services.scheduler.sim.runner import SimOptions, simulate_files
from services.scheduler.sim.workload import prepare_workload
from tests.unit.sim.helpers import real_trace


@pytest.fixture(scope="module")
def philly():
    return read_trace(real_trace("philly.csv"))


def test_philly_trace_is_read_whole_with_its_quirks_reported(philly):
    assert len(philly.jobs) == 82_247
    assert [(row.kind, row.line) for row in philly.skipped] == [("empty-line", 82_249)]
    assert any(note.startswith("65 rows repeat an earlier row exactly") for note in philly.notes)
    assert any(note.startswith("rows are not in time order") for note in philly.notes)


def test_philly_vcs_hold_2816_gpus_and_four_vcs_without_capacity_are_reported(philly):
    cluster = load_sim_cluster(real_trace("philly_vc.csv"))
    assert (len(cluster.vc_quota), len(cluster.node_gpus), cluster.total_gpus) == (11, 352, 2816)
    workload = prepare_workload(philly, cluster)
    assert len(workload.jobs) == 82_229
    assert len(workload.excluded_vcs) == 4 and sum(workload.excluded_vcs.values()) == 18


def test_alibaba_pods_never_scheduled_are_reported_not_replayed():
    trace = read_trace(real_trace("openb_pod_list_default.csv"))
    kinds = {}
    for row in trace.skipped:
        kinds[row.kind] = kinds.get(row.kind, 0) + 1
    assert kinds["never-scheduled"] == 897  # every Pending pod
    assert len(trace.jobs) + len(trace.skipped) == 8_152
    assert any("still run when the trace ends" in note for note in trace.notes)


def test_alibaba_nodes_make_a_cluster_of_6212_gpus():
    cluster = load_sim_cluster(real_trace("openb_node_list_gpu_node.csv"))
    assert (len(cluster.node_gpus), cluster.total_gpus) == (1_213, 6_212)
    assert sorted(cluster.config.skuTypes) == ["A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"]


def test_one_day_of_philly_runs_through_the_scheduler_core():
    options = SimOptions(policies=("hived",), start="2017-10-02", end="2017-10-02")
    result = simulate_files(real_trace("philly.csv"), real_trace("philly_vc.csv"), options)
    overall = result.report["policies"]["hived"]["overall"]
    assert overall["jobs"] > 500
    assert overall["finished"] == overall["jobs"]
