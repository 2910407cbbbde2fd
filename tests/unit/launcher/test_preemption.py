"""Preemption: the attempt ends, the job is queued again and keeps its retry budget."""

from __future__ import annotations

from libs.common import messages
from libs.common.exitspecs import PREEMPTED_EXIT_CODE
from libs.common.messages import JobState, Reaction, TaskState
from tests.unit.launcher.builders import Driver, job_spec, killed, published, role, states_published


def test_preempted_job_is_killed_released_with_requeue_and_waits_again() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.start()

    asked = driver.preempt(by="bob~urgent")

    assert sorted(k.index for k in killed(asked)) == [0, 1]
    assert all(a.reason == "preempted by bob~urgent" for a in asked if type(a).__name__ == "KillTask")
    assert driver.state == JobState.RUNNING  # until the tasks are gone
    assert published(asked, messages.JobReleased) == []

    done = driver.confirm_kills(asked)

    [released] = published(done, messages.JobReleased)
    assert (released.attempt, released.requeue, released.cause) == (1, True, "alice~train/1/worker/1/0/exited")
    assert states_published(done) == [JobState.WAITING]
    record = driver.record
    assert (record.state, record.attempt, record.retries) == (JobState.WAITING, 2, 0)
    first = record.attempts[0]
    assert first.endReason == "preempted by bob~urgent"
    assert first.preemptedBy == "bob~urgent" and not first.isRetryCounted
    assert first.exitSpec is not None and first.exitSpec.code == PREEMPTED_EXIT_CODE
    assert "bob~urgent" in first.exitSpec.reason
    # A small job's older attempt keeps every task in full (compaction is for big jobs).
    assert not first.compacted and {t.state for t in first.tasks} == {TaskState.STOPPED}


def test_preemptions_do_not_use_the_retry_budget() -> None:
    driver = Driver(job_spec(job_retry_count=1))
    driver.submit()
    for _ in range(3):
        driver.place()
        driver.running()
        driver.confirm_kills(driver.preempt())
    assert (driver.record.attempt, driver.record.retries) == (4, 0)

    driver.place()
    driver.running()
    driver.fail(reaction=Reaction.RETRY_TO_MAX)
    assert (driver.state, driver.record.retries) == (JobState.WAITING, 1)


def test_preempting_a_job_whose_gang_is_still_starting() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.submit()
    driver.place()
    driver.running(driver.key("worker", 0))
    assert driver.state == JobState.WAITING

    done = driver.confirm_kills(driver.preempt())

    assert states_published(done) == [JobState.WAITING]
    assert driver.record.attempt == 2
    [step] = driver.record.history[-1:]
    assert (step.from_, step.to) == (JobState.WAITING, JobState.WAITING)


def test_preemption_of_an_old_attempt_or_a_final_job_is_ignored() -> None:
    driver = Driver()
    driver.start()
    driver.confirm_kills(driver.preempt())
    assert driver.preempt(attempt=1) == []

    driver.place()
    driver.running()
    driver.finish(code=0)
    assert driver.state == JobState.SUCCEEDED
    assert driver.preempt() == []
