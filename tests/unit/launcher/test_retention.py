"""Retention: which finished jobs' files go, and the record of it (services/launcher/core/retention.py)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from libs.common.messages import JobState
from services.launcher.core import LogsPruned
from services.launcher.core.retention import due_for_pruning, task_keys
from tests.unit.launcher.builders import JOB, Driver, job_spec, role

DAY = 86400.0


def finished_driver(**spec) -> Driver:
    driver = Driver(job_spec(role("worker", 2), **spec))
    driver.start()
    driver.finish("worker", 0, 0)
    driver.finish("worker", 1, 0)
    assert driver.state == JobState.SUCCEEDED
    return driver


def running_driver() -> Driver:
    driver = Driver(job_spec(role("worker", 2)))
    driver.start()
    return driver


CASES = [
    # id, driver, seconds since it finished (None: still running), retention, already pruned, due
    ("finished long ago", finished_driver, 8 * DAY, 7 * DAY, False, True),
    ("finished just now", finished_driver, 60.0, 7 * DAY, False, False),
    ("exactly at the age", finished_driver, 7 * DAY, 7 * DAY, False, True),
    ("keep forever", finished_driver, 365 * DAY, 0.0, False, False),
    ("already pruned", finished_driver, 8 * DAY, 7 * DAY, True, False),
    ("running for weeks", running_driver, None, 7 * DAY, False, False),
]


@pytest.mark.parametrize("make, age, retention, pruned, due", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_due_for_pruning(make, age, retention, pruned, due):
    driver = make()
    record = driver.record
    if pruned:
        record = replace(record, logsPrunedAt=record.completedTime)
    now = (record.completedTime if age is not None else driver.clock()) + (age if age is not None else 30 * DAY)
    assert [r.job for r in due_for_pruning([record], now=now, retention_seconds=retention)] == ([JOB] if due else [])


def test_task_keys_name_every_task_attempt_of_every_attempt():
    driver = Driver(job_spec(role("worker", 2, task_retry_count=1), job_retry_count=1, gang=False))
    driver.start()
    driver.fail("worker", 0)  # task 0 retried alone: task attempt 1
    driver.running(driver.key("worker", 0))
    driver.fail("worker", 0)  # out of task retries: the attempt fails, the job retries
    driver.confirm_kills(driver.log)
    driver.place()
    driver.running()
    keys = {(k.attempt, k.index, k.taskAttempt) for k in task_keys(driver.record)}
    # Attempt 1 is compacted: its task attempts come from the briefs and the kept failed task.
    assert keys == {(1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0), (2, 1, 0)}


def test_logs_pruned_is_recorded_once_and_only_for_finished_jobs():
    driver = finished_driver()
    [save] = driver.handle(LogsPruned(job=JOB, at=5000.0))
    assert save.record.logsPrunedAt == 5000.0 and save.record.state == JobState.SUCCEEDED
    assert driver.handle(LogsPruned(job=JOB, at=6000.0)) == []
    assert driver.record.logsPrunedAt == 5000.0

    running = running_driver()
    assert running.handle(LogsPruned(job=JOB, at=5000.0)) == []
    assert running.record.logsPrunedAt is None
