"""Every event PAI publishes on the bus, declared once.

Each event is a frozen `msgspec.Struct` tagged with its `Kind` (the subject
middle), so one typed decoder per subject decodes it and handlers `match` on the
class. Every event carries:

- `id`: deterministic (`job/attempt/kind/...`), used as `Nats-Msg-Id` so a
  retried publish is deduplicated by JetStream and a redelivered one is
  recognised by idempotent handlers;
- `job`: the job id `user~name` (node and alert events carry what they are about);
- `cause`: the id of the event that led to this one ("" for user actions);
- `at`: wall-clock seconds when the fact happened.

Evolution: new fields get defaults; no field changes type; a breaking change is a
new subject version (see libs.common.subjects).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Union, get_args

import msgspec

from libs.common.ids import EventId, JobId, NodeName, UserName, VcName
from libs.common.protocol.model import JobSpec
from libs.common.subjects import Kind, alert_subject, dead_letter_subject, job_subject, node_subject


class JobState(StrEnum):
    """OpenPAI's job states."""

    WAITING = "WAITING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


class TaskState(StrEnum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class Reaction(StrEnum):
    """What the launcher does with a failed task (OpenPAI exit spec)."""

    ALWAYS_RETRY = "ALWAYS_RETRY"  # retry, not counted against jobRetryCount
    ALWAYS_BACKOFF_RETRY = "ALWAYS_BACKOFF_RETRY"  # same, after a growing delay
    RETRY_TO_MAX = "RETRY_TO_MAX"  # retry while the budget lasts
    NEVER_RETRY = "NEVER_RETRY"  # fail now, whatever the budget


class ExitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The explanation of one exit, shaped like OpenPAI's exit spec."""

    code: int
    phrase: str
    issuer: str = ""
    causer: str = ""
    type: str = ""
    stage: str = ""
    behavior: str = ""
    reaction: Reaction = Reaction.RETRY_TO_MAX
    reason: str = ""
    repro: list[str] = []
    solution: list[str] = []


class TaskPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where one task instance runs."""

    role: str
    index: int
    node: NodeName
    hostIp: str = "127.0.0.1"
    gpus: list[int] = []  # physical GPU indices on the node -> CUDA_VISIBLE_DEVICES
    leafCells: list[str] = []  # cell addresses, for recovery and display
    skuType: str = ""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    id: EventId
    job: JobId
    cause: EventId = EventId("")
    at: float = 0.0


# --- rest -------------------------------------------------------------------


class JobSubmitted(Event, kw_only=True, frozen=True, tag=Kind.JOB_SUBMITTED.value):
    spec: JobSpec


class StopRequested(Event, kw_only=True, frozen=True, tag=Kind.JOB_STOP_REQUESTED.value):
    vc: VcName
    by: str


class JobDeleted(Event, kw_only=True, frozen=True, tag=Kind.JOB_DELETED.value):
    """A finished job was deleted by its owner or an admin (`by`): each service removes
    its records of it -- rest pai_jobs and pai_secrets, the launcher pai_job_status and
    the task files, the scheduler pai_schedule. `submittedAt` is the deleted job's
    submission time, which tells it from a later job of the same name; the id is
    `<job>/deleted/<submittedAt>`."""

    vc: VcName
    by: str
    submittedAt: float


def job_deleted_id(job: str, submitted_at: float) -> EventId:
    return EventId(f"{job}/deleted/{submitted_at!r}")


class JobArchived(Event, kw_only=True, frozen=True, tag=Kind.JOB_ARCHIVED.value):
    """The history database holds this finished job (its final state applied) and it
    finished over `live_finished_job_seconds` ago, or more than `live_finished_job_max`
    jobs finished after it are live: each service removes its live records
    of it -- rest pai_jobs, the scheduler pai_schedule, the launcher pai_job_status once
    its task files and logs are removed too (retention). Reads of the job then come from
    the history. `submittedAt` tells it from a later job of the same name; the id is
    `<job>/archived/<submittedAt>`."""

    vc: VcName
    submittedAt: float


def job_archived_id(job: str, submitted_at: float) -> EventId:
    return EventId(f"{job}/archived/{submitted_at!r}")


# --- scheduler --------------------------------------------------------------


class JobPlaced(Event, kw_only=True, frozen=True, tag=Kind.JOB_PLACED.value):
    vc: VcName
    attempt: int
    tasks: list[TaskPlacement]
    # The placement of only some tasks (gangAllocation: false); more follow.
    partial: bool = False


class JobWaiting(Event, kw_only=True, frozen=True, tag=Kind.JOB_WAITING.value):
    """An attempt still waits for its cells after some seconds in the queue (5: the scheduler's
    ANNOUNCE_WAIT_AFTER_S), and why: the reason as it then stood (the job's current reason is in its
    API record). Sent once per attempt, and not for an attempt placed within those seconds."""

    vc: VcName
    attempt: int
    reason: str


class PreemptRequested(Event, kw_only=True, frozen=True, tag=Kind.JOB_PREEMPT.value):
    vc: VcName
    attempt: int
    by: JobId  # the job that needs the cells
    reason: str = ""


# --- launcher ---------------------------------------------------------------


class JobStateChanged(Event, kw_only=True, frozen=True, tag=Kind.JOB_STATE.value):
    vc: VcName
    user: UserName
    attempt: int
    state: JobState
    previous: JobState | None = None
    exitCode: int | None = None
    exitSpec: ExitSpec | None = None
    # Seconds from submission to this state (for the submit-to-running histogram).
    sinceSubmit: float | None = None


class ReleasedTask(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    index: int


class JobReleased(Event, kw_only=True, frozen=True, tag=Kind.JOB_RELEASED.value):
    """The launcher no longer uses the cells of this attempt; with `tasks`, of these tasks alone (gangReleaseEnable: false)."""

    vc: VcName
    attempt: int
    # Queue the job again as attempt `attempt + 1` (retry or preemption).
    requeue: bool = False
    tasks: list[ReleasedTask] = []


class TaskStarted(Event, kw_only=True, frozen=True, tag=Kind.TASK_STARTED.value):
    vc: VcName
    attempt: int
    role: str
    index: int
    taskAttempt: int = 0
    node: NodeName = NodeName("")


class TaskExited(Event, kw_only=True, frozen=True, tag=Kind.TASK_EXITED.value):
    vc: VcName
    attempt: int
    role: str
    index: int
    taskAttempt: int = 0
    exitCode: int
    signal: int | None = None
    # What the platform saw (e.g. "OOMKilled", "Evicted", "NodeLost", "Stopped",
    # "Preempted"), matched by platform-log rules.
    platformReason: str = ""
    platformMessage: str = ""
    userLogTail: str = ""  # at most the last 64 KiB of the task's output
    logPath: str = ""
    memoryPeakMB: int | None = None


class TaskVerdict(Event, kw_only=True, frozen=True, tag=Kind.TASK_VERDICT.value):
    """The runtime's explanation of a failed task exit (exit code not 0); an exit 0 gets none."""

    vc: VcName
    attempt: int
    role: str
    index: int
    taskAttempt: int = 0
    exitCode: int
    spec: ExitSpec
    diagnostics: list[str] = []  # the log lines that matched


class _TerminalEvent(Event, kw_only=True, frozen=True):
    """What both ends of a browser terminal session say: the session `session` that `by`
    opened in task `role`[`index`] of the job's attempt `attempt`. (Not an event of its
    own: its fields come first in each, as they would written out in both.)"""

    vc: VcName
    attempt: int
    role: str
    index: int
    by: str
    session: str


class TerminalOpened(_TerminalEvent, kw_only=True, frozen=True, tag=Kind.TERMINAL_OPENED.value):
    """`by` opened a browser terminal in a running task (`mode`: "process", "container"
    or "pod", how the shell was entered). The id is `<job>/terminal/<session>/opened`."""

    mode: str = ""


class TerminalClosed(_TerminalEvent, kw_only=True, frozen=True, tag=Kind.TERMINAL_CLOSED.value):
    """The terminal session `session` ended after `seconds`; `reason` says how (the shell
    exited, the browser closed it, idle past `terminal_idle_seconds`, the task ended, or
    "the launcher restarted: ..." for a session cut by the launcher's death, closed by the
    next launcher and measured to the last moment it was known to hold the session open).
    The id is `<job>/terminal/<session>/closed`, one close per session."""

    openedAt: float
    seconds: float
    reason: str = ""


def terminal_event_id(job: str, session: str, what: str) -> EventId:
    return EventId(f"{job}/terminal/{session}/{what}")


# --- monitor ----------------------------------------------------------------


class NodeCondition(StrEnum):
    """Why a node is unhealthy; a node may have several at once."""

    LOST = "lost"  # its agent has been silent too long: its tasks are ended and retried
    GPU_ECC_ERROR = "gpu_ecc_error"  # a GPU reported an uncorrectable (double-bit) ECC error
    DISK_PRESSURE = "disk_pressure"  # the data disk is nearly full
    MEMORY_PRESSURE = "memory_pressure"  # almost no memory left
    CORDONED = "cordoned"  # an admin took it out of scheduling


class NodeStatus(Event, kw_only=True, frozen=True, tag=Kind.NODE_STATUS.value):
    node: NodeName
    healthy: bool
    reason: str = ""
    # NodeCondition values; empty when healthy. Only LOST ends the node's tasks;
    # the others only keep new work away.
    conditions: list[str] = []

    @property
    def lost(self) -> bool:
        return not self.healthy and NodeCondition.LOST in self.conditions


class NodeCordonChanged(Event, kw_only=True, frozen=True, tag=Kind.NODE_CORDON.value):
    """An admin cordoned (`cordoned`) or uncordoned a node; `job` is ""."""

    node: NodeName
    cordoned: bool
    reason: str = ""
    by: str = ""


class AlertFiring(Event, kw_only=True, frozen=True, tag=Kind.ALERT_FIRING.value):
    """An alert rule's condition has held for its `for` duration (docs/alerts.md).

    `labels` say what it is about: `alertname`, `severity`, and `node` (and
    `gpu`), `job`, `user` and `vc`, or `service`, plus the rule's own labels.
    `job` is the job's id for a job alert, "" otherwise. A rule's alert has
    the id `<rule>/<subject>@<startsAt>/firing`; the list of alerts is
    `GET /api/v2/alerts`. A dead-lettered event raises one too (rule
    `EventDeadLettered`, id `<event id>/alert`), which has no resolve."""

    rule: str
    severity: str = "warning"
    summary: str = ""
    labels: dict[str, str] = {}


class AlertResolved(Event, kw_only=True, frozen=True, tag=Kind.ALERT_RESOLVED.value):
    """The alert with the same `rule` and `labels` no longer holds; its id is the
    firing one's with `/resolved`."""

    rule: str
    summary: str = ""
    labels: dict[str, str] = {}


# --- any consumer -------------------------------------------------------------


class EventDeadLettered(Event, kw_only=True, frozen=True, tag=Kind.EVENT_DEAD_LETTERED.value):
    """A consumer terminated an event that failed the same way on every one of
    its deliveries (a poison message), so that the events behind it flow again.

    `job` is the job the event was about ("" for node and alert events); the
    launcher ends that job FAILED with an exit spec saying why, and the monitor
    raises an alert.
    """

    consumer: str  # the durable consumer that gave up
    eventId: str
    eventKind: str
    subject: str
    deliveries: int
    reason: str  # the last failure, for a person


AnyEvent = (
    JobSubmitted
    | StopRequested
    | JobDeleted
    | JobArchived
    | JobPlaced
    | JobWaiting
    | PreemptRequested
    | JobStateChanged
    | JobReleased
    | TaskStarted
    | TaskExited
    | TaskVerdict
    | TerminalOpened
    | TerminalClosed
    | NodeStatus
    | NodeCordonChanged
    | AlertFiring
    | AlertResolved
    | EventDeadLettered
)

EVENT_TYPES: dict[Kind, type[Event]] = {
    Kind(t.__struct_config__.tag): t for t in get_args(AnyEvent)
}


# Each event type's kind, looked up once: `Kind(tag)` costs about as much as the rest
# of `subject_of`, which every publication calls.
_KIND_OF_TYPE: dict[type, Kind] = {}


def subject_of(event: Event) -> str:
    kind = _KIND_OF_TYPE.get(type(event))
    if kind is None:
        kind = _KIND_OF_TYPE[type(event)] = Kind(str(event.__struct_config__.tag))
    match event:
        case NodeStatus(node=node) | NodeCordonChanged(node=node):
            return node_subject(kind, node)
        case AlertFiring(rule=rule) | AlertResolved(rule=rule):
            return alert_subject(kind, rule)
        case EventDeadLettered(consumer=consumer):
            return dead_letter_subject(kind, consumer)
        case JobSubmitted(spec=spec):
            return job_subject(kind, spec.virtualCluster, event.job)
        case _:
            return job_subject(kind, event.vc, event.job)  # type: ignore[attr-defined]


def task_event_id(job: str, attempt: int, role: str, index: int, task_attempt: int, what: str) -> EventId:
    return EventId(f"{job}/{attempt}/{role}/{index}/{task_attempt}/{what}")


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> AnyEvent:
    """Decode any event; raises msgspec.ValidationError/DecodeError on bad input."""
    return _decoder.decode(data)


def decoder_for(*types: type[Event]) -> msgspec.json.Decoder:
    """A decoder that accepts only the given event types (one per consumer)."""
    if len(types) == 1:
        return msgspec.json.Decoder(types[0])
    return msgspec.json.Decoder(Union[types])  # noqa: UP007 (a union of types known at run time)


# --- a browser terminal's session, over request/reply and its own subjects ---------
# (libs/common/subjects.py: TERMINAL_*; not events: nothing of it is stored but the
# TerminalOpened and TerminalClosed above.)


class TerminalOpen(msgspec.Struct, frozen=True, kw_only=True):
    """rest -> launcher (TERMINAL_OPEN_SUBJECT): open a shell in a running task. rest
    has checked `by` may (owner or admin) and subscribed to the session's output."""

    session: str  # random, rest's: names the session's subjects
    job: JobId
    role: str
    index: int
    by: str
    cols: int = 80
    rows: int = 24


class TerminalOpenReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    # Why not, for a person; `status` the HTTP status rest answers with (404 no such
    # task, 409 not running, 503 too many sessions or the backend cannot).
    error: str = ""
    status: int = 0
    mode: str = ""


class TerminalInput(msgspec.Struct, frozen=True, kw_only=True):
    """rest -> launcher on the session's input subject: keys typed, a new size, the end,
    or nothing but being there (`ping`: the browser is still connected)."""

    data: bytes = b""
    cols: int = 0  # with rows: the terminal was resized
    rows: int = 0
    close: bool = False


class TerminalOutput(msgspec.Struct, frozen=True, kw_only=True):
    """launcher -> rest on the session's output subject: what the shell wrote, or its end."""

    data: bytes = b""
    closed: bool = False
    reason: str = ""
