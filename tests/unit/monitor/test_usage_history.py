"""A job's utilisation over time: the downsampled per-task history, the series the
API answers, the job's total and the idle-GPU flag (libs/common/usage_history.py),
and the agent's reading of one task sample (services/monitor/usage.py)."""

from __future__ import annotations

import pytest

from libs.common.usage_history import (
    Point,
    add,
    columns,
    decode_history,
    encode_history,
    gpu_idle,
    history_key,
    job_prefix,
    job_total,
    new_history,
    rebucket,
)
from services.monitor.core.samples import TaskGpuUsage, TaskUsage
from services.monitor.core.tasks import identify
from services.monitor.usage import point_of


def p(t: float, cpu: float = 10.0, mem: float = 100.0, gpu: float | None = None, gpus: int = 0) -> Point:
    return Point(t=t, n=1, cpu=cpu, mem=mem, gpu=gpu, gpuMem=None if gpu is None else 50.0, gpus=gpus)


def test_samples_within_one_step_merge_into_their_mean():
    h = new_history("alice~train", "worker", "0", 5.0)
    for t, cpu in ((100.0, 10.0), (101.0, 20.0), (104.9, 30.0), (105.0, 50.0)):
        h = add(h, p(t, cpu=cpu), node="n1")
    assert [(x.t, x.n, x.cpu) for x in h.points] == [(100.0, 3, 20.0), (105.0, 1, 50.0)]
    assert h.node == "n1"


def test_a_long_task_stays_within_the_cap_and_still_covers_its_whole_life():
    h = new_history("alice~train", "worker", "0", 1.0)
    for t in range(10_000):  # 10,000 one-second samples into 100 points
        h = add(h, p(float(t), cpu=float(t % 2) * 100), node="n1", cap=100)
    assert len(h.points) <= 100
    assert h.points[0].t == 0.0 and h.points[-1].t + h.step > 9_999
    assert h.step == 128.0  # doubled from 1 s until 10,000 s fit in 100 points
    assert sum(x.n for x in h.points) == 10_000  # no sample lost, only merged
    assert all(x.cpu == pytest.approx(50.0) for x in h.points[:-1])  # means survive the merges


def test_a_sample_from_before_the_last_point_is_dropped():
    h = add(add(new_history("a~b", "r", "0", 5.0), p(100.0), node="n"), p(110.0), node="n")
    assert add(h, p(90.0), node="n") is h


def test_history_round_trips_through_its_stored_form():
    h = add(new_history("a~b", "r", "0", 5.0), p(100.0, gpu=30.0, gpus=2), node="n")
    assert decode_history(encode_history(h)) == h


def test_keys_file_every_task_of_a_job_under_the_job():
    assert history_key("alice~train", "worker", "3") == "alice.train.worker.3"
    assert history_key("alice~train", "worker", "3").startswith(job_prefix("alice~train"))
    assert history_key("alice~train", "we.ird role", "0") == "alice.train.we_ird_role.0"
    with pytest.raises(ValueError):
        history_key("no-tilde", "worker", "0")


def test_columns_leave_out_gpu_series_without_readings():
    cpu_only = columns([p(0.0), p(5.0)])
    assert cpu_only == {"t": [0.0, 5.0], "cpuPercent": [10.0, 10.0], "memoryBytes": [100, 100]}
    with_gpu = columns([p(0.0, gpu=None), p(5.0, gpu=80.0, gpus=1)])
    assert with_gpu["gpuPercent"] == [None, 80.0]
    assert with_gpu["gpuMemoryPercent"] == [None, 50.0]


def test_job_total_sums_cpu_and_memory_and_weights_gpu_by_gpus_held():
    a = [p(0.0, cpu=10, mem=100, gpu=90.0, gpus=3), p(5.0, cpu=10, mem=100, gpu=90.0, gpus=3)]
    b = [p(0.0, cpu=30, mem=300, gpu=10.0, gpus=1), p(7.0, cpu=50, mem=500, gpu=10.0, gpus=1)]
    total = job_total([a, b], 10.0)
    assert len(total) == 1
    t = total[0]
    assert t.cpu == pytest.approx(10 + 40)  # a's mean plus b's mean over the step
    assert t.mem == pytest.approx(100 + 400)
    assert t.gpu == pytest.approx((90 * 3 + 10 * 1) / 4)
    assert t.gpus == 4


def test_rebucket_never_reorders():
    pts = rebucket([p(float(t)) for t in range(0, 60, 5)], 20.0)
    assert [x.t for x in pts] == [0.0, 20.0, 40.0]
    assert [x.n for x in pts] == [4, 4, 4]


def _steady(gpu: float | None, *, start: float, end: float, gpus: int = 2) -> list[Point]:
    return [p(float(t), gpu=gpu, gpus=gpus) for t in range(int(start), int(end), 10)]


def test_a_running_job_holding_gpus_idle_for_the_window_is_flagged():
    total = _steady(80.0, start=0, end=400) + _steady(1.0, start=400, end=1200)
    verdict = gpu_idle(total, now=1200, running=True, window_seconds=600, threshold=5)
    assert verdict.idle
    assert verdict.gpus == 2 and verdict.meanGpuPercent == pytest.approx(1.0)
    assert "2 GPU(s) under 5%" in verdict.reason


@pytest.mark.parametrize(("total", "running", "why"), [
    (_steady(80.0, start=0, end=1200), True, "busy"),  # busy
    (_steady(1.0, start=0, end=900) + [p(900.0, gpu=50.0, gpus=2)] + _steady(1.0, start=910, end=1200),
     True, "busy"),  # one busy point in the window
    (_steady(1.0, start=900, end=1200), True, "less than"),  # sampled for 5 minutes only
    (_steady(None, start=0, end=1200, gpus=0), True, "no GPU"),  # a CPU job
    (_steady(1.0, start=0, end=1200), False, "not running"),
    ([], True, "no samples"),
])
def test_not_flagged(total, running, why):
    verdict = gpu_idle(total, now=1200, running=running, window_seconds=600, threshold=5)
    assert not verdict.idle
    assert why in verdict.reason


def _usage(gpus: list[TaskGpuUsage], count: int) -> TaskUsage:
    return TaskUsage(key="k", jobName="a~b", roleName="r", taskIndex="0", cpuPercent=12.5, memoryBytes=1 << 20,
                     gpus=gpus, gpuCount=count)


def test_a_placed_gpu_no_process_opened_counts_as_idle():
    point = point_of(_usage([TaskGpuUsage(minorNumber="0", gpuPercent=90.0, gpuMemPercent=40.0)], 2), 100.0,
                     node_reads_gpus=True)
    assert (point.gpu, point.gpuMem, point.gpus) == (45.0, 20.0, 2)
    unopened = point_of(_usage([], 1), 100.0, node_reads_gpus=True)
    assert (unopened.gpu, unopened.gpus) == (0.0, 1)


def test_no_gpu_readings_on_the_node_is_unknown_not_idle():
    point = point_of(_usage([], 4), 100.0, node_reads_gpus=False)
    assert point.gpu is None and point.gpus == 0
    assert (point.cpu, point.mem) == (12.5, float(1 << 20))


def test_the_placed_gpu_count_is_read_from_the_task_environment():
    env = {"PAI_TASK_KEY": "slug", "PAI_JOB_NAME": "a~b", "PAI_GPU_COUNT": "2"}
    identity = identify(env)
    assert identity is not None and identity.gpu_count == 2
