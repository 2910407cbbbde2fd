"""Events -> row operations: the history projection's pure core (no I/O).

`project(seq, event)` says what one event does to the tables, as `Upsert`s and
`Delete`s the store applies in one transaction per batch. Every operation is
idempotent, and an update carrying a sequence (`guard`) applies only to a row an
older event wrote, so:

- a replayed event (redelivered after a crash before its ack) changes nothing;
- events applied out of order (rest replicas sharing the durable each take a
  batch) never let an older state overwrite a newer one;
- a state event that overtakes its job's submission makes a placeholder row the
  submission then completes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.ids import split_job_id
from libs.common.messages import (
    AnyEvent,
    JobDeleted,
    JobPlaced,
    JobState,
    JobStateChanged,
    JobSubmitted,
    JobWaiting,
    PreemptRequested,
    StopRequested,
    TaskExited,
    TaskStarted,
    TaskState,
    TaskVerdict,
    TerminalClosed,
    TerminalOpened,
)
from libs.common.subjects import Kind

# Texts from events (reasons, messages) are cut here: a row is for a person to read.
MAX_TEXT = 2000
# The event kinds the projection reads (the consumer's filter).
KINDS: tuple[Kind, ...] = (
    Kind.JOB_SUBMITTED,
    Kind.JOB_STOP_REQUESTED,
    Kind.JOB_PLACED,
    Kind.JOB_WAITING,
    Kind.JOB_PREEMPT,
    Kind.JOB_STATE,
    Kind.JOB_DELETED,
    Kind.TASK_STARTED,
    Kind.TASK_EXITED,
    Kind.TASK_VERDICT,
    Kind.TERMINAL_OPENED,
    Kind.TERMINAL_CLOSED,
)
TYPES = (JobSubmitted, StopRequested, JobPlaced, JobWaiting, PreemptRequested, JobStateChanged, JobDeleted,
         TaskStarted, TaskExited, TaskVerdict, TerminalOpened, TerminalClosed)


class Upsert(msgspec.Struct, frozen=True, kw_only=True):
    """Insert the row `key | values | on_insert`; if it exists, set `values` (and
    `coalesce` columns only where the new value is not null) -- when `guard` names a
    sequence column, only if the row's is lower than `values[guard]`. No `values`
    and no `coalesce`: insert once, never update."""

    table: str
    key: dict[str, Any]
    values: dict[str, Any] = {}
    coalesce: dict[str, Any] = {}
    on_insert: dict[str, Any] = {}
    guard: str | None = None


class Delete(msgspec.Struct, frozen=True, kw_only=True):
    """Delete the rows of `table` matching `key` that events older than `before_seq` wrote
    (`seq_column`; "": every matching row); rows written by later events (a new job of
    the same name) stay."""

    table: str
    key: dict[str, Any]
    seq_column: str
    before_seq: int


Operation = Upsert | Delete

_spec_encoder = msgspec.json.Encoder()


def _text(value: str) -> str:
    return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"


def _job_names(job: str) -> tuple[str, str]:
    try:
        return split_job_id(job)
    except ValueError:
        return "", job


def _event_row(seq: int, event: AnyEvent, *, type_: str, reason: str, message: str, attempt: int | None,
               subject: str | None = None) -> Upsert:
    kind = str(event.__struct_config__.tag)
    return Upsert(table="events", key={"id": event.id}, on_insert={
        "job": event.job, "seq": seq, "kind": kind, "at": event.at, "attempt": attempt, "type": type_,
        "reason": reason, "message": _text(message), "subject": subject or event.job})


def _task_state(event: TaskExited) -> TaskState:
    if event.exitCode == 0:
        return TaskState.SUCCEEDED
    if event.platformReason in ("Stopped", "Preempted"):
        return TaskState.STOPPED
    return TaskState.FAILED


def project(seq: int, event: AnyEvent) -> list[Operation]:
    """What the event at stream sequence `seq` does to the history tables."""
    job = event.job
    match event:
        case JobSubmitted(spec=spec):
            user, name = _job_names(job)
            return [
                Upsert(table="jobs", key={"id": job}, values={
                    "user": user, "name": name, "vc": spec.virtualCluster, "priority_class": spec.priorityClass,
                    "priority": spec.priority, "submitted_at": event.at, "spec": _spec_encoder.encode(spec).decode(),
                    "submitted_seq": seq, "task_count": spec.task_count,
                    "gpu_count": sum(r.instances * r.resources.gpu for r in spec.taskRoles),
                }, on_insert={"state": JobState.WAITING.value, "state_seq": seq}),
                _event_row(seq, event, type_="Normal", reason="Submitted", attempt=1,
                           message=f"submitted to virtual cluster {spec.virtualCluster}"),
            ]
        case JobStateChanged():
            user, name = _job_names(job)
            final = event.state.is_final
            values: dict[str, Any] = {"state": event.state.value, "state_seq": seq, "attempt": event.attempt,
                                      "retries": max(event.attempt - 1, 0), "vc": event.vc,
                                      "completed_at": event.at if final else None}
            coalesce: dict[str, Any] = {"started_at": event.at if event.state == JobState.RUNNING else None,
                                        "exit_code": event.exitCode,
                                        "exit_phrase": event.exitSpec.phrase if event.exitSpec else None}
            if event.state != JobState.WAITING:
                values["waiting_reason"] = None
            previous = event.previous.value if event.previous else "new"
            bad = event.state in (JobState.FAILED, JobState.STOPPED)
            message = f"{previous} -> {event.state.value}"
            if event.exitSpec is not None:
                message += f": {event.exitSpec.phrase}"
            elif event.exitCode is not None:
                message += f": exit code {event.exitCode}"
            return [
                Upsert(table="jobs", key={"id": job}, values=values, coalesce=coalesce, guard="state_seq",
                       on_insert={"user": user or event.user, "name": name}),
                Upsert(table="attempts", key={"job": job, "attempt": event.attempt}, values={
                    "state": event.state.value, "state_seq": seq, "completed_at": event.at if final else None,
                }, coalesce={"started_at": event.at if event.state == JobState.RUNNING else None,
                             "exit_code": event.exitCode,
                             "exit_phrase": event.exitSpec.phrase if event.exitSpec else None},
                    on_insert={"created_at": event.at}, guard="state_seq"),
                _event_row(seq, event, type_="Warning" if bad else "Normal", reason=event.state.value.capitalize(),
                           message=message, attempt=event.attempt),
            ]
        case JobWaiting():
            return [
                Upsert(table="jobs", key={"id": job}, coalesce={"waiting_reason": _text(event.reason)},
                       on_insert=_placeholder(job, event.vc)),
                _event_row(seq, event, type_="Normal", reason="Waiting", message=event.reason, attempt=event.attempt),
            ]
        case JobPlaced():
            nodes = sorted({t.node for t in event.tasks})
            return [_event_row(seq, event, type_="Normal", reason="Placed", attempt=event.attempt,
                               message=f"{len(event.tasks)} task(s) placed on {', '.join(nodes)}"
                                       + (" (more to come)" if event.partial else ""))]
        case PreemptRequested():
            why = f": {event.reason}" if event.reason else ""
            return [_event_row(seq, event, type_="Warning", reason="Preempted", attempt=event.attempt,
                               message=f"preempted for {event.by}{why}")]
        case StopRequested():
            return [
                Upsert(table="jobs", key={"id": job}, coalesce={"stop_requested_by": event.by},
                       on_insert=_placeholder(job, event.vc)),
                _event_row(seq, event, type_="Normal", reason="StopRequested", attempt=None,
                           message=f"stop requested by {event.by}"),
            ]
        case TaskStarted():
            key = _task_key(event)
            return [Upsert(table="tasks", key=key, values={"state": TaskState.RUNNING.value, "state_seq": seq},
                           coalesce={"node": event.node or None, "started_at": event.at}, guard="state_seq")]
        case TaskExited():
            key = _task_key(event)
            state = _task_state(event)
            ops: list[Operation] = [Upsert(
                table="tasks", key=key, values={"state": state.value, "state_seq": seq},
                coalesce={"completed_at": event.at, "exit_code": event.exitCode,
                          "platform_reason": event.platformReason or None}, guard="state_seq")]
            if event.exitCode != 0:
                what = f" ({event.platformReason})" if event.platformReason else ""
                ops.append(_event_row(seq, event, type_="Warning", reason="TaskFailed", attempt=event.attempt,
                                      message=f"task {event.role}[{event.index}] exited with code {event.exitCode}{what}",
                                      subject=f"{job}/{event.role}/{event.index}"))
            return ops
        case TaskVerdict(spec=spec):
            return [
                # The explanation: set whenever it comes (the runtime judges each exit once).
                Upsert(table="tasks", key=_task_key(event),
                       coalesce={"exit_spec_code": spec.code, "exit_phrase": spec.phrase},
                       on_insert={"state": TaskState.FAILED.value}),
                _event_row(seq, event, type_="Warning", reason="TaskExplained", attempt=event.attempt,
                           message=f"task {event.role}[{event.index}]: {spec.phrase}"
                                   + (f": {spec.reason}" if spec.reason else ""),
                           subject=f"{job}/{event.role}/{event.index}"),
            ]
        case TerminalOpened():
            how = f" ({event.mode})" if event.mode else ""
            return [_event_row(seq, event, type_="Normal", reason="TerminalOpened", attempt=event.attempt,
                               message=f"{event.by} opened a terminal in task {event.role}[{event.index}]{how}",
                               subject=f"{job}/{event.role}/{event.index}")]
        case TerminalClosed():
            why = f": {event.reason}" if event.reason else ""
            return [_event_row(seq, event, type_="Normal", reason="TerminalClosed", attempt=event.attempt,
                               message=f"the terminal {event.by} opened in task {event.role}[{event.index}] closed "
                                       f"after {_seconds(event.seconds)}{why}",
                               subject=f"{job}/{event.role}/{event.index}")]
        case JobDeleted():
            # The job as its owner deleted it; a later job of the same name (its rows written
            # by later events) stays.
            return [
                Delete(table="events", key={"job": job}, seq_column="seq", before_seq=seq),
                Delete(table="tasks", key={"job": job}, seq_column="state_seq", before_seq=seq),
                Delete(table="attempts", key={"job": job}, seq_column="state_seq", before_seq=seq),
                Delete(table="job_tags", key={"job": job}, seq_column="", before_seq=seq),
                Delete(table="jobs", key={"id": job}, seq_column="submitted_seq", before_seq=seq),
            ]
    return []


def _seconds(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m {whole % 60}s" if whole >= 60 else f"{whole}s"


def _placeholder(job: str, vc: str) -> dict[str, Any]:
    user, name = _job_names(job)
    return {"user": user, "name": name, "vc": vc, "state": JobState.WAITING.value}


def _task_key(event: TaskStarted | TaskExited | TaskVerdict) -> dict[str, Any]:
    return {"job": event.job, "attempt": event.attempt, "role": event.role, "idx": event.index,
            "task_attempt": event.taskAttempt}


def project_batch(batch: list[tuple[int, AnyEvent]]) -> list[Operation]:
    """Every operation of a batch of (sequence, event), in stream order."""
    return [op for seq, event in batch for op in project(seq, event)]
