"""Properties every policy keeps on any trace (hypothesis), and byte-identical reports."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from services.scheduler.sim.cluster import cluster_from_vc_capacities
from services.scheduler.sim.policies.base import GUARANTEED
from services.scheduler.sim.runner import POLICIES, SimOptions, make_policy, report_json, simulate_files
from services.scheduler.sim.simulator import simulate
from services.scheduler.sim.trace import Trace, TraceJob
from services.scheduler.sim.workload import prepare_workload
from tests.unit.sim.helpers import TRACES

CLUSTER = cluster_from_vc_capacities({"a": 2, "b": 1, "c": 1}, rack_nodes=4)  # 32 GPUs: a 16, b 8, c 8

jobs_strategy = st.lists(
    st.builds(
        dict,
        submit=st.integers(0, 2000),
        duration=st.integers(0, 900),
        gpus=st.sampled_from([1, 1, 1, 2, 4, 8, 16]),
        vc=st.sampled_from(["a", "b", "c"]),
        priority=st.sampled_from([None, None, None, -1, 10, 100]),
    ),
    min_size=1, max_size=30,
)


def _workload(rows: list[dict]):
    trace = Trace(source="generated", format="csv", jobs=[
        TraceJob(job_id=f"j{n}", submit_time=row["submit"], duration=row["duration"], num_gpus=row["gpus"],
                 vc=row["vc"], priority=row["priority"], line=n + 2) for n, row in enumerate(rows)])
    return prepare_workload(trace, CLUSTER)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=jobs_strategy)
def test_every_policy_runs_jobs_after_submission_within_capacity_and_to_the_end(rows):
    workload = _workload(rows)
    for name in POLICIES:
        policy = make_policy(name, CLUSTER, SimOptions())
        run = simulate(workload.jobs, policy, vcs=list(CLUSTER.vc_quota), interval=100.0)
        series = run.allocation
        span = max(run.end - run.origin, 1e-9)
        buckets = int(span // series.interval) + 1
        assert max(series.mean_gpus("", buckets)) <= CLUSTER.total_gpus + 1e-6, name
        for job, outcome in zip(workload.jobs, run.outcomes, strict=True):
            # Once the cluster drains nothing is left waiting, but a job that only its VC's
            # cells may serve and that is bigger than the VC's quota never starts.
            confined = name in ("private", "sjf", "helios-fifo", "helios-sjf") or (
                name == "hived" and outcome.job_class == GUARANTEED)
            if not confined or job.gpus <= CLUSTER.vc_quota[job.vc]:
                assert outcome.finish is not None, (name, job, outcome.never_reason)
            if outcome.first_start is not None:
                assert outcome.first_start >= job.submit
            if outcome.finish is not None:
                assert outcome.finish - outcome.first_start >= job.duration
            if name in ("fifo-quota", "sjf", "helios-fifo", "helios-sjf"):
                assert outcome.preemptions == 0
        if name in ("private", "sjf", "helios-fifo", "helios-sjf"):
            for vc, quota in CLUSTER.vc_quota.items():
                assert max(series.mean_gpus(vc, buckets)) <= quota + 1e-6, (name, vc)
        if name in ("hived", "private"):
            policy.core.validate_state()


def test_same_input_and_seed_give_byte_identical_json():
    options = SimOptions(policies=POLICIES, gpus_per_node=4, sample=0.75, seed=7, interval_s=60.0)
    reports = [report_json(simulate_files(TRACES / "hand-12.csv", TRACES / "hand-vcs.csv", options).report)
               for _ in range(2)]
    assert reports[0] == reports[1]
    other_seed = report_json(simulate_files(TRACES / "hand-12.csv", TRACES / "hand-vcs.csv",
                                            SimOptions(policies=POLICIES, gpus_per_node=4, sample=0.75, seed=8,
                                                       interval_s=60.0)).report)
    assert other_seed != reports[0]
