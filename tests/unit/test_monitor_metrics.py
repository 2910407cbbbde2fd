"""Core updates and node samples as they appear in the Prometheus registry the
monitor serves on /metrics. Labels are unique to this module so other tests
sharing the process registry do not interfere."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY

from services.monitor import metrics
from services.monitor.core import (
    EventCounted,
    GpuSample,
    JobsGauge,
    NodeCount,
    NodeSample,
    NodeUp,
    SubmitToRunning,
    TaskExitCounted,
)
from services.monitor.core.nodes import NodeConditionCounts

TAG = uuid.uuid4().hex[:8]
VC = f"vc{TAG}"


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_updates_set_the_job_gauge_histogram_and_counters():
    metrics.apply(
        [
            JobsGauge(vc=VC, state="RUNNING", count=3),
            JobsGauge(vc=VC, state="RUNNING", count=2),
            SubmitToRunning(vc=VC, seconds=0.004),
            SubmitToRunning(vc=VC, seconds=42.0),
            EventCounted(kind=f"test.{TAG}"),
            EventCounted(kind=f"test.{TAG}"),
            TaskExitCounted(vc=VC, outcome="success"),
            NodeUp(node=f"n{TAG}", up=False),
            NodeCount(count=7),  # the event tally's count: pai_node_count comes from node health
            NodeConditionCounts(counts={("true", "false", "false", "true"): 7, ("false", "false", "false", "false"): 0}),
        ]
    )
    assert value("pai_jobs", state="RUNNING", vc=VC) == 2
    assert value("pai_job_submit_to_running_seconds_count", vc=VC) == 2
    assert value("pai_job_submit_to_running_seconds_bucket", vc=VC, le="0.005") == 1
    assert value("pai_job_submit_to_running_seconds_bucket", vc=VC, le="45.0") == 2
    assert value("pai_events_total", kind=f"test.{TAG}") == 2
    assert value("pai_task_exits_total", vc=VC, outcome="success") == 1
    assert value("pai_node_up", node=f"n{TAG}") == 0
    assert value("pai_node_count", ready="true", disk_pressure="false", memory_pressure="false", unschedulable="true") == 7
    assert value("pai_node_count", ready="false", disk_pressure="false", memory_pressure="false", unschedulable="false") == 0


@pytest.mark.parametrize(
    "low, high",
    [pytest.param(0.005, 0.01, id="5-ms"), pytest.param(1.0, 2.0, id="1-s"), pytest.param(45.0, 60.0, id="60-s")],
)
def test_submit_to_running_buckets_separate_close_latencies(low, high):
    """Between 5 ms and 60 s, a latency and its double fall in different buckets."""
    buckets = metrics.SUBMIT_TO_RUNNING_BUCKETS
    assert any(low <= bound < high for bound in buckets)
    assert buckets[0] <= 0.005 and 60.0 in buckets


def sample(gpus: list[GpuSample]) -> NodeSample:
    return NodeSample(node="n", at=1.0, cpuPercent=25.0, memoryUsedBytes=100, memoryTotalBytes=400, gpus=gpus)


def test_a_node_sample_sets_node_and_gpu_gauges_and_a_vanished_gpu_loses_its_series():
    a = GpuSample(index=0, uuid=f"GPU-a-{TAG}", minorNumber=0, utilizationGpuPercent=90.0, memoryTotalBytes=16)
    b = GpuSample(index=1, uuid=f"GPU-b-{TAG}", minorNumber=1, utilizationGpuPercent=10.0, memoryTotalBytes=16)
    metrics.record_node_sample(sample([a, b]))
    assert value("pai_node_cpu_percent") == 25.0
    assert value("pai_node_memory_total_bytes") == 400
    assert value("nvidiasmi_attached_gpus") == 2
    assert value("nvidiasmi_utilization_gpu", minor_number="1", uuid=f"GPU-b-{TAG}") == 10.0

    metrics.record_node_sample(sample([a]))
    assert value("nvidiasmi_attached_gpus") == 1
    assert value("nvidiasmi_utilization_gpu", minor_number="0", uuid=f"GPU-a-{TAG}") == 90.0
    assert value("nvidiasmi_utilization_gpu", minor_number="1", uuid=f"GPU-b-{TAG}") is None
    assert value("nvidiasmi_memory_total_bytes", minor_number="1", uuid=f"GPU-b-{TAG}") is None
