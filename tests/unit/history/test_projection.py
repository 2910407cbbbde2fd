"""The history projection's pure core: what each event does to the tables."""

from __future__ import annotations

import pytest

from libs.common.ids import EventId, JobId, VcName
from libs.common.messages import JobPlaced, JobState, TaskPlacement, TerminalClosed, TerminalOpened
from services.rest.history.projection import Delete, Upsert, project, project_batch
from tests.fixtures import history_events as ev

JOB = "alice~train"


def _by_table(ops) -> dict[str, list]:
    found: dict[str, list] = {}
    for op in ops:
        found.setdefault(op.table, []).append(op)
    return found


def test_a_submission_writes_the_job_row_and_its_first_event():
    ops = _by_table(project(7, ev.submitted(JOB, instances=3, gpu=2)))
    (job,) = ops["jobs"]
    assert job.key == {"id": JOB}
    assert job.values["user"] == "alice" and job.values["name"] == "train"
    assert job.values["submitted_at"] == ev.T0 and job.values["submitted_seq"] == 7
    assert (job.values["task_count"], job.values["gpu_count"]) == (3, 6)
    assert job.on_insert == {"state": "WAITING", "state_seq": 7}  # never sets a state a later event wrote
    assert job.guard is None
    (event,) = ops["events"]
    assert event.key == {"id": f"{JOB}/submitted"} and event.on_insert["reason"] == "Submitted"
    assert not event.values and not event.coalesce  # inserted once, never updated


@pytest.mark.parametrize(
    ("to", "completed", "started", "kind"),
    [
        pytest.param(JobState.RUNNING, None, ev.T0 + 1, "Normal", id="running-sets-started"),
        pytest.param(JobState.SUCCEEDED, ev.T0 + 1, None, "Normal", id="succeeded-sets-completed"),
        pytest.param(JobState.FAILED, ev.T0 + 1, None, "Warning", id="failed-is-a-warning"),
        pytest.param(JobState.STOPPED, ev.T0 + 1, None, "Warning", id="stopped-is-a-warning"),
        pytest.param(JobState.WAITING, None, None, "Normal", id="retry-waits-again"),
    ],
)
def test_a_state_change_is_guarded_by_its_sequence(to, completed, started, kind):
    ops = _by_table(project(12, ev.state(JOB, to, attempt=2)))
    (job,) = ops["jobs"]
    assert job.guard == "state_seq" and job.values["state_seq"] == 12
    assert job.values["state"] == to.value and job.values["completed_at"] == completed
    assert job.coalesce["started_at"] == started
    assert job.values["attempt"] == 2 and job.values["retries"] == 1
    (attempt,) = ops["attempts"]
    assert attempt.key == {"job": JOB, "attempt": 2} and attempt.guard == "state_seq"
    assert ops["events"][0].on_insert["type"] == kind


def test_a_state_change_before_its_submission_makes_a_placeholder_row():
    (job, *_) = project(3, ev.state(JOB, JobState.RUNNING))
    assert job.on_insert == {"user": "alice", "name": "train"}


def test_a_failed_exit_records_the_task_and_a_warning():
    ops = _by_table(project(20, ev.task_exited(JOB, 137, platform_reason="OOMKilled")))
    (task,) = ops["tasks"]
    assert task.key == {"job": JOB, "attempt": 1, "role": "worker", "idx": 0, "task_attempt": 0}
    assert task.values == {"state": "FAILED", "state_seq": 20}
    assert task.coalesce["exit_code"] == 137 and task.coalesce["platform_reason"] == "OOMKilled"
    (event,) = ops["events"]
    assert event.on_insert["reason"] == "TaskFailed" and "137 (OOMKilled)" in event.on_insert["message"]


