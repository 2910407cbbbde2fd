"""The events the launcher publishes, with their deterministic ids.

Ids (used as `Nats-Msg-Id`, so a repeated publication is deduplicated):
- job state:  `{job}/{attempt}/state/{STATE}` (each state at most once per attempt);
- release:    `{job}/{attempt}/released`, or `{job}/{attempt}/released/late/{placement id}`
              when answering a placement of an attempt the job never had;
- task facts: `messages.task_event_id(job, attempt, role, index, taskAttempt, "started"|"exited")`.
"""

from __future__ import annotations

from typing import TypedDict

from libs.common import messages
from libs.common.ids import EventId, JobId, NodeName, VcName
from libs.common.messages import JobState
from libs.common.records import JobRecord
from services.launcher.core.tasks import TaskFinished, TaskKey


def state_id(job: str, attempt: int, state: JobState) -> EventId:
    return EventId(f"{job}/{attempt}/state/{state}")


def released_id(job: str, attempt: int) -> EventId:
    return EventId(f"{job}/{attempt}/released")


def task_released_id(job: str, attempt: int, role: str, index: int) -> EventId:
    return EventId(f"{released_id(job, attempt)}/task/{role}/{index}")


def late_released_id(job: str, attempt: int, placement_id: str) -> EventId:
    return EventId(f"{released_id(job, attempt)}/late/{placement_id}")


def task_id(key: TaskKey, what: str) -> EventId:
    return messages.task_event_id(key.job, key.attempt, key.role, key.index, key.taskAttempt, what)


def state_changed(record: JobRecord, *, previous: JobState | None, at: float, cause: EventId) -> messages.JobStateChanged:
    """The job's current state (already in `record`), announced."""
    final = record.state.is_final
    return messages.JobStateChanged(
        id=state_id(record.job, record.attempt, record.state),
        job=record.job,
        cause=cause,
        at=at,
        vc=record.vc,
        user=record.user,
        attempt=record.attempt,
        state=record.state,
        previous=previous,
        exitCode=record.appExitCode if final else None,
        exitSpec=record.appExitSpec if final else None,
        sinceSubmit=max(0.0, at - record.createdTime),
    )


def released(
    record: JobRecord, *, attempt: int, requeue: bool, event_id: EventId, at: float, cause: EventId
) -> messages.JobReleased:
    return messages.JobReleased(
        id=event_id, job=record.job, cause=cause, at=at, vc=record.vc, attempt=attempt, requeue=requeue
    )


def task_released(record: JobRecord, *, attempt: int, role: str, index: int, at: float,
                  cause: EventId) -> messages.JobReleased:
    """One task's cells, free while its attempt goes on (its role's gangReleaseEnable is false)."""
    return messages.JobReleased(
        id=task_released_id(record.job, attempt, role, index), job=record.job, cause=cause, at=at, vc=record.vc,
        attempt=attempt, tasks=[messages.ReleasedTask(role=role, index=index)],
    )


class _TaskEventFields(TypedDict):
    id: EventId
    job: JobId
    at: float
    vc: VcName
    attempt: int
    role: str
    index: int
    taskAttempt: int


def _task_event_fields(record: JobRecord, key: TaskKey, what: str, *, at: float) -> _TaskEventFields:
    """What every task event carries: its id, and which task attempt of which job."""
    return {
        "id": task_id(key, what),
        "job": record.job,
        "at": at,
        "vc": record.vc,
        "attempt": key.attempt,
        "role": key.role,
        "index": key.index,
        "taskAttempt": key.taskAttempt,
    }


def task_started(record: JobRecord, key: TaskKey, *, node: NodeName, at: float) -> messages.TaskStarted:
    return messages.TaskStarted(**_task_event_fields(record, key, "started", at=at), node=node)


def task_exited(record: JobRecord, finished: TaskFinished, *, at: float) -> messages.TaskExited:
    return messages.TaskExited(
        **_task_event_fields(record, finished.key, "exited", at=at),
        exitCode=finished.exitCode,
        signal=finished.signal,
        platformReason=finished.platformReason,
        platformMessage=finished.platformMessage,
        userLogTail=finished.userLogTail,
        logPath=finished.logPath,
        memoryPeakMB=finished.memoryPeakMB,
    )
