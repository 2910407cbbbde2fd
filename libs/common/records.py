"""The job status document: what the launcher knows about one job.

The launcher is the only writer; it stores one `JobRecord` per job in the KV
bucket `pai_job_status` (key `user.name`, see `libs.common.ids.job_key`), and rest
reads it to answer `GET /api/v2/jobs/{user}~{name}`. Field names follow
OpenPAI's job status where one exists (`appExitCode`, `appExitSpec`,
`appExitTriggerTaskRoleName`, `createdTime`, `completedTime`, ...).

The document is complete enough for the launcher to rebuild its whole state after
a restart: every attempt with every task, where each task was placed, which
ports it holds, whether its start was ordered, whether the launcher ordered it
killed and whether its exit still waits for the runtime's verdict.

Times are wall-clock seconds. KV revisions are not part of the document: the
service shell handles them.

Size: every write of a record is stored by NATS and decoded by rest's watch, so
the record, its attempts, endings, transitions and tasks leave their fields at
defaults out (decoding fills them in: a WAITING job's record has no `state`).
Every reader decodes with a typed struct whose defaults match these (rest's
`StatusBrief`, the monitor's `StoredJob`).

Schema evolution: new fields get defaults; no field changes type.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from libs.common.ids import JobId, NodeName, UserName, VcName
from libs.common.messages import AnyEvent, ExitSpec, JobState, TaskState
from libs.common.protocol.model import JobSpec


class Transition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One change of the job's state, kept in `JobRecord.history`."""

    at: float
    from_: JobState | None = msgspec.field(default=None, name="from")
    to: JobState
    why: str = ""
    attempt: int = 1


class TaskAttemptSummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A finished earlier attempt of one task (retried alone, `taskRetryCount`)."""

    taskAttempt: int
    state: TaskState
    node: str | None = None
    launchedTime: float | None = None
    completedTime: float | None = None
    exitCode: int | None = None
    exitSpec: ExitSpec | None = None
    diagnostics: list[str] = []
    logPath: str = ""


class TaskRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One task instance (`role`, `index`) within one job attempt.

    Fields at their defaults are left out of the stored document (decoding fills
    them in): a 512-task attempt must fit NATS's 1 MiB message (see `TaskBrief`)."""

    role: str
    index: int
    taskAttempt: int = 0
    state: TaskState = TaskState.WAITING
    # Placement (from the scheduler); None until placed.
    node: NodeName | None = None
    hostIp: str | None = None
    gpus: list[int] = []
    leafCells: list[str] = []
    skuType: str = ""
    ports: dict[str, list[int]] = {}
    createdTime: float = 0.0
    launchedTime: float | None = None
    completedTime: float | None = None
    exitCode: int | None = None
    exitSpec: ExitSpec | None = None
    diagnostics: list[str] = []
    platformReason: str = ""
    logPath: str = ""
    # What the backend said when the task started, e.g. which resource limits are
    # in force ("limits: cgroup v2", "limits: rlimit ...").
    runtimeDetail: str = ""
    # "container" (in the job's image) or "process" (on the host), as the backend said.
    runtimeMode: str = ""
    retries: int = 0  # task retries used (taskRetryCount)
    taskAttempts: list[TaskAttemptSummary] = []
    # Lifecycle bookkeeping, needed to recover after a launcher restart:
    startRequested: bool = False  # a StartTask was ordered for `taskAttempt`
    killReason: str | None = None  # the launcher ordered this task attempt killed
    verdictPending: bool = False  # failed; the runtime's verdict has not come yet

    @property
    def exited(self) -> bool:
        """The process of the current task attempt is gone (its exit is recorded)."""
        return self.completedTime is not None

    @property
    def live(self) -> bool:
        """Ordered to start and not yet known to have exited: it may hold resources."""
        return self.startRequested and self.completedTime is None

    @property
    def placed(self) -> bool:
        return self.node is not None


class TaskBrief(msgspec.Struct, frozen=True, array_like=True):
    """One task of an older, compacted attempt, in a few bytes.

    A job's document is one KV value, and NATS refuses a value over its max
    payload (1 MiB by default): a 512-task job retried a few times would not fit
    with every attempt in full. So only the latest attempt keeps every
    `TaskRecord`; an older one keeps its own outcome, the full records of the
    tasks that failed by themselves (what explains it), and one brief per task
    (services/launcher/core/compaction.py)."""

    role: str
    index: int
    state: TaskState
    exitCode: int | None = None
    taskAttempt: int = 0
    started: bool = False  # ordered to start: it has a log


