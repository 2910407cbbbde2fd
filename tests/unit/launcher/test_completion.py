"""Completion policies: minFailedInstances / minSucceededInstances, as OpenPAI applies them."""

from __future__ import annotations

import pytest

from libs.common import messages
from libs.common.messages import JobState, Reaction, TaskState
from services.launcher.core.tasks import TaskFinished
from tests.unit.launcher.builders import Clock, Driver, job_spec, killed, published, role

# (role, index, exit code); a non-zero exit gets a NEVER_RETRY verdict right away.
Step = tuple[str, int, int]

CASES = [
    # id, roles, steps, expected job state (after remaining tasks were killed), trigger
    (
        "default-all-succeed",
        [role("worker", 3)],
        [("worker", 0, 0), ("worker", 1, 0), ("worker", 2, 0)],
        JobState.SUCCEEDED,
        ("worker", 2),
    ),
    ("default-waits-for-every-task", [role("worker", 3)], [("worker", 0, 0), ("worker", 1, 0)], JobState.RUNNING, None),
    (
        "default-one-failure-fails",
        [role("worker", 3)],
        [("worker", 0, 0), ("worker", 1, 7)],
        JobState.FAILED,
        ("worker", 1),
    ),
    (
        "minFailed-2-tolerates-one",
        [role("worker", 3, min_failed=2)],
        [("worker", 0, 7), ("worker", 1, 0)],
        JobState.RUNNING,
        None,
    ),
    (
        "minFailed-2-second-failure-fails",
        [role("worker", 3, min_failed=2)],
        [("worker", 0, 7), ("worker", 1, 7)],
        JobState.FAILED,
        ("worker", 1),
    ),
    (
        "minFailed-unlimited-all-fail-succeeds",
        [role("worker", 3, min_failed=-1)],
        [("worker", 0, 7), ("worker", 1, 7), ("worker", 2, 7)],
        JobState.SUCCEEDED,
        ("worker", 2),
    ),
    (
        "minFailed-above-failures-all-done-succeeds",
        [role("worker", 3, min_failed=3)],
        [("worker", 0, 7), ("worker", 1, 7), ("worker", 2, 0)],
        JobState.SUCCEEDED,
        ("worker", 2),
    ),
    (
        "minSucceeded-1-first-success-completes",
        [role("worker", 3, min_succeeded=1)],
        [("worker", 1, 0)],
        JobState.SUCCEEDED,
        ("worker", 1),
    ),
    ("minSucceeded-2-not-yet", [role("worker", 3, min_succeeded=2)], [("worker", 0, 0)], JobState.RUNNING, None),
    (
        "minSucceeded-2-after-tolerated-failure",
        [role("worker", 3, min_failed=-1, min_succeeded=2)],
        [("worker", 0, 7), ("worker", 1, 0), ("worker", 2, 0)],
        JobState.SUCCEEDED,
        ("worker", 2),
    ),
    (
        "failure-checked-before-success",
        [role("worker", 2, min_failed=1, min_succeeded=1)],
        [("worker", 0, 7)],
        JobState.FAILED,
        ("worker", 0),
    ),
    (
        "worker-quorum-ends-job-while-ps-runs",
        [role("ps", 1), role("worker", 2, min_succeeded=2)],
        [("worker", 0, 0), ("worker", 1, 0)],
        JobState.SUCCEEDED,
        ("worker", 1),
    ),
    (
        "ps-failure-fails-job-workers-tolerant",
        [role("ps", 1), role("worker", 2, min_failed=-1)],
        [("worker", 0, 7), ("ps", 0, 3)],
        JobState.FAILED,
        ("ps", 0),
    ),
    (
        "tolerant-role-failures-then-all-done",
        [role("ps", 1, min_failed=-1), role("worker", 2)],
        [("ps", 0, 3), ("worker", 0, 0), ("worker", 1, 0)],
        JobState.SUCCEEDED,
        ("worker", 1),
    ),
]


