"""A dozen jobs whose queueing delays under every policy were worked out by hand.

Cluster (hand-vcs.csv, 4 GPUs a node): VC a owns one node, VC b owns one node.
Trace (hand-12.csv), times in seconds:

    job  submit  run  GPUs  VC  | hived (class)  private  fifo-quota  sjf
    a1      0    100    4   a   |   0  (g)          0        0          0
    a2     10     50    2   a   |   0  (o)         90        0         95
    a3     20     10    2   a   |   0  (o)         80        0         80
    a4     30     30    4   a   |  30  (o) *       120       30        125
    a5     40      5    1   a   |   0  (o)         70       60         60
    b1     70    100    4   b   |   0  (g)          0       20          0
    b2     80     20  2x4   b   |  90  (o)        never    110       never
    b3    300    100    4   b   |   0  (g)          0        0          0
    b4    310     50    4   b   |   0  (o) *        90        0        120
    b5    320     10    4   b   |  30  (o)        130       50         80
    b6    330     20    2   b   |  30  (o)        130       50         80
    a6    340     10    4   a   |   0  (g)          0       20          0

hived: a job is guaranteed (g) while its VC's guaranteed GPUs stay within quota, else
opportunistic (o) on idle cells anywhere. a2, a3, a5 run at once on VC b's idle node.
a4 waits for a2 to leave that node (60), then b1 (guaranteed, t=70) preempts it (*);
it restarts at 100 on the node a1 frees and ends at 130. b2 (two whole nodes) gets
them at 170. At 310 b4 borrows VC a's idle node; a6 (guaranteed, 340) preempts it (*)
and it queues again at the back, behind b5 and b6, which arrived while it ran: when a6
ends (350) b5 starts, then b6 at 360, and b4 restarts at 380 and ends at 430.

private: each VC alone on its node, FIFO with backfill. a1 runs to 100; then a2+a3
fill the node, a5 backfills at 110 (a4 needs all 4), a4 starts at 150. b2 needs 8
GPUs and VC b has 4: it never starts. b4 at 400, b5 at 450, b6 at 460.

fifo-quota: shared nodes, FIFO per VC (the head blocks), VCs below quota first,
borrowing without preemption. a4 takes VC b's node at 60, so b1 waits until 90
(a sharing anomaly: 20 s more than alone); a5 waits behind a4's head of line;
b2 gets both nodes at 190; a6 waits for b4 to end (360).

sjf: each VC alone, shortest first with backfill. At 100: a5 (5 s) and a3 (10 s)
start, a4 (30 s) does not fit, a2 backfills at 105, a4 at 155. At 400: b5, then b6
at 410, b4 at 430.

helios-fifo (HeliosArtifact's method): each VC alone, FIFO, and the head of the queue
stops everyone behind it. At 100 a2 and a3 start, a4 (4 GPUs) does not fit and a5 may
not pass it: a4 starts at 150, a5 only at 180 (private let it backfill at 110). b2
needs two whole nodes and VC b has one: never. b4 at 400, b5 at 450, b6 at 460.

helios-sjf: each VC alone, shortest first, and the head stops the rest. At 100 a5 (5 s)
and a3 (10 s) start, then a4 (30 s) is the head and does not fit: a2 (50 s) may not
backfill at 105 as it does under sjf. a4 starts at 110, when a3 leaves, and a2 at 140.
In VC b: b5 at 400, b6 at 410, b4 at 430.
"""

from __future__ import annotations

import pytest

from services.scheduler.sim.metrics import sharing_anomaly
from services.scheduler.sim.runner import POLICIES, SimOptions, simulate_files
from tests.unit.sim.helpers import TRACES

NEVER = None
JOBS = ["a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3", "b4", "b5", "b6", "a6"]
EXPECTED_DELAYS = {
    "hived":      [0, 0, 0, 30, 0, 0, 90, 0, 0, 30, 30, 0],
    "private":    [0, 90, 80, 120, 70, 0, NEVER, 0, 90, 130, 130, 0],
    "fifo-quota": [0, 0, 0, 30, 60, 20, 110, 0, 0, 50, 50, 20],
    "sjf":        [0, 95, 80, 125, 60, 0, NEVER, 0, 120, 80, 80, 0],
    "helios-fifo": [0, 90, 80, 120, 140, 0, NEVER, 0, 90, 130, 130, 0],
    "helios-sjf": [0, 130, 80, 80, 60, 0, NEVER, 0, 120, 80, 80, 0],
}


@pytest.fixture(scope="module")
def result():
    options = SimOptions(policies=POLICIES, gpus_per_node=4)
    return simulate_files(TRACES / "hand-12.csv", TRACES / "hand-vcs.csv", options)


