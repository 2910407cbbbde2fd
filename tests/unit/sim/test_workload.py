"""Preparing the jobs of a run: gang shapes, windows, VCs without capacity, load factor, sampling."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from services.scheduler.sim.cluster import load_sim_cluster
from services.scheduler.sim.readers import read_trace
from services.scheduler.sim.workload import parse_time, prepare_workload, task_shape
from tests.unit.sim.helpers import TRACES


@pytest.mark.parametrize(("gpus", "tasks", "node", "shape"), [
    (1, None, 8, (1, 1)),
    (8, None, 8, (1, 8)),
    (16, None, 8, (2, 8)),
    (12, None, 8, (2, 6)),
    (24, None, 8, (3, 8)),
    (7, None, 4, (7, 1)),
    (8, 4, 8, (4, 2)),
], ids=["one-gpu", "one-node", "two-nodes", "twelve-as-two-sixes", "three-nodes", "prime-on-small-nodes",
        "gang-size-from-trace"])
def test_jobs_become_as_few_equal_tasks_as_fit_on_a_node(gpus, tasks, node, shape):
    assert task_shape(gpus, tasks, node) == shape


@given(gpus=st.integers(1, 512), node=st.integers(1, 16))
def test_a_task_shape_always_covers_the_gpus_and_fits_a_node(gpus, node):
    tasks, per_task = task_shape(gpus, None, node)
    assert tasks * per_task == gpus
    assert 1 <= per_task <= node


@pytest.mark.parametrize(("text", "end", "seconds"), [
    ("3600", False, 3600.0),
    ("2017-10-01", False, 1506816000.0),
    ("2017-10-01", True, 1506816000.0 + 86400),
    ("2017-10-01 08:00:00", True, 1506816000.0 + 8 * 3600),
], ids=["seconds", "date", "date-as-end-includes-the-day", "date-time"])
def test_window_bounds_read_seconds_or_dates(text, end, seconds):
    assert parse_time(text, end_of_day=end) == seconds


def test_window_bounds_that_are_neither_say_so():
    with pytest.raises(ValueError, match="neither seconds nor a date"):
        parse_time("next week")


@pytest.fixture(scope="module")
def philly():
    return read_trace(TRACES / "philly-small.csv"), load_sim_cluster(TRACES / "philly-vc-small.csv")


def test_jobs_of_vcs_without_capacity_are_counted_not_simulated(philly):
    trace, cluster = philly
    workload = prepare_workload(trace, cluster)
    assert workload.excluded_vcs == {"vc-gone": 1}
    assert len(workload.jobs) == 6
    assert [job.index for job in workload.jobs] == list(range(6))


def test_a_window_keeps_the_jobs_submitted_in_it(philly):
    trace, cluster = philly
    workload = prepare_workload(trace, cluster, start=parse_time("2017-10-02"),
                                end=parse_time("2017-10-02", end_of_day=True))
    assert [job.job_id for job in workload.jobs] == ["philly-2"]
    assert workload.outside_window == 6


def test_a_load_factor_brings_arrivals_closer_but_keeps_run_times(philly):
    trace, cluster = philly
    normal = prepare_workload(trace, cluster)
    doubled = prepare_workload(trace, cluster, load_factor=2.0)
    first = normal.jobs[0].submit
    for a, b in zip(normal.jobs, doubled.jobs, strict=True):
        assert b.submit - first == pytest.approx((a.submit - first) / 2)
        assert b.duration == a.duration


def test_sampling_is_seeded(philly):
    trace, cluster = philly
    picks = {seed: [job.job_id for job in prepare_workload(trace, cluster, sample=0.5, seed=seed).jobs]
             for seed in range(6)}
    assert picks[3] == [job.job_id for job in prepare_workload(trace, cluster, sample=0.5, seed=3).jobs]
    assert len({tuple(pick) for pick in picks.values()}) > 1
