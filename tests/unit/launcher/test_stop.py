"""Stopping a job in each state."""

from __future__ import annotations

import pytest

from libs.common import messages
from libs.common.exitspecs import STOP_EXIT_CODE
from libs.common.messages import JobState, Reaction, TaskState
from tests.unit.launcher.builders import Driver, job_spec, killed, published, role, states_published


def waiting_unplaced(driver: Driver) -> None:
    driver.submit()


def waiting_placed_gang_starting(driver: Driver) -> None:
    driver.submit()
    driver.place()


def running(driver: Driver) -> None:
    driver.start()


def waiting_in_backoff(driver: Driver) -> None:
    driver.start()
    driver.fail("worker", 0, Reaction.ALWAYS_BACKOFF_RETRY)
    driver.confirm_kills(driver.log)


def waiting_in_backoff_with_held_placement(driver: Driver) -> None:
    waiting_in_backoff(driver)
    driver.place()


CASES = [
    # id, setup, states published by the stop request, tasks killed, then after the kills, release of attempt
    ("waiting-unplaced", waiting_unplaced, [JobState.STOPPED], 0, [], None),
    ("waiting-gang-starting", waiting_placed_gang_starting, [JobState.STOPPING], 2, [JobState.STOPPED], 1),
    ("running", running, [JobState.STOPPING], 2, [JobState.STOPPED], 1),
    ("waiting-in-backoff", waiting_in_backoff, [JobState.STOPPED], 0, [], None),
    ("waiting-in-backoff-placed", waiting_in_backoff_with_held_placement, [JobState.STOPPED], 0, [], 2),
]


@pytest.mark.parametrize(
    ("setup", "first_states", "kills", "later_states", "released_attempt"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_stop(setup, first_states, kills, later_states, released_attempt) -> None:
    driver = Driver(job_spec(role("worker", 2)))
    setup(driver)

    asked = driver.stop(by="alice")
    assert states_published(asked) == first_states
    assert len(killed(asked)) == kills
    assert all(a.reason == "stopped by alice" for a in asked if type(a).__name__ == "KillTask")
    done = driver.confirm_kills(asked)
    assert states_published(done) == later_states

    record = driver.record
    assert record.state == JobState.STOPPED
    assert record.stopRequestedBy == "alice"
    assert record.appExitCode == STOP_EXIT_CODE
    assert record.appExitSpec is not None and record.appExitSpec.phrase == "StopFrameworkRequested"
    assert all(t.state == TaskState.STOPPED for t in record.current.tasks)
    releases = [r for r in published(asked + done, messages.JobReleased)]
    if released_attempt is None:
        assert releases == []
    else:
        assert [(r.attempt, r.requeue) for r in releases] == [(released_attempt, False)]


def test_stop_while_stopping_or_final_changes_nothing() -> None:
    driver = Driver()
    driver.start()
    asked = driver.stop()
    assert driver.state == JobState.STOPPING
    assert driver.stop(by="admin") == []
    driver.confirm_kills(asked)
    assert driver.state == JobState.STOPPED
    assert driver.stop() == []
    assert driver.record.stopRequestedBy == "alice"


def test_stop_after_success_was_decided_keeps_the_success() -> None:
    driver = Driver(job_spec(role("worker", 2, min_succeeded=1)))
    driver.start()
    decided = driver.finish("worker", 0, 0)

    asked = driver.stop(by="alice")

    assert killed(asked) == [] and states_published(asked) == []
    driver.confirm_kills(decided)
    assert driver.state == JobState.SUCCEEDED
    assert driver.record.stopRequestedBy == "alice"


def test_stop_while_an_attempt_ends_for_a_retry_prevents_the_retry() -> None:
    driver = Driver(job_spec(role("worker", 2), job_retry_count=3))
    driver.start()
    decided = driver.fail("worker", 0)
    assert driver.state == JobState.RUNNING  # worker 1 is being killed

    asked = driver.stop()
    assert killed(asked) == []  # already being killed
    assert states_published(asked) == [JobState.STOPPING]
    done = driver.confirm_kills(decided)

    assert states_published(done) == [JobState.STOPPED]
    assert driver.record.attempt == 1 and driver.record.retries == 0
    [released] = published(done, messages.JobReleased)
    assert released.requeue is False


def test_kills_carry_the_configured_grace_period() -> None:
    driver = Driver(kill_grace_seconds=5.0)
    driver.start()
    [kill] = [a for a in driver.stop() if type(a).__name__ == "KillTask"]
    assert kill.grace_seconds == 5.0


def test_an_event_the_platform_gave_up_on_fails_the_job_and_kills_its_tasks():
    """A poison message of this job (dead-lettered by a service) ends it FAILED with
    an exit spec saying which service gave up and why, never retried."""
    from libs.common import exitspecs
    from services.launcher.core.events import DeadLettered

    driver = Driver(job_spec(role("worker", 2), job_retry_count=3))
    driver.start()
    decided = driver.handle(
        DeadLettered(job=driver.record.job, consumer="runtime", eventKind="task.exited", reason="RuntimeError: boom",
                     id="alice~train/x/dead-lettered/runtime")
    )
    assert sorted(killed(decided)) == sorted([driver.key("worker", 0), driver.key("worker", 1)])
    driver.confirm_kills(decided)
    record = driver.record
    assert record.state == JobState.FAILED and record.attempt == 1
    assert record.appExitCode == exitspecs.DEAD_LETTERED_EXIT_CODE
    assert "runtime" in record.appExitSpec.reason and "RuntimeError: boom" in record.appExitSpec.reason
    # A second announcement (redelivery) changes nothing.
    assert driver.handle(
        DeadLettered(job=driver.record.job, consumer="runtime", eventKind="task.exited", reason="RuntimeError: boom",
                     id="alice~train/x/dead-lettered/runtime")
    ) == []
