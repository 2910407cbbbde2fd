"""The stored job document, bus-event translation, and placements the job cannot use."""

from __future__ import annotations

import json

import pytest

from libs.common import messages
from libs.common.errors import BadInput, Transient
from libs.common.messages import ExitSpec, JobState, TaskPlacement
from libs.common.records import JobRecord, decode_job_record, encode_job_record
from services.launcher.core import (
    Placed,
    PreemptRequested,
    StopRequested,
    Submitted,
    Verdict,
    from_message,
)
from services.launcher.core.tasks import TaskKey
from services.monitor.core import decode_stored_job
from tests.unit.launcher.builders import JOB, Driver, job_spec, published, role, started


def test_job_record_round_trips_through_the_kv_encoding() -> None:
    driver = Driver(job_spec(role("worker", 2, ports={"http": 1})))
    driver.start()
    driver.fail("worker", 0)
    record = driver.record

    data = encode_job_record(record)

    assert decode_job_record(data) == record
    document = json.loads(data)
    assert document["job"] == "alice~train" and document["state"] == record.state.value
    assert document["history"][1]["from"] == "WAITING"  # OpenPAI-style field name, not from_
    assert {"attempts", "createdTime"} <= set(document)
    # Fields at their defaults are left out (decoding fills them in): nothing ended the job yet.
    assert record.appExitCode is None and not {"appExitCode", "appExitSpec", "completedTime"} & set(document)


def test_a_waiting_job_s_document_leaves_its_state_out_and_readers_take_the_default() -> None:
    driver = Driver(job_spec(role("worker", 1)))
    driver.submit()
    record = driver.record
    assert record.state == JobState.WAITING

    data = encode_job_record(record)

    assert "state" not in json.loads(data)
    assert decode_job_record(data).state == JobState.WAITING
    assert decode_stored_job(data).state == JobState.WAITING  # the monitor's restore


def test_a_minimal_document_decodes_with_defaults() -> None:
    data = json.dumps({"job": "a~b", "name": "b", "user": "a", "vc": "default", "spec": {"name": "b", "user": "a"}})
    record = decode_job_record(data.encode())
    assert isinstance(record, JobRecord)
    assert (record.state, record.attempt, record.retries, record.attempts) == (JobState.WAITING, 1, 0, [])


SPEC = job_spec()
KEY = TaskKey(job=JOB, attempt=2, role="worker", index=1, taskAttempt=3)
MESSAGES = [
    (
        "submitted",
        messages.JobSubmitted(id="s", job=JOB, at=7.0, spec=SPEC),
        Submitted(job=JOB, spec=SPEC, at=7.0, id="s"),
    ),
    (
        "placed",
        messages.JobPlaced(id="p", job=JOB, vc="default", attempt=2, tasks=[], partial=True),
        Placed(job=JOB, attempt=2, tasks=[], partial=True, id="p"),
    ),
    (
        "preempt",
        messages.PreemptRequested(id="x", job=JOB, vc="default", attempt=2, by="bob~b", reason="r"),
        PreemptRequested(job=JOB, attempt=2, by="bob~b", reason="r", id="x"),
    ),
    (
        "stop",
        messages.StopRequested(id="t", job=JOB, vc="default", by="alice"),
        StopRequested(job=JOB, by="alice", id="t"),
    ),
    (
        "verdict",
        messages.TaskVerdict(
            id="v",
            job=JOB,
            vc="default",
            attempt=2,
            role="worker",
            index=1,
            taskAttempt=3,
            exitCode=1,
            spec=ExitSpec(code=1, phrase="P"),
            diagnostics=["d"],
        ),
        Verdict(key=KEY, exitCode=1, spec=ExitSpec(code=1, phrase="P"), diagnostics=["d"], id="v"),
    ),
    ("ignored-kind", messages.JobWaiting(id="w", job=JOB, vc="default", attempt=1, reason="queue"), None),
]


@pytest.mark.parametrize(("message", "expected"), [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES])
def test_bus_events_become_core_events(message, expected) -> None:
    assert from_message(message) == expected