@pytest.mark.parametrize(("code", "reason", "state"), [
    pytest.param(0, "", "SUCCEEDED", id="exit-0"),
    pytest.param(1, "", "FAILED", id="exit-1"),
    pytest.param(143, "Stopped", "STOPPED", id="stopped"),
    pytest.param(143, "Preempted", "STOPPED", id="preempted"),
])
def test_task_states_from_exits(code, reason, state):
    (task, *_) = project(1, ev.task_exited(JOB, code, platform_reason=reason))
    assert task.values["state"] == state


def test_an_exit_0_has_no_event_row():
    assert [op.table for op in project(1, ev.task_exited(JOB, 0))] == ["tasks"]


def test_a_verdict_explains_the_task():
    ops = _by_table(project(21, ev.verdict(JOB, 1, "user error")))
    assert ops["tasks"][0].coalesce == {"exit_spec_code": 1, "exit_phrase": "user error"}
    assert ops["events"][0].on_insert["reason"] == "TaskExplained"


def test_waiting_stop_and_placement():
    waiting = _by_table(project(4, ev.waiting(JOB, "no free cells in vc default")))
    assert waiting["jobs"][0].coalesce == {"waiting_reason": "no free cells in vc default"}
    stopped = _by_table(project(5, ev.stop(JOB, "bob")))
    assert stopped["jobs"][0].coalesce == {"stop_requested_by": "bob"}
    placed = project(6, JobPlaced(id=f"{JOB}/1/placed", job=JOB, vc="default", attempt=1, tasks=[
        TaskPlacement(role="worker", index=0, node="n1"), TaskPlacement(role="worker", index=1, node="n2")]))
    assert [op.on_insert["message"] for op in placed] == ["2 task(s) placed on n1, n2"]


def test_a_long_reason_is_cut():
    (job, event) = project(4, ev.waiting(JOB, "x" * 10_000))
    assert len(job.coalesce["waiting_reason"]) == 2000 and len(event.on_insert["message"]) == 2000


def test_a_deletion_removes_only_what_older_events_wrote():
    ops = project(40, ev.deleted(JOB))
    assert all(isinstance(op, Delete) for op in ops)
    assert {op.table for op in ops} == {"jobs", "attempts", "tasks", "events", "job_tags"}
    assert all(op.before_seq == 40 for op in ops)


def test_a_batch_keeps_stream_order():
    ops = project_batch([(1, ev.submitted(JOB)), (2, ev.state(JOB, JobState.RUNNING))])
    assert [(op.table, isinstance(op, Upsert)) for op in ops][:2] == [("jobs", True), ("events", True)]
    assert ops[2].values["state"] == "RUNNING"


@pytest.mark.parametrize(
    ("event", "reason", "message"),
    [
        pytest.param(TerminalOpened(id=EventId(f"{JOB}/terminal/s1/opened"), job=JobId(JOB), at=ev.T0, vc=VcName("vc1"),
                                    attempt=2, role="worker", index=1, by="bob", session="s1", mode="container"),
                     "TerminalOpened", "bob opened a terminal in task worker[1] (container)", id="opened-says-who-and-how"),
        pytest.param(TerminalClosed(id=EventId(f"{JOB}/terminal/s1/closed"), job=JobId(JOB), at=ev.T0 + 75, vc=VcName("vc1"),
                                    attempt=2, role="worker", index=1, by="bob", session="s1", openedAt=ev.T0,
                                    seconds=75.2, reason="the shell exited"),
                     "TerminalClosed", "the terminal bob opened in task worker[1] closed after 1m 15s: the shell exited",
                     id="closed-says-how-long-and-why"),
    ],
)
def test_a_terminal_session_is_one_event_row_each_for_its_open_and_close(event, reason, message):
    (row,) = project(9, event)
    assert row.table == "events" and row.key == {"id": event.id}
    assert row.on_insert["reason"] == reason and row.on_insert["message"] == message
    assert (row.on_insert["type"], row.on_insert["attempt"], row.on_insert["subject"]) == ("Normal", 2, f"{JOB}/worker/1")
