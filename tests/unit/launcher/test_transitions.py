"""The job state machine: one explicit table; anything else raises with the history."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from libs.common.messages import JobState, Reaction, TaskState
from libs.common.records import AttemptEnding, EndOutcome
from services.launcher.core import IllegalTransition
from services.launcher.core.tasks import TaskFinished
from services.launcher.core.transitions import (
    ATTEMPT_TRANSITIONS,
    LEGAL_TRANSITIONS,
    TASK_TRANSITIONS,
    is_legal,
    move_attempt,
    move_task,
    transition,
)
from tests.unit.launcher.builders import Driver, job_spec, role

LEGAL = {
    (JobState.WAITING, JobState.RUNNING),
    (JobState.WAITING, JobState.WAITING),
    (JobState.WAITING, JobState.STOPPING),
    (JobState.WAITING, JobState.STOPPED),
    (JobState.WAITING, JobState.SUCCEEDED),
    (JobState.WAITING, JobState.FAILED),
    (JobState.RUNNING, JobState.WAITING),
    (JobState.RUNNING, JobState.STOPPING),
    (JobState.RUNNING, JobState.STOPPED),
    (JobState.RUNNING, JobState.SUCCEEDED),
    (JobState.RUNNING, JobState.FAILED),
    (JobState.STOPPING, JobState.STOPPED),
}
PAIRS = list(itertools.product(JobState, JobState))


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_transition_table(source: JobState, target: JobState) -> None:
    assert is_legal(source, target) == ((source, target) in LEGAL)


def test_final_states_have_no_way_out() -> None:
    assert all(not LEGAL_TRANSITIONS[s] for s in JobState if s.is_final)


def test_illegal_transition_raises_with_the_job_history() -> None:
    driver = Driver()
    driver.start()
    driver.finish(code=0)
    record = driver.record

    with pytest.raises(IllegalTransition) as raised:
        transition(record, JobState.RUNNING, at=5.0, why="a bug")

    error = raised.value
    assert (error.job, error.from_state, error.to_state) == (record.job, JobState.SUCCEEDED, JobState.RUNNING)
    assert [step.to for step in error.history] == [JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED]
    assert "WAITING -> RUNNING (all tasks started)" in str(error)
    assert "SUCCEEDED -> RUNNING (a bug)" in str(error)


def test_a_bug_in_the_core_raises_and_leaves_the_records_as_they_were() -> None:
    driver = Driver(job_spec(role("worker", 1)))
    driver.start()
    driver.stop()
    # Corrupt the stored record: STOPPING, but the decided end says "retry",
    # which would take the job STOPPING -> WAITING.
    record = driver.record
    ending = msgspec.structs.replace(record.current.ending, outcome=EndOutcome.RETRY)
    assert isinstance(ending, AttemptEnding)
    corrupt = msgspec.structs.replace(record, attempts=[msgspec.structs.replace(record.current, ending=ending)])
    driver.core.load(corrupt)

    with pytest.raises(IllegalTransition, match="STOPPING -> WAITING"):
        driver.core.handle(*[TaskFinished(key=k, exitCode=143) for k in driver.keys()])

    assert driver.core.job(record.job) == corrupt


# --- the attempt and task tables --------------------------------------------------------

ATTEMPT_LEGAL = {
    (JobState.WAITING, JobState.RUNNING),
    (JobState.WAITING, JobState.SUCCEEDED),
    (JobState.WAITING, JobState.FAILED),
    (JobState.WAITING, JobState.STOPPED),
    (JobState.RUNNING, JobState.SUCCEEDED),
    (JobState.RUNNING, JobState.FAILED),
    (JobState.RUNNING, JobState.STOPPED),
}
TASK_LEGAL = {
    (TaskState.WAITING, TaskState.RUNNING),
    (TaskState.WAITING, TaskState.SUCCEEDED),
    (TaskState.WAITING, TaskState.FAILED),
    (TaskState.WAITING, TaskState.STOPPED),
    (TaskState.RUNNING, TaskState.SUCCEEDED),
    (TaskState.RUNNING, TaskState.FAILED),
    (TaskState.RUNNING, TaskState.STOPPED),
    (TaskState.FAILED, TaskState.WAITING),
}
TASK_PAIRS = list(itertools.product(TaskState, TaskState))


def a_running_job():
    driver = Driver(job_spec(role("worker", 1)))
    driver.start()
    return driver.record


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_attempt_table(source: JobState, target: JobState) -> None:
    record = a_running_job()
    attempt = msgspec.structs.replace(record.current, state=source)
    if (source, target) in ATTEMPT_LEGAL:
        assert move_attempt(record, attempt, target, why="test").state == target
        return
    with pytest.raises(IllegalTransition) as raised:
        move_attempt(record, attempt, target, why="a bug")
    error = raised.value
    assert (error.from_state, error.to_state, error.what) == (source, target, "attempt 1")
    assert [step.to for step in error.history] == [JobState.WAITING, JobState.RUNNING]
    assert f"illegal attempt 1 transition {source} -> {target} (a bug)" in str(error)
    assert "WAITING -> RUNNING (all tasks started)" in str(error)


@pytest.mark.parametrize(("source", "target"), TASK_PAIRS, ids=[f"{a}->{b}" for a, b in TASK_PAIRS])
def test_task_table(source: TaskState, target: TaskState) -> None:
    record = a_running_job()
    task = msgspec.structs.replace(record.current.tasks[0], state=source)
    if (source, target) in TASK_LEGAL:
        assert move_task(record, task, target, why="test").state == target
        return
    with pytest.raises(IllegalTransition) as raised:
        move_task(record, task, target, why="a bug")
    error = raised.value
    assert (error.from_state, error.to_state) == (source, target)
    assert error.what == "task worker/0 (task attempt 0)"
    assert [step.to for step in error.history] == [JobState.WAITING, JobState.RUNNING]
    assert f"{source} -> {target} (a bug)" in str(error)


def test_tables_cover_every_state_and_finals_stay_final() -> None:
    assert set(TASK_TRANSITIONS) == set(TaskState)
    assert set(ATTEMPT_TRANSITIONS) == set(JobState)
    assert not TASK_TRANSITIONS[TaskState.SUCCEEDED] and not TASK_TRANSITIONS[TaskState.STOPPED]
    assert all(not ATTEMPT_TRANSITIONS[s] for s in JobState if s.is_final)
    # An attempt never stops gradually: the job does (STOPPING), the attempt just ends.
    assert not ATTEMPT_TRANSITIONS[JobState.STOPPING]
    assert JobState.STOPPING not in set().union(*ATTEMPT_TRANSITIONS.values())


def test_an_illegal_task_change_in_the_core_raises_with_earlier_task_attempts() -> None:
    driver = Driver(job_spec(role("worker", 1, task_retry_count=1), gang=False))
    driver.start()
    driver.fail("worker", 0, Reaction.RETRY_TO_MAX)  # retried: task attempt 1
    record = driver.record
    task = record.current.tasks[0]
    assert task.taskAttempt == 1 and task.state == TaskState.WAITING
    with pytest.raises(IllegalTransition) as raised:
        move_task(record, task, TaskState.WAITING, why="a bug")
    assert "task attempt 0: FAILED" in str(raised.value)
