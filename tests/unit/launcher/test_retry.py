"""Retries: jobRetryCount with each exit-spec reaction, backoff, and taskRetryCount."""

from __future__ import annotations

import pytest

from libs.common import messages
from libs.common.messages import JobState, Reaction, TaskState
from tests.unit.launcher.builders import (
    Driver,
    job_spec,
    killed,
    published,
    role,
    started,
    states_published,
    timers,
)

R = Reaction
JOB_RETRY_CASES = [
    # id, reaction, jobRetryCount, failures in a row, state, attempt, counted retries
    ("never-retry-ignores-budget", R.NEVER_RETRY, 3, 1, JobState.FAILED, 1, 0),
    ("retry-to-max-without-budget-fails", R.RETRY_TO_MAX, 0, 1, JobState.FAILED, 1, 0),
    ("retry-to-max-uses-budget", R.RETRY_TO_MAX, 2, 1, JobState.WAITING, 2, 1),
    ("retry-to-max-until-budget-spent", R.RETRY_TO_MAX, 2, 2, JobState.WAITING, 3, 2),
    ("retry-to-max-fails-after-budget", R.RETRY_TO_MAX, 2, 3, JobState.FAILED, 3, 2),
    ("always-retry-not-counted", R.ALWAYS_RETRY, 0, 3, JobState.WAITING, 4, 0),
    ("always-backoff-retry-not-counted", R.ALWAYS_BACKOFF_RETRY, 0, 2, JobState.WAITING, 3, 0),
]


def fail_attempts(driver: Driver, reaction: Reaction, failures: int) -> None:
    for _ in range(failures):
        driver.clock.advance(3600)  # past any backoff
        driver.backoff_elapsed()
        driver.place()
        driver.running()
        driver.fail(reaction=reaction)


@pytest.mark.parametrize(
    ("reaction", "job_retry_count", "failures", "state", "attempt", "retries"),
    [c[1:] for c in JOB_RETRY_CASES],
    ids=[c[0] for c in JOB_RETRY_CASES],
)
def test_job_retry_follows_the_reaction_and_the_budget(reaction, job_retry_count, failures, state, attempt, retries):
    driver = Driver(job_spec(job_retry_count=job_retry_count))
    driver.submit()
    fail_attempts(driver, reaction, failures)

    record = driver.record
    assert (record.state, record.attempt, record.retries) == (state, attempt, retries)
    counted = [a.isRetryCounted for a in record.attempts if a.ended and a.attempt < record.attempt]
    assert counted == [reaction == R.RETRY_TO_MAX] * len(counted)
    if state == JobState.FAILED:
        assert record.appExitSpec is not None and record.appExitSpec.reaction == reaction


def test_a_retry_releases_the_cells_with_requeue_and_starts_a_new_waiting_attempt() -> None:
    driver = Driver(job_spec(role("worker", 2), job_retry_count=1))
    driver.start()

    decided = driver.fail("worker", 0)
    assert killed(decided) == [driver.key("worker", 1)]
    assert published(decided, messages.JobReleased) == []  # worker 1 still runs

    after = driver.confirm_kills(decided)

    [released] = published(after, messages.JobReleased)
    assert (released.id, released.attempt, released.requeue) == ("alice~train/1/released", 1, True)
    assert states_published(after) == [JobState.WAITING]
    [waiting] = published(after, messages.JobStateChanged)
    assert (waiting.id, waiting.attempt, waiting.previous) == ("alice~train/2/state/WAITING", 2, JobState.RUNNING)
    first = driver.record.attempts[0]
    assert first.state == JobState.FAILED and first.endReason.startswith("retry 1/1 after exit code 1")
    assert [t.state for t in driver.record.current.tasks] == [TaskState.WAITING, TaskState.WAITING]

    driver.place()
    driver.running()
    driver.finish("worker", 0, 0)
    driver.finish("worker", 1, 0)
    assert driver.state == JobState.SUCCEEDED
    assert driver.record.attempt == 2


def test_backoff_delays_grow_and_are_capped() -> None:
    driver = Driver(job_spec(), backoff_base_seconds=10.0, backoff_max_seconds=50.0)
    driver.submit()
    delays = []
    for _ in range(4):
        driver.clock.advance(1000)
        driver.backoff_elapsed()
        driver.place()
        driver.running()
        [timer] = timers(driver.fail(reaction=R.ALWAYS_BACKOFF_RETRY))
        delays.append(timer.at - driver.clock())
        assert timer.attempt == driver.record.attempt
    assert delays == [10.0, 20.0, 40.0, 50.0]
    assert driver.record.attempts[0].endReason.startswith("retry after 10s backoff")


def test_backoff_holds_a_placement_until_the_timer_fires() -> None:
    driver = Driver(job_spec())
    driver.start()
    driver.fail(reaction=R.ALWAYS_BACKOFF_RETRY)
    assert driver.record.current.backoffUntil == driver.clock() + 10.0

    early = driver.place()
    assert started(early) == []

    driver.clock.advance(10.0)
    fired = driver.backoff_elapsed()
    assert started(fired) == [driver.key()]
    assert driver.backoff_elapsed() == []


