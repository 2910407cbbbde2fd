"""Every event delivered twice gives its actions once."""

from __future__ import annotations

import pytest

from libs.common.messages import Reaction, TaskPlacement
from services.launcher.core import (
    BackoffElapsed,
    LauncherCore,
    Placed,
    PreemptRequested,
    StopRequested,
    Submitted,
    Verdict,
)
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning
from tests.unit.launcher.builders import JOB, Clock, exit_spec, job_spec, role


def key(role_name: str = "worker", index: int = 0, attempt: int = 1, task_attempt: int = 0) -> TaskKey:
    return TaskKey(job=JOB, attempt=attempt, role=role_name, index=index, taskAttempt=task_attempt)


def placed(attempt: int = 1, indices: tuple[int, ...] = (0, 1)) -> Placed:
    return Placed(
        job=JOB,
        attempt=attempt,
        tasks=[TaskPlacement(role="worker", index=i, node=f"n{i}", hostIp=f"10.0.0.{i}") for i in indices],
        partial=len(indices) < 2,
        id=f"placed/{attempt}/{indices}",
    )


def verdict(reaction: Reaction, k: TaskKey) -> Verdict:
    return Verdict(key=k, exitCode=1, spec=exit_spec(reaction), id=f"verdict/{k.slug}")


TWO = job_spec(role("worker", 2), job_retry_count=1)
SUBMIT = Submitted(job=JOB, spec=TWO, at=1.0, id="submitted")
RUN_BOTH = [TaskRunning(key=key(index=0)), TaskRunning(key=key(index=1))]

SCENARIOS: list[tuple[str, list[object]]] = [
    (
        "success",
        [
            SUBMIT,
            placed(),
            *RUN_BOTH,
            TaskFinished(key=key(index=0), exitCode=0),
            TaskFinished(key=key(index=1), exitCode=0),
        ],
    ),
    (
        "failure-then-retry",
        [
            SUBMIT,
            placed(),
            *RUN_BOTH,
            TaskFinished(key=key(index=0), exitCode=1),
            verdict(Reaction.RETRY_TO_MAX, key(index=0)),
            TaskFinished(key=key(index=1), exitCode=143),
            placed(attempt=2),
            TaskRunning(key=key(index=0, attempt=2)),
        ],
    ),
    (
        "stop",
        [
            SUBMIT,
            placed(),
            *RUN_BOTH,
            StopRequested(job=JOB, by="alice", id="stop"),
            TaskFinished(key=key(index=0), exitCode=143),
            TaskFinished(key=key(index=1), exitCode=143),
        ],
    ),
    (
        "preempt",
        [
            SUBMIT,
            placed(),
            *RUN_BOTH,
            PreemptRequested(job=JOB, attempt=1, by="bob~x", id="preempt"),
            TaskFinished(key=key(index=0), exitCode=143),
            TaskFinished(key=key(index=1), exitCode=143),
        ],
    ),
    (
        "backoff",
        [
            SUBMIT,
            placed(),
            *RUN_BOTH,
            TaskFinished(key=key(index=0), exitCode=1),
            verdict(Reaction.ALWAYS_BACKOFF_RETRY, key(index=0)),
            TaskFinished(key=key(index=1), exitCode=143),
            placed(attempt=2),
            BackoffElapsed(job=JOB, attempt=2),
        ],
    ),
    (
        "task-retry",
        [
            Submitted(job=JOB, spec=job_spec(role("worker", 2, task_retry_count=1), gang=False), at=1.0),
            placed(indices=(0,)),
            TaskRunning(key=key(index=0)),
            placed(indices=(1,)),
            TaskFinished(key=key(index=0), exitCode=1),
            verdict(Reaction.RETRY_TO_MAX, key(index=0)),
            TaskRunning(key=key(index=0, task_attempt=1)),
        ],
    ),
    ("late-placement", [SUBMIT, StopRequested(job=JOB, by="alice", id="stop"), placed(), placed(attempt=9)]),
]


@pytest.mark.parametrize("events", [s[1] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_a_redelivered_event_changes_nothing(events) -> None:
    core = LauncherCore(Clock())
    for event in events:
        first = core.handle(event)
        record = core.job(JOB)
        assert first, f"{event!r} should have done something"
        assert core.handle(event) == [], f"{type(event).__name__} redelivered acted again"
        assert core.job(JOB) == record
        core.validate_state()


@pytest.mark.parametrize("events", [s[1] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_duplicates_within_one_call_act_once(events) -> None:
    once, twice = LauncherCore(Clock()), LauncherCore(Clock())
    for event in events:
        assert twice.handle(event, event) == once.handle(event)
    assert twice.job(JOB) == once.job(JOB)
