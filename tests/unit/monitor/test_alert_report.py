"""The usage report: GPU-hours per VC and per user, top jobs, idle GPUs, from job records."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.common.messages import JobState
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from services.monitor.alerts.compose import compose_report
from services.monitor.alerts.core import NodeReading
from services.monitor.alerts.report import build_report, weekly_report_due

HOUR = 3600.0
START, END = 1_700_000_000.0, 1_700_000_000.0 + 7 * 24 * HOUR


def record(job: str, vc: str, gpus_per_instance: int, instances: int, attempts: list[tuple[float, float | None]],
           state: JobState = JobState.SUCCEEDED, tasks: list[TaskRecord] | None = None) -> JobRecord:
    user, name = job.split("~")
    spec = JobSpec(name=name, user=user, virtualCluster=vc,
                   taskRoles=[TaskRole(name="main", instances=instances, resources=Resources(gpu=gpus_per_instance))])
    return JobRecord(job=job, name=name, user=user, vc=vc, spec=spec, state=state, attempts=[
        AttemptRecord(attempt=i + 1, launchedTime=begin, completedTime=end, tasks=tasks or [])
        for i, (begin, end) in enumerate(attempts)])


def test_gpu_hours_count_only_running_time_inside_the_period():
    records = [
        # 2 x 4 GPUs for 10 h: 80 GPU-hours
        record("alice~big", "vc1", 4, 2, [(START + HOUR, START + 11 * HOUR)]),
        # started 2 h before the period, 1 GPU for 3 h: 1 GPU-hour inside
        record("bob~early", "vc2", 1, 1, [(START - 2 * HOUR, START + HOUR)]),
        # a failed attempt (1 h) and its retry (2 h) on 2 GPUs: 6 GPU-hours
        record("alice~retried", "vc1", 2, 1, [(START, START + HOUR), (START + 2 * HOUR, START + 4 * HOUR)]),
        # still running, 1 GPU, from 5 h before the end: 5 GPU-hours
        record("carol~now", "vc2", 1, 1, [(END - 5 * HOUR, None)], state=JobState.RUNNING),
        # never ran, or no GPUs: nothing
        record("dave~queued", "vc1", 8, 1, [(None, None)], state=JobState.WAITING),
        record("erin~cpu", "vc1", 0, 4, [(START, START + 5 * HOUR)]),
    ]
    report = build_report(records, [], start=START, end=END)
    assert report["gpuHoursByVc"] == {"vc1": 86.0, "vc2": 6.0}
    assert report["gpuHoursByUser"] == {"alice": 86.0, "carol": 5.0, "bob": 1.0}
    assert [(j["job"], j["gpuHours"]) for j in report["topJobs"]] == [
        ("alice~big", 80.0), ("alice~retried", 6.0), ("carol~now", 5.0), ("bob~early", 1.0)]
    assert report["gpuHours"] == 92.0


def test_idle_gpus_say_whether_a_running_job_holds_them():
    running = record("alice~idle", "vc1", 1, 1, [(START, None)], state=JobState.RUNNING,
                     tasks=[TaskRecord(role="main", index=0, node="n1", gpus=[1])])
    readings = [NodeReading(node="n1", at=END, gpuUtilization={0: 1.0, 1: 0.0, 2: 97.0})]
    report = build_report([running], readings, start=START, end=END)
    assert report["gpus"] == 3
    assert [(g["node"], g["gpu"], g["heldByRunningJob"]) for g in report["idleGpus"]] == [
        ("n1", 0, False), ("n1", 1, True)]


def test_the_report_mail_has_both_bodies():
    report = build_report([record("alice~big", "vc1", 4, 2, [(START, START + HOUR)])], [], start=START, end=END)
    message = compose_report(report, sender="pai@example.com", to=["ops@example.com"], now=END)
    assert message["Subject"] == "[PAI] usage report 2023-11-14 to 2023-11-21"
    text = message.get_body(("plain",)).get_content()
    assert "vc1: 8.0" in text and "alice~big (vc1, 8 GPUs, SUCCEEDED): 8.0" in text
    assert "<td>alice~big</td>" in message.get_body(("html",)).get_content()


@pytest.mark.parametrize(
    ("when", "weekday", "due"),
    [
        pytest.param("2026-11-23T08:00:00", 0, "2026-W48", id="monday-8am"),
        pytest.param("2026-11-23T23:59:00", 0, "2026-W48", id="monday-late"),
        pytest.param("2026-11-23T07:59:00", 0, None, id="monday-too-early"),
        pytest.param("2026-11-24T09:00:00", 0, None, id="tuesday"),
        pytest.param("2026-11-29T10:00:00", 6, "2026-W48", id="sunday-configured"),
        pytest.param("2026-11-23T09:00:00", -1, None, id="off"),
        pytest.param("2027-01-04T09:00:00", 0, "2027-W01", id="iso-week-of-the-new-year"),
    ],
)
def test_the_weekly_report_is_due_once_a_week_from_8_utc(when, weekday, due):
    at = datetime.fromisoformat(when).replace(tzinfo=UTC).timestamp()
    assert weekly_report_due(at, weekday) == due