class EndOutcome(StrEnum):
    """How an attempt ends once its remaining tasks are gone."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    RETRY = "RETRY"  # a new attempt follows (after a backoff if `backoffSeconds`)
    PREEMPTED = "PREEMPTED"  # a new attempt follows, not counted as a retry


class AttemptEnding(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The decided end of an attempt, applied once none of its tasks is live.

    OpenPAI keeps a job RUNNING while the pods of a completing attempt are being
    deleted; we do the same so that cells are released only when no process of
    the attempt can still use them.
    """

    outcome: EndOutcome
    decidedTime: float
    reason: str  # becomes AttemptRecord.endReason
    exitCode: int | None = None
    exitSpec: ExitSpec | None = None
    diagnostics: list[str] = []
    triggerTaskRoleName: str | None = None
    triggerTaskIndex: int | None = None
    retryCounted: bool = False
    # A retry jobRetryCount does not count (it uses the platform's retry cap).
    platformRetry: bool = False
    backoffSeconds: float | None = None
    preemptedBy: str | None = None
    cause: str = ""  # id of the event that decided it


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    attempt: int
    # WAITING/RUNNING while current; SUCCEEDED, FAILED (also when retried) or
    # STOPPED (also when preempted) once ended.
    state: JobState = JobState.WAITING
    createdTime: float = 0.0
    launchedTime: float | None = None
    completedTime: float | None = None
    tasks: list[TaskRecord] = []
    exitCode: int | None = None
    exitSpec: ExitSpec | None = None
    # "succeeded", "failed", "stopped by alice", "preempted by bob~big",
    # "retry 1/3 after exit code 1", "retry after 20s backoff", ...
    endReason: str = ""
    preemptedBy: str | None = None
    isRetryCounted: bool = False
    # Lifecycle bookkeeping:
    ending: AttemptEnding | None = None  # decided, waiting for live tasks to exit
    backoffUntil: float | None = None  # tasks start no earlier than this
    released: bool = False  # JobReleased was published for this attempt
    lateReleases: list[str] = []  # ids of releases answering late placements
    # An older attempt compacted (see TaskBrief): `tasks` holds only the tasks
    # that explain its end, `taskBriefs` every task.
    compacted: bool = False
    taskBriefs: list[TaskBrief] = []

    @property
    def ended(self) -> bool:
        return self.completedTime is not None

    def brief(self, role: str, index: int) -> TaskBrief | None:
        for brief in self.taskBriefs:
            if brief.role == role and brief.index == index:
                return brief
        return None

    def task(self, role: str, index: int) -> TaskRecord | None:
        for task in self.tasks:
            if task.role == role and task.index == index:
                return task
        return None


class JobRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    job: JobId  # user~name
    name: str
    user: UserName
    vc: VcName
    spec: JobSpec
    state: JobState = JobState.WAITING
    createdTime: float = 0.0  # submission time
    launchedTime: float | None = None  # when the current attempt became RUNNING
    completedTime: float | None = None
    attempt: int = 1  # current attempt number, from 1
    retries: int = 0  # retries counted against jobRetryCount
    backoffRetries: int = 0  # ALWAYS_BACKOFF_RETRY retries so far (delay grows)
    # Retries jobRetryCount does not count (ALWAYS_RETRY, ALWAYS_BACKOFF_RETRY);
    # capped by the launcher's MAX_PLATFORM_RETRIES.
    platformRetries: int = 0
    attempts: list[AttemptRecord] = []  # oldest first; the last is the current one
    # How the last ended attempt ended (so while a retry waits, why it retries).
    appExitCode: int | None = None
    appExitSpec: ExitSpec | None = None
    appExitDiagnostics: list[str] = []
    appExitTriggerTaskRoleName: str | None = None
    appExitTriggerTaskIndex: int | None = None
    stopRequestedBy: str | None = None
    # When the launcher removed the job's task directories and logs, past
    # `retention_finished_seconds` after it finished (the record stays).
    logsPrunedAt: float | None = None
    # When the history database took the finished job over (JobArchived): the record
    # leaves the bucket once its logs are pruned too (services/launcher/core/retention.py).
    archivedAt: float | None = None
    history: list[Transition] = []
    # The events published by the change that produced this version of the
    # document. The launcher publishes them after saving it; if it stops in
    # between, it publishes them again on recovery (same ids, so consumers and
    # JetStream deduplicate).
    outbox: list[AnyEvent] = []

    @property
    def current(self) -> AttemptRecord:
        return self.attempts[-1]

    def attempt_record(self, attempt: int) -> AttemptRecord | None:
        for record in self.attempts:
            if record.attempt == attempt:
                return record
        return None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(JobRecord)


def encode_job_record(record: JobRecord) -> bytes:
    """The KV value for a job record."""
    return _encoder.encode(record)


def decode_job_record(data: bytes) -> JobRecord:
    """Raises msgspec.ValidationError/DecodeError on a value that is not a JobRecord."""
    return _decoder.decode(data)
