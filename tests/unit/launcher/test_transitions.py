"""The job state machine: one explicit table; anything else raises with the history."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from libs.common.messages import JobState
from libs.common.records import AttemptEnding, EndOutcome
from services.launcher.backends.base import TaskFinished
from services.launcher.core import IllegalTransition
from services.launcher.core.transitions import LEGAL_TRANSITIONS, is_legal, transition
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