def test_placement_after_the_backoff_starts_at_once() -> None:
    driver = Driver(job_spec())
    driver.start()
    driver.fail(reaction=R.ALWAYS_BACKOFF_RETRY)
    driver.clock.advance(11.0)
    assert started(driver.place()) == [driver.key()]


TASK_RETRY_CASES = [
    # id, gang, taskRetryCount, reaction, failures, expected job state, task attempt, task retries
    ("alone-first-failure", False, 2, R.RETRY_TO_MAX, 1, JobState.RUNNING, 1, 1),
    ("alone-until-task-budget-spent", False, 2, R.RETRY_TO_MAX, 2, JobState.RUNNING, 2, 2),
    ("alone-then-job-rule", False, 2, R.RETRY_TO_MAX, 3, JobState.FAILED, 2, 2),
    ("alone-always-retry-still-counted", False, 1, R.ALWAYS_RETRY, 2, JobState.WAITING, 0, 0),
    ("alone-never-retry-fails-job", False, 2, R.NEVER_RETRY, 1, JobState.FAILED, 0, 0),
    ("gang-ignores-task-retry", True, 2, R.RETRY_TO_MAX, 1, JobState.FAILED, 0, 0),
]


@pytest.mark.parametrize(
    ("gang", "task_retry_count", "reaction", "failures", "state", "task_attempt", "task_retries"),
    [c[1:] for c in TASK_RETRY_CASES],
    ids=[c[0] for c in TASK_RETRY_CASES],
)
def test_task_retry_count_retries_a_task_alone_before_the_job_rule(
    gang, task_retry_count, reaction, failures, state, task_attempt, task_retries
):
    driver = Driver(job_spec(role("worker", 2, task_retry_count=task_retry_count), gang=gang))
    driver.start()
    for _ in range(failures):
        if driver.state != JobState.RUNNING:
            break
        driver.running(driver.key("worker", 0))
        driver.fail("worker", 0, reaction)
    driver.confirm_kills(driver.log)

    record = driver.record
    assert record.state == state
    task = record.current.task("worker", 0)
    assert (task.taskAttempt, task.retries) == (task_attempt, task_retries)


def test_a_task_retry_reuses_the_placement_and_ports_with_a_new_task_attempt() -> None:
    driver = Driver(job_spec(role("worker", 2, task_retry_count=1, ports={"http": 1}), gang=False))
    first_starts = started(driver.submit() + driver.place())
    driver.running()
    before = driver.record.current.task("worker", 0)

    actions = driver.fail("worker", 0)

    [launch] = [a.launch for a in actions if type(a).__name__ == "StartTask"]
    assert launch.key.taskAttempt == 1 and launch.key not in first_starts
    assert launch.placement.node == before.node and launch.ports == before.ports
    assert launch.env["PAI_TASK_ATTEMPT_ID"] == "1"
    assert killed(actions) == []  # worker 1 keeps running
    task = driver.record.current.task("worker", 0)
    assert [s.exitCode for s in task.taskAttempts] == [1]

    driver.running(driver.key("worker", 0))
    driver.finish("worker", 0, 0)
    driver.finish("worker", 1, 0)
    assert driver.state == JobState.SUCCEEDED


def test_a_failure_retried_without_counting_is_retried_at_most_the_platform_limit_then_fails_saying_why():
    """A task that SIGKILLs itself (ALWAYS_RETRY) is not retried forever: after
    MAX_PLATFORM_RETRIES uncounted retries, backing off past the first few, the
    job fails with the failure's own code and a reason naming the limit."""
    from services.launcher.core.policy import MAX_PLATFORM_RETRIES, PLATFORM_RETRIES_BEFORE_BACKOFF

    driver = Driver(job_spec(job_retry_count=0))
    driver.submit()
    fail_attempts(driver, R.ALWAYS_RETRY, MAX_PLATFORM_RETRIES)
    record = driver.record
    assert (record.state, record.attempt, record.platformRetries) == (
        JobState.WAITING, MAX_PLATFORM_RETRIES + 1, MAX_PLATFORM_RETRIES)
    # The first few come at once, the rest after a growing delay.
    assert record.backoffRetries == MAX_PLATFORM_RETRIES - PLATFORM_RETRIES_BEFORE_BACKOFF

    fail_attempts(driver, R.ALWAYS_RETRY, 1)
    record = driver.record
    assert record.state == JobState.FAILED and record.attempt == MAX_PLATFORM_RETRIES + 1
    assert record.appExitSpec is not None and record.appExitSpec.reaction == R.NEVER_RETRY
    assert f"retried this job {MAX_PLATFORM_RETRIES} times" in record.appExitSpec.reason


def test_preemptions_do_not_use_the_platform_retry_limit():
    from services.launcher.core.policy import MAX_PLATFORM_RETRIES

    driver = Driver(job_spec())
    driver.submit()
    for _ in range(MAX_PLATFORM_RETRIES + 2):
        driver.place()
        driver.running()
        driver.confirm_kills(driver.preempt())
    assert driver.record.state == JobState.WAITING and driver.record.platformRetries == 0
