"""What the launcher core reacts to.

Bus events are translated by `from_message`; backend events (`TaskRunning`,
`TaskFinished`) are the backend interface's own Structs; `BackoffElapsed` comes
from the shell's timers (ordered by a `StartTimer` action).

`id` is the id of the bus event (or "" when there is none); it becomes the
`cause` of what the core publishes in response.
"""

from __future__ import annotations

import msgspec

from libs.common import messages
from libs.common.ids import EventId, JobId
from libs.common.messages import ExitSpec, TaskPlacement
from libs.common.protocol.model import JobSpec
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning


class Submitted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job: JobId
    spec: JobSpec
    at: float
    id: EventId = EventId("")


class Placed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job: JobId
    attempt: int
    tasks: list[TaskPlacement]
    # Only some tasks are placed (gangAllocation: false); more placements follow.
    partial: bool = False
    id: EventId = EventId("")


class PreemptRequested(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job: JobId
    attempt: int
    by: str
    reason: str = ""
    id: EventId = EventId("")


class StopRequested(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job: JobId
    by: str
    id: EventId = EventId("")


class Verdict(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The runtime's explanation of a failed task attempt."""

    key: TaskKey
    exitCode: int
    spec: ExitSpec
    diagnostics: list[str] = []
    id: EventId = EventId("")


class DeadLettered(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A service gave up on one of the job's events (see libs.common.bus)."""

    job: JobId
    consumer: str
    eventKind: str
    reason: str
    id: EventId = EventId("")


class BackoffElapsed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job: JobId
    attempt: int


class LogsPruned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The shell removed the finished job's task directories and logs (retention.py)."""

    job: JobId
    at: float


class Archived(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The history holds the finished job (JobArchived): its record leaves pai_job_status
    once its task files and logs are removed too (retention.py), at once if they are."""

    job: JobId
    at: float


class PortsBusy(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The shell found ports it was about to hand to tasks in use on their node
    (ports.py) and held back the starts of those tasks of the attempt (`tasks`):
    the core skips those ports and starts the tasks with others."""

    job: JobId
    attempt: int
    tasks: list[TaskKey]
    busy: dict[str, list[int]]  # node -> ports found in use


LauncherEvent = (
    Submitted
    | Placed
    | PreemptRequested
    | StopRequested
    | Verdict
    | DeadLettered
    | BackoffElapsed
    | TaskRunning
    | TaskFinished
    | LogsPruned
    | Archived
    | PortsBusy
)


def from_message(message: messages.Event) -> LauncherEvent | None:
    """The core event for a bus event, or None for a kind the launcher ignores."""
    match message:
        case messages.JobSubmitted(spec=spec):
            return Submitted(job=message.job, spec=spec, at=message.at, id=message.id)
        case messages.JobPlaced(attempt=attempt, tasks=tasks, partial=partial):
            return Placed(job=message.job, attempt=attempt, tasks=tasks, partial=partial, id=message.id)
        case messages.PreemptRequested(attempt=attempt, by=by, reason=reason):
            return PreemptRequested(job=message.job, attempt=attempt, by=by, reason=reason, id=message.id)
        case messages.StopRequested(by=by):
            return StopRequested(job=message.job, by=by, id=message.id)
        case messages.EventDeadLettered(consumer=consumer, eventKind=kind, reason=reason) if message.job:
            return DeadLettered(job=message.job, consumer=consumer, eventKind=kind, reason=reason, id=message.id)
        case messages.TaskVerdict():
            key = TaskKey(
                job=message.job,
                attempt=message.attempt,
                role=message.role,
                index=message.index,
                taskAttempt=message.taskAttempt,
            )
            return Verdict(
                key=key,
                exitCode=message.exitCode,
                spec=message.spec,
                diagnostics=message.diagnostics,
                id=message.id,
            )
    return None
