"""The portal's summaries (services/rest/portal_routes.py): pure parts, table-driven."""

from __future__ import annotations

import pytest

from libs.common.messages import JobState
from services.rest.jobs_api import JobRow
from services.rest.portal_routes import jobs_by_state, queue_order, vc_cells

GPU_SKUS = {"v100": {"gpu": 1, "cpu": 4, "memory": 16384}, "cpu": {"gpu": 0, "cpu": 1, "memory": 1024}}


@pytest.mark.parametrize(
    ("sku", "expected"),
    [
        pytest.param({"sku": "v100", "guaranteed": 8, "used": 3, "opportunistic": 2, "total": 32},
                     {"free": 5, "gpusUsed": 5, "gpusFree": 5, "gpusPerCell": 1}, id="gpu-sku-within-quota"),
        pytest.param({"sku": "v100", "guaranteed": 2, "used": 2, "opportunistic": 4, "total": 32},
                     {"free": 0, "gpusUsed": 6, "gpusFree": 0}, id="quota-full-opportunistic-beyond"),
        pytest.param({"sku": "cpu", "guaranteed": 16, "used": 4, "opportunistic": 0, "total": 24},
                     {"free": 12, "gpusUsed": 0, "gpusFree": 0, "gpusPerCell": 0}, id="cpu-sku-counts-cells-not-gpus"),
        pytest.param({"sku": "unknown", "guaranteed": 1, "used": 0, "opportunistic": 0, "total": 1},
                     {"free": 1, "gpusPerCell": 0}, id="sku-missing-from-sku-types"),
    ],
)
def test_vc_cells(sku, expected):
    [row] = vc_cells({"name": "vc", "skus": [sku]}, GPU_SKUS)
    assert {k: row[k] for k in expected} == expected


def test_jobs_by_state_lists_every_state_in_lifecycle_order_with_zeros():
    counts = jobs_by_state([JobState.RUNNING, JobState.FAILED, JobState.RUNNING])
    assert list(counts) == [s.value for s in JobState]
    assert counts["RUNNING"] == 2 and counts["FAILED"] == 1 and counts["WAITING"] == 0


def _row(job: str, priority: int, created: int) -> JobRow:
    return JobRow(debugId=job, name=job.split("~")[1], username=job.split("~")[0], state=JobState.WAITING,
                  subState="WAITING", executionType="START", retries=0, totalTaskNumber=1, totalGpuNumber=1,
                  createdTime=created, completedTime=None, appExitCode=None, virtualCluster="vc",
                  priority=priority, waitingReason="waiting")


@pytest.mark.parametrize(
    ("rows", "order"),
    [
        pytest.param([("a~late", 10, 2), ("a~early", 10, 1)], ["a~early", "a~late"], id="first-come-first"),
        pytest.param([("a~test", 10, 1), ("a~prod", 100, 5)], ["a~prod", "a~test"], id="higher-priority-first"),
        pytest.param([("a~oppo", -1, 1), ("a~test", 10, 9)], ["a~test", "a~oppo"], id="opportunistic-last"),
        pytest.param([("b~same", 10, 1), ("a~same", 10, 1)], ["a~same", "b~same"], id="ties-by-job-id"),
    ],
)
def test_queue_order(rows, order):
    assert [r.debugId for r in queue_order([_row(*r) for r in rows])] == order
