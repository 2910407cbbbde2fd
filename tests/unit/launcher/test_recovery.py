"""Restart: rebuild from the stored records, reconcile with what the backend still knows."""

from __future__ import annotations

from collections.abc import Iterable

from libs.common import messages
from libs.common.exitspecs import LOST_EXIT_CODE
from libs.common.messages import JobState, Reaction, TaskState
from libs.common.records import decode_job_record, encode_job_record
from services.launcher.core import Action, ForgetTask, KillTask, LauncherCore, Publish, SaveJob, StartTask
from services.launcher.core.tasks import TaskKey
from tests.unit.launcher.builders import JOB, Driver, job_spec, published, role, started, timers


def restart(driver: Driver, saved_by: Iterable[Action] | None = None) -> Driver:
    """A new launcher process: records come back from the KV bucket (as JSON), nothing else."""
    stored: dict[str, bytes] = {}
    for action in saved_by if saved_by is not None else driver.log:
        if isinstance(action, SaveJob):
            stored[action.record.job] = encode_job_record(action.record)
    fresh = Driver(driver.spec, clock=driver.clock)
    for data in stored.values():
        fresh.core.load(decode_job_record(data))
    fresh.core.validate_state()
    return fresh


def recover(driver: Driver, known: set[TaskKey]) -> list[Action]:
    actions = driver.core.recover(known)
    driver.log.extend(actions)
    driver.core.validate_state()
    return actions


def test_a_running_task_the_backend_lost_is_reported_lost_and_judged() -> None:
    driver = Driver(job_spec(role("worker", 2), job_retry_count=1))
    driver.start()
    after = restart(driver)

    actions = recover(after, known={after.key("worker", 1)})

    [exited] = published(actions, messages.TaskExited)
    assert (exited.index, exited.exitCode, exited.platformReason) == (0, LOST_EXIT_CODE, "Lost")
    assert started(actions) == []
    assert after.record.current.task("worker", 0).verdictPending
    decided = after.verdict("worker", 0, Reaction.ALWAYS_RETRY, LOST_EXIT_CODE)
    assert killed_keys(decided) == [after.key("worker", 1)]


def killed_keys(actions: Iterable[Action]) -> list[TaskKey]:
    return [a.key for a in actions if isinstance(a, KillTask)]


def test_a_task_ordered_but_never_started_is_started_exactly_once() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    submitted = driver.submit()
    placed = driver.place()
    # The shell saved the record, then died before starting anything.
    after = restart(driver, saved_by=submitted + placed)

    actions = recover(after, known=set())

    assert sorted(started(actions)) == sorted(started(placed))
    original = {a.launch.key: a.launch for a in placed if isinstance(a, StartTask)}
    for action in actions:
        if isinstance(action, StartTask):
            assert action.launch == original[action.launch.key]
    # A second launcher restart after the backend started them starts nothing again.
    again = restart(after, saved_by=submitted + placed)
    assert started(recover(again, known=set(original))) == []


def test_tasks_with_recorded_exits_are_forgotten_and_orphans_killed() -> None:
    driver = Driver(job_spec(role("worker", 2, min_failed=-1)))
    driver.start()
    driver.finish("worker", 0, 0)
    after = restart(driver)
    orphan = TaskKey(job="carol~x", attempt=1, role="r", index=0)

    actions = recover(after, known={after.key("worker", 0), after.key("worker", 1), orphan})

    assert [a.key for a in actions if isinstance(a, ForgetTask)] == [after.key("worker", 0)]
    assert killed_keys(actions) == [orphan]
    assert started(actions) == []


def test_a_kill_ordered_before_the_restart_is_ordered_again_or_completed() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.start()
    driver.stop()
    after = restart(driver)

    actions = recover(after, known={after.key("worker", 0)})

    assert killed_keys(actions) == [after.key("worker", 0)]
    assert after.record.current.task("worker", 1).state == TaskState.STOPPED
    assert after.state == JobState.STOPPING
    after.confirm_kills(actions)
    assert after.state == JobState.STOPPED


def test_a_pending_backoff_timer_is_started_again() -> None:
    driver = Driver()
    driver.start()
    driver.fail(reaction=Reaction.ALWAYS_BACKOFF_RETRY)
    until = driver.record.current.backoffUntil
    after = restart(driver)

    [timer] = timers(recover(after, known=set()))

    assert (timer.attempt, timer.at) == (2, until)


def test_after_recovery_the_job_goes_on_as_if_nothing_happened() -> None:
    uninterrupted = Driver(job_spec(role("worker", 2)))
    uninterrupted.submit()
    uninterrupted.place()
    last_call = uninterrupted.running()
    after = restart(uninterrupted)

    # Only the publications of the last change come again (in case they were lost), same ids.
    replayed = recover(after, known=set(uninterrupted.keys()))
    assert replayed == [a for a in last_call if isinstance(a, Publish)]

    for driver in (uninterrupted, after):
        driver.finish("worker", 0, 0)
        driver.finish("worker", 1, 0)
    assert after.record == uninterrupted.record
    assert after.state == JobState.SUCCEEDED


def test_recover_with_nothing_loaded_does_nothing() -> None:
    core = LauncherCore(lambda: 0.0)
    assert core.recover(set()) == []
    assert core.job(JOB) is None


def test_publications_lost_in_a_crash_are_published_on_recovery() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.start()
    exited = driver.finish("worker", 0, 1, userLogTail="CUDA out of memory")
    # The shell saved the record and died before publishing: the runtime never heard of the exit.
    after = restart(driver)

    actions = recover(after, known={after.key("worker", 1)})

    [again] = published(actions, messages.TaskExited)
    assert again == published(exited, messages.TaskExited)[0]
    assert again.userLogTail == "CUDA out of memory"
    # Everything else of the last change (saving, forgetting) is not redone as a new fact.
    assert [a for a in actions if isinstance(a, SaveJob)] == []
