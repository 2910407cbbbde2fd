"""A task whose node was lost is never retried on that node: instead of a task
retry in place, the attempt ends and the job goes back to the scheduler."""

from __future__ import annotations

import pytest

from libs.common import exitspecs as exits, messages
from libs.common.messages import JobState, Reaction
from services.launcher.core.policy import TaskRetry, task_retry
from tests.unit.launcher.builders import Driver, job_spec, killed, published, role, started, states_published

R = Reaction

TASK_RETRY_CHOICES = [
    # id, reaction, gang, retries, taskRetryCount, node lost, choice
    ("failure-in-place", R.RETRY_TO_MAX, False, 0, 2, False, TaskRetry.IN_PLACE),
    ("node-lost-new-placement", R.ALWAYS_RETRY, False, 0, 2, True, TaskRetry.NEW_PLACEMENT),
    ("node-lost-task-budget-spent", R.ALWAYS_RETRY, False, 2, 2, True, TaskRetry.NONE),
    ("node-lost-no-task-retry", R.ALWAYS_RETRY, False, 0, 0, True, TaskRetry.NONE),
    ("node-lost-gang-uses-job-retry", R.ALWAYS_RETRY, True, 0, 2, True, TaskRetry.NONE),
    ("never-retry", R.NEVER_RETRY, False, 0, 2, True, TaskRetry.NONE),
]


@pytest.mark.parametrize(
    ("reaction", "gang", "retries", "task_retry_count", "node_lost", "choice"),
    [c[1:] for c in TASK_RETRY_CHOICES],
    ids=[c[0] for c in TASK_RETRY_CHOICES],
)
def test_task_retry_choice(reaction, gang, retries, task_retry_count, node_lost, choice):
    assert task_retry(reaction, gang_allocation=gang, retries=retries, task_retry_count=task_retry_count,
                      node_lost=node_lost) is choice


def lose_node_of(driver: Driver, role_name: str, index: int) -> list:
    """The launcher ends the task on a lost node (platform reason NodeLost); the
    runtime's PodNodeLost rule answers ALWAYS_RETRY."""
    return driver.finish(role_name, index, 143, platformReason=exits.NODE_LOST_PLATFORM_REASON) + driver.verdict(
        role_name, index, R.ALWAYS_RETRY, exits.NODE_LOST_EXIT_CODE
    )


def test_a_non_gang_task_on_a_lost_node_sends_the_job_back_to_the_scheduler_uncounted():
    driver = Driver(job_spec(role("worker", 2, task_retry_count=2), gang=False))
    driver.start()
    lost_key = driver.key("worker", 0)

    decided = lose_node_of(driver, "worker", 0)

    assert started(decided) == [], "no new task attempt on the lost node"
    assert killed(decided) == [driver.key("worker", 1)]
    after = driver.confirm_kills(decided)
    [released] = published(after, messages.JobReleased)
    assert (released.attempt, released.requeue) == (1, True), "the scheduler places the job again"
    assert states_published(after) == [JobState.WAITING]
    record = driver.record
    assert record.attempt == 2 and record.retries == 0, "a lost node does not count against jobRetryCount"
    first = record.attempts[0]
    assert first.ending is not None and "node" in first.ending.diagnostics[-1]
    assert first.task("worker", 0).retries == 0 and lost_key.taskAttempt == 0

    driver.place()
    driver.running()
    driver.finish("worker", 0, 0)
    driver.finish("worker", 1, 0)
    assert driver.state == JobState.SUCCEEDED


def test_an_ordinary_task_failure_is_still_retried_in_place():
    driver = Driver(job_spec(role("worker", 2, task_retry_count=2), gang=False))
    driver.start()
    node = driver.record.current.task("worker", 0).node
    actions = driver.fail("worker", 0, R.ALWAYS_RETRY)
    [launch] = [a.launch for a in actions if type(a).__name__ == "StartTask"]
    assert launch.placement.node == node and launch.key.taskAttempt == 1
    assert killed(actions) == [] and driver.record.attempt == 1