def _delays(result, policy: str) -> dict[str, float | None]:
    run = result.runs[policy]
    return {job.job_id: None if outcome.first_start is None else outcome.first_start - job.submit
            for job, outcome in zip(result.workload.jobs, run.outcomes, strict=True)}


@pytest.mark.parametrize("policy", list(EXPECTED_DELAYS), ids=list(EXPECTED_DELAYS))
def test_queueing_delays_match_the_hand_worked_table(result, policy):
    assert _delays(result, policy) == dict(zip(JOBS, EXPECTED_DELAYS[policy], strict=True))


@pytest.mark.parametrize("policy", list(EXPECTED_DELAYS), ids=list(EXPECTED_DELAYS))
def test_report_averages_the_delays_of_started_jobs(result, policy):
    started = [delay for delay in EXPECTED_DELAYS[policy] if delay is not None]
    overall = result.report["policies"][policy]["overall"]
    assert overall["queueing_delay_s"]["avg"] == round(sum(started) / len(started), 1)
    assert overall["never_started"] == EXPECTED_DELAYS[policy].count(NEVER)


def test_hived_preempted_jobs_restart_from_scratch(result):
    jobs = {job.job_id: job.index for job in result.workload.jobs}
    outcomes = result.runs["hived"].outcomes
    # a4: started 60, preempted at 70 (10 s x 4 GPUs lost), ran 30 s again from 100.
    assert (outcomes[jobs["a4"]].preemptions, outcomes[jobs["a4"]].finish) == (1, 130)
    assert outcomes[jobs["a4"]].lost_gpu_seconds == 40
    # b4: started 310, preempted at 340 (30 s x 4 GPUs lost), ran 50 s again from 380 (behind b5, b6).
    assert (outcomes[jobs["b4"]].preemptions, outcomes[jobs["b4"]].finish) == (1, 430)
    overall = result.report["policies"]["hived"]["overall"]
    assert overall["preemptions"] == 2
    assert overall["lost_gpu_hours"] == round(160 / 3600, 1)
    # Completion times: 100 50 10 100 5 100 110 100 120 40 50 10; p99 of 12 jobs is the largest.
    assert overall["jct_s"] == {"avg": round(795 / 12, 1), "p99": 120.0}


def test_hived_submits_within_quota_as_guaranteed_and_the_rest_as_opportunistic(result):
    run = result.runs["hived"]
    classes = {job.job_id: outcome.job_class for job, outcome in zip(result.workload.jobs, run.outcomes, strict=True)}
    assert sorted(job for job, kind in classes.items() if kind == "guaranteed") == ["a1", "a6", "b1", "b3"]


def test_private_explains_the_job_that_never_starts(result):
    never = result.report["policies"]["private"]["never_started"]
    assert never["count"] == 1
    assert never["examples"][0]["job"] == "b2"
    assert "needs 8" in never["examples"][0]["reason"] and "VC b" in never["examples"][0]["reason"]


def test_hived_shows_no_sharing_anomaly(result):
    anomaly = result.report["sharing_anomaly"]["hived"]
    assert anomaly["vcs_with_anomaly"] == []
    assert anomaly["vcs"]["a"]["guaranteed_jobs"] == 2  # a1 and a6
    # All of VC a's jobs wait less shared (0+0+0+30+0+0)/6 than alone (0+90+80+120+70+0)/6.
    assert anomaly["vcs"]["a"]["avg_delay_all_jobs_shared_s"] == 5.0
    assert anomaly["vcs"]["a"]["avg_delay_all_jobs_private_s"] == 60.0


def test_quota_fifo_without_cells_shows_the_sharing_anomaly(result):
    """b1 and a6 are within quota but wait for jobs that borrowed their VC's GPUs."""
    found = result.report["sharing_anomaly"]["fifo-quota"]
    assert found == sharing_anomaly(result.workload.jobs, result.runs["fifo-quota"], result.runs["private"])
    assert found["vcs_with_anomaly"] == ["a", "b"]
    assert found["vcs"]["b"]["avg_delay_shared_s"] > found["vcs"]["b"]["avg_delay_private_s"]


@pytest.mark.parametrize("policy", list(EXPECTED_DELAYS), ids=list(EXPECTED_DELAYS))
def test_no_policy_allocates_more_gpus_than_the_cluster_has(result, policy):
    series = result.report["policies"][policy]["allocation_series"]
    assert max(series["overall"]) <= 1.0
    assert result.report["policies"][policy]["overall"]["gpu_allocation"] <= 1.0