def test_placement_of_an_unknown_job_is_transient() -> None:
    driver = Driver()
    with pytest.raises(Transient):
        driver.handle(Placed(job=JOB, attempt=1, tasks=[TaskPlacement(role="worker", index=0, node="n")]))
    with pytest.raises(Transient):
        driver.stop()
    with pytest.raises(Transient):
        driver.preempt(attempt=1)
    assert driver.core.job(JOB) is None


def test_placement_naming_tasks_the_job_lacks_is_bad_input_and_changes_nothing() -> None:
    driver = Driver()
    driver.submit()
    before = driver.record
    with pytest.raises(BadInput, match=r"ghost\[0\]"):
        driver.handle(Placed(job=JOB, attempt=1, tasks=[TaskPlacement(role="ghost", index=0, node="n")]))
    assert driver.record == before


def test_placement_after_a_stop_while_waiting_is_released_once() -> None:
    driver = Driver()
    driver.submit()
    driver.stop()

    late = driver.place()

    [released] = published(late, messages.JobReleased)
    assert (released.id, released.attempt, released.requeue) == ("alice~train/1/released", 1, False)
    assert started(late) == []
    assert driver.place() == []


def test_placement_of_an_attempt_the_job_never_had_is_released_under_its_own_id() -> None:
    driver = Driver()
    driver.submit()
    late = driver.place(attempt=5, event_id="sched/5")
    [released] = published(late, messages.JobReleased)
    assert released.id == "alice~train/5/released/late/sched/5"
    assert driver.place(attempt=5, event_id="sched/5") == []


def test_placement_of_an_old_attempt_needs_no_release() -> None:
    driver = Driver()
    driver.start()
    driver.confirm_kills(driver.preempt())
    assert driver.place(attempt=1) == []


def test_placement_arriving_while_an_attempt_ends_is_covered_by_its_release() -> None:
    driver = Driver(job_spec(role("worker", 2), gang=False))
    driver.submit()
    driver.place(tasks=[driver.record.current.task("worker", 0)], partial=True)
    driver.running(driver.key("worker", 0))
    asked = driver.stop()

    late = driver.place(tasks=[driver.record.current.task("worker", 1)], partial=True)
    assert started(late) == []

    done = driver.confirm_kills(asked)
    [released] = published(done, messages.JobReleased)
    assert (released.attempt, released.requeue) == (1, False)


def test_fields_at_their_defaults_are_left_out_of_the_job_and_its_attempts() -> None:
    driver = Driver(job_spec(role("worker", 2)))
    driver.submit()

    document = json.loads(encode_job_record(driver.record))

    [attempt] = document["attempts"]
    assert attempt == {"attempt": 1, "createdTime": 1000.0, "tasks": attempt["tasks"]}
    assert "from" not in document["history"][0]
    assert not {"launchedTime", "completedTime", "appExitCode", "stopRequestedBy", "retries"} & set(document)
    assert document["job"] == "alice~train" and document["vc"] == "default"  # no default: always there
    assert decode_job_record(encode_job_record(driver.record)) == driver.record


@pytest.mark.parametrize(
    ("seen_after", "launched_after"),
    [
        pytest.param(-0.3, -0.3, id="held-a-moment: launched when the backend saw it"),
        pytest.param(None, 0.0, id="no-time-given: launched when applied"),
        pytest.param(+5.0, 0.0, id="time-ahead-of-the-clock: launched when applied"),
    ],
)
def test_a_task_and_its_job_are_launched_when_the_backend_saw_the_task_running(
    seen_after: float | None, launched_after: float
) -> None:
    from services.launcher.core.tasks import TaskRunning

    driver = Driver()
    driver.submit()
    driver.place()
    driver.clock.advance(1.0)
    now = driver.clock()
    at = None if seen_after is None else now + seen_after

    driver.handle(TaskRunning(key=driver.key(), at=at))

    record = driver.record
    assert record.state == JobState.RUNNING
    assert record.launchedTime == record.current.launchedTime == record.current.tasks[0].launchedTime == now + launched_after
