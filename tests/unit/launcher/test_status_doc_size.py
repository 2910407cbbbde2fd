"""A job's status document stays under NATS's max payload (services/launcher/core/compaction.py)
and still shows what the API needs."""

from __future__ import annotations

import pytest

from libs.common.messages import ExitSpec, JobState, Reaction, TaskState
from libs.common.records import decode_job_record, encode_job_record
from services.launcher.core import SaveJob, Verdict, compaction
from services.launcher.core.compaction import BRIEFED_OLDER_ATTEMPTS, FULL_TASK_ATTEMPTS, compact_attempt
from services.launcher.core.tasks import TaskFinished
from tests.unit.launcher.builders import Driver, job_spec, role

NATS_MAX_PAYLOAD = 1024 * 1024
TASKS = 512

# What a real rule gives: every field of OpenPAI's exit spec filled in.
USER_FAILURE = ExitSpec(
    code=1, phrase="UserFailure", issuer="USER", causer="USER", type="USER_FAILURE", stage="RUNNING",
    behavior="UNKNOWN", reaction=Reaction.RETRY_TO_MAX,
    reason="The program exited with a non-zero code; the last lines of its log say why. " * 3,
    repro=["run the command again"] * 3, solution=["read the log, fix the program and submit again"] * 3,
)


def fail_task_zero(driver: Driver, index: int = 0) -> list:
    """Task `index` fails by itself; the launcher kills the others and confirms their end."""
    driver.handle(*[])
    acts = driver.finish("worker", index, 1, userLogTail="Traceback ...\n" * 200, platformMessage="exit 1")
    key = driver.key("worker", index)
    acts += driver.handle(Verdict(key=key, exitCode=1, spec=USER_FAILURE, diagnostics=["boom " * 40],
                                  id=f"rt/{key.slug}"))
    return acts + driver.confirm_kills(acts)


def saved_sizes(actions) -> list[int]:
    return [len(encode_job_record(a.record)) for a in actions if isinstance(a, SaveJob)]


def test_a_512_task_job_retried_five_times_stays_under_the_limit_and_shows_every_attempt():
    driver = Driver(job_spec(role("worker", TASKS), job_retry_count=5))
    sizes = saved_sizes(driver.start())
    for _ in range(5):
        sizes += saved_sizes(fail_task_zero(driver))
        sizes += saved_sizes(driver.place() + driver.running())
    sizes += saved_sizes(fail_task_zero(driver))
    record = driver.record
    assert (record.state, record.attempt, record.retries) == (JobState.FAILED, 6, 5)
    assert max(sizes) < NATS_MAX_PAYLOAD, f"largest document {max(sizes)} bytes"
    # The stored document decodes to the same record (defaults left out are filled in).
    assert decode_job_record(encode_job_record(record)) == record

    # Job detail: the latest attempt has all its tasks in full.
    assert len(record.current.tasks) == TASKS and not record.current.compacted
    assert record.appExitSpec == USER_FAILURE and record.appExitTriggerTaskIndex == 0
    # Every older attempt keeps its outcome, the task that failed it in full, every task briefly.
    for older in record.attempts[:-1]:
        assert older.compacted and older.exitCode == 1 and older.exitSpec == USER_FAILURE
        assert older.endReason.startswith("retry")
        [culprit] = older.tasks
        assert (culprit.index, culprit.state, culprit.exitSpec) == (0, TaskState.FAILED, USER_FAILURE)
        assert len(older.taskBriefs) == TASKS
        assert {b.state for b in older.taskBriefs[1:]} == {TaskState.STOPPED}
    # GET /job-attempts still lists every task of every attempt, in index order.
    from services.rest import views

    shown = views.job_attempts(record)
    assert [a["attemptIndex"] for a in shown] == [6, 5, 4, 3, 2, 1]
    for attempt in shown:
        statuses = attempt["taskRoles"]["worker"]
        assert [s["taskIndex"] for s in statuses] == list(range(TASKS))
        assert statuses[0]["taskState"] == "FAILED" and statuses[0]["containerExitCode"] == 1
        assert {s["taskState"] for s in statuses[1:]} == {"STOPPED"}


@pytest.fixture
def compact_every_job(monkeypatch):
    """Compaction on for the small jobs below (it starts past FULL_DETAIL_TASK_RECORDS)."""
    monkeypatch.setattr(compaction, "FULL_DETAIL_TASK_RECORDS", 0)


def test_a_small_job_keeps_every_detail_of_every_attempt():
    driver = Driver(job_spec(role("worker", 3), job_retry_count=2))
    driver.start()
    fail_task_zero(driver)
    older = driver.record.attempts[0]
    assert not older.compacted and len(older.tasks) == 3
    from services.rest import views

    [_, first] = views.job_attempts(driver.record)
    assert all("taskAttempts" in status and "brief" not in status for status in first["taskRoles"]["worker"])


@pytest.mark.usefixtures("compact_every_job")
def test_a_redelivered_exit_of_a_compacted_attempt_changes_nothing():
    driver = Driver(job_spec(role("worker", 3), job_retry_count=2))
    driver.start()
    old_key = driver.key("worker", 1)
    fail_task_zero(driver)
    assert driver.record.attempts[0].compacted
    assert driver.handle(TaskFinished(key=old_key, exitCode=143)) == []


@pytest.mark.usefixtures("compact_every_job")
def test_the_oldest_attempts_keep_only_their_outcome():
    driver = Driver(job_spec(role("worker", 4), job_retry_count=BRIEFED_OLDER_ATTEMPTS + 3))
    driver.start()
    for _ in range(BRIEFED_OLDER_ATTEMPTS + 3):
        fail_task_zero(driver)
        driver.place()
        driver.running()
    attempts = driver.record.attempts
    far, near = attempts[:3], attempts[3:-1]
    assert all(not a.taskBriefs and [t.index for t in a.tasks] == [0] and a.exitSpec == USER_FAILURE for a in far)
    assert all(len(a.taskBriefs) == 4 for a in near) and len(near) == BRIEFED_OLDER_ATTEMPTS


def test_task_retries_keep_only_the_last_ones_in_full():
    driver = Driver(job_spec(role("worker", 2, task_retry_count=6), gang=False))
    driver.start()
    for _ in range(6):
        fail_task_zero(driver)
        driver.running(driver.key("worker", 0))
    task = driver.record.current.task("worker", 0)
    assert [s.taskAttempt for s in task.taskAttempts] == list(range(6))
    trimmed, full = task.taskAttempts[:-FULL_TASK_ATTEMPTS], task.taskAttempts[-FULL_TASK_ATTEMPTS:]
    assert all(s.diagnostics == [] and s.exitSpec.phrase == "UserFailure" and s.exitSpec.reason == "" for s in trimmed)
    assert all(s.exitSpec == USER_FAILURE and s.diagnostics for s in full)


@pytest.mark.usefixtures("compact_every_job")
def test_compacting_twice_changes_nothing():
    driver = Driver(job_spec(role("worker", 2), job_retry_count=1))
    driver.start()
    fail_task_zero(driver)
    older = driver.record.attempts[0]
    assert compact_attempt(older) is older