@pytest.mark.parametrize(("roles", "steps", "expected", "trigger"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_completion_policy_decides_the_job_state(roles, steps: list[Step], expected: JobState, trigger) -> None:
    driver = Driver(job_spec(*roles))
    driver.start()
    for role_name, index, code in steps:
        driver.finish(role_name, index, code)
        if code != 0:
            driver.verdict(role_name, index, Reaction.NEVER_RETRY, code)
    driver.confirm_kills(driver.log)

    record = driver.record
    assert record.state == expected
    if trigger is not None:
        assert (record.appExitTriggerTaskRoleName, record.appExitTriggerTaskIndex) == trigger
    if expected == JobState.FAILED:
        assert record.appExitCode == dict(((r, i), c) for r, i, c in steps)[trigger]
    if expected == JobState.SUCCEEDED:
        assert record.appExitCode == 0
    if expected.is_final:
        assert all(t.state != TaskState.RUNNING for t in record.current.tasks)


def test_remaining_tasks_are_killed_and_the_job_completes_only_when_they_are_gone() -> None:
    driver = Driver(job_spec(role("worker", 3, min_succeeded=1)))
    driver.start()

    decided = driver.finish("worker", 0, 0)

    assert sorted(k.index for k in killed(decided)) == [1, 2]
    assert driver.state == JobState.RUNNING  # like OpenPAI while the pods are deleted
    assert published(decided, messages.JobReleased) == []

    first_kill, second_kill = killed(decided)
    first = driver.handle(TaskFinished(key=first_kill, exitCode=143))
    assert driver.state == JobState.RUNNING
    assert published(first, messages.JobReleased) == []

    both = first + driver.handle(TaskFinished(key=second_kill, exitCode=143))
    assert driver.state == JobState.SUCCEEDED
    released = published(both, messages.JobReleased)
    assert [(r.attempt, r.requeue) for r in released] == [(1, False)]
    tasks = {t.index: t for t in driver.record.current.tasks}
    assert tasks[0].state == TaskState.SUCCEEDED
    assert {tasks[1].state, tasks[2].state} == {TaskState.STOPPED}
    assert tasks[1].exitSpec is not None and tasks[1].exitSpec.phrase == "FrameworkAttemptCompletion"


def test_a_failed_task_waits_for_the_runtime_verdict_before_deciding() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.start()

    exited = driver.finish("worker", 0, 1, userLogTail="Traceback ...", logPath="/logs/w0")
    driver.finish("worker", 1, 0)

    assert driver.state == JobState.RUNNING
    [event] = published(exited, messages.TaskExited)
    assert (event.exitCode, event.userLogTail, event.logPath) == (1, "Traceback ...", "/logs/w0")
    assert event.id == "alice~train/1/worker/0/0/exited"
    assert driver.record.current.task("worker", 0).verdictPending

    decided = driver.verdict("worker", 0, Reaction.NEVER_RETRY, 1)

    assert driver.state == JobState.FAILED
    [change] = published(decided, messages.JobStateChanged)
    assert change.cause == "rt/alice.train.1.worker.0.0"
    assert change.exitSpec is not None and change.exitSpec.phrase == "Code1"
    assert "boom" in driver.record.appExitDiagnostics


def test_successful_exit_needs_no_verdict() -> None:
    driver = Driver()
    driver.start()
    actions = driver.finish(code=0)
    assert driver.state == JobState.SUCCEEDED
    assert [e.state for e in published(actions, messages.JobStateChanged)] == [JobState.SUCCEEDED]
    assert driver.record.current.task("worker", 0).exitSpec.phrase == "Succeeded"


class _TickingClock(Clock):
    """A clock that moves on at every reading, as a real one does between two calls."""

    def __call__(self) -> float:
        self.now += 0.0007
        return self.now


@pytest.mark.parametrize("code", [0, 3], ids=["succeeded", "failed"])
def test_a_final_state_has_one_time_in_the_record_its_history_and_its_event(code):
    """The job list compares the record's completedTime with the event's time (as the history
    stores it): read twice from a moving clock, they differed, by a millisecond once rounded."""
    driver = Driver(clock=_TickingClock())
    driver.start()
    actions = driver.finish(code=code)
    if code:
        actions += driver.verdict(reaction=Reaction.NEVER_RETRY, code=code)
    final = [e for e in published(actions, messages.JobStateChanged) if e.state.is_final]
    assert len(final) == 1
    record = driver.record
    assert record.state.is_final
    assert final[0].at == record.completedTime == record.history[-1].at
