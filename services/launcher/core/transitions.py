"""The launcher's three state machines, each a table: the only way a job's, an
attempt's or a task's state changes.

The job:

    WAITING  -> RUNNING      every task of the gang started (the first one, gangAllocation: false)
    WAITING  -> WAITING      a new attempt (retry or preemption) before the job ever ran
    WAITING  -> STOPPING     stop while some tasks are already started
    WAITING  -> STOPPED      stop with nothing started
    WAITING  -> SUCCEEDED    a completion policy was met before every task had started
    WAITING  -> FAILED       idem, failure
    RUNNING  -> WAITING      a new attempt (retry or preemption)
    RUNNING  -> STOPPING     stop while tasks run
    RUNNING  -> STOPPED      stop once no task is live any more
    RUNNING  -> SUCCEEDED | FAILED
    STOPPING -> STOPPED      every task has exited
    SUCCEEDED, FAILED, STOPPED: final, no way out.

An attempt (its state is a `JobState` too, never STOPPING: the job stops, the
attempt ends):

    WAITING  -> RUNNING      as the job, when its gang (or first task) started
    WAITING | RUNNING -> SUCCEEDED | FAILED | STOPPED
                             its decided end applied; FAILED also for one retried,
                             STOPPED also for one preempted

A task (one instance of a role in the current attempt):

    WAITING  -> RUNNING      the backend reports it running
    WAITING | RUNNING -> SUCCEEDED   exit code 0
    WAITING | RUNNING -> FAILED      non-zero exit, the runtime's verdict pending
    WAITING | RUNNING -> STOPPED     killed by the launcher, or never started when
                                     its attempt ended
    FAILED   -> WAITING      retried as a new task attempt (taskRetryCount)
    SUCCEEDED, STOPPED: final within the attempt.

Anything else is a bug in the launcher: `IllegalTransition` carries the job's
history (and, for a task, its earlier task attempts) so the report shows how it
got there.
"""

from __future__ import annotations

import msgspec

from libs.common.messages import JobState, TaskState
from libs.common.records import AttemptRecord, JobRecord, TaskRecord, Transition

W, R, SG = JobState.WAITING, JobState.RUNNING, JobState.STOPPING
OK, KO, SD = JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED

LEGAL_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    W: frozenset({R, W, SG, SD, OK, KO}),
    R: frozenset({W, SG, SD, OK, KO}),
    SG: frozenset({SD}),
    OK: frozenset(),
    KO: frozenset(),
    SD: frozenset(),
}


TS_W, TS_R, TS_OK, TS_KO, TS_SD = (
    TaskState.WAITING,
    TaskState.RUNNING,
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.STOPPED,
)

TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TS_W: frozenset({TS_R, TS_OK, TS_KO, TS_SD}),
    TS_R: frozenset({TS_OK, TS_KO, TS_SD}),
    TS_KO: frozenset({TS_W}),
    TS_OK: frozenset(),
    TS_SD: frozenset(),
}

ATTEMPT_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    W: frozenset({R, OK, KO, SD}),
    R: frozenset({OK, KO, SD}),
    SG: frozenset(),
    OK: frozenset(),
    KO: frozenset(),
    SD: frozenset(),
}


class IllegalTransition(Exception):
    """A transition outside its table: a launcher bug.

    `what` names the machine: "job", "attempt N" or "task role/index".
    """

    def __init__(
        self,
        record: JobRecord,
        to: JobState | TaskState,
        why: str,
        *,
        what: str = "job",
        from_state: JobState | TaskState | None = None,
        extra: list[str] | None = None,
    ):
        self.job = record.job
        self.what = what
        self.from_state = record.state if from_state is None else from_state
        self.to_state = to
        self.history = list(record.history)
        lines = "\n".join(
            f"  {t.at:.3f} attempt {t.attempt}: {t.from_ or '-'} -> {t.to} ({t.why})" for t in record.history
        )
        more = "".join(f"\n  {line}" for line in extra or [])
        super().__init__(
            f"job {record.job}: illegal {what} transition {self.from_state} -> {to} ({why}); history:\n{lines}{more}"
        )


def is_legal(from_state: JobState, to: JobState) -> bool:
    return to in LEGAL_TRANSITIONS[from_state]


def transition(record: JobRecord, to: JobState, *, at: float, why: str, attempt: int | None = None) -> JobRecord:
    """The record in state `to`, with the change appended to its history."""
    if not is_legal(record.state, to):
        raise IllegalTransition(record, to, why)
    step = Transition(at=at, from_=record.state, to=to, why=why, attempt=attempt or record.attempt)
    return msgspec.structs.replace(record, state=to, history=[*record.history, step])


def move_attempt(record: JobRecord, attempt: AttemptRecord, to: JobState, *, why: str, **changes: object) -> AttemptRecord:
    """The attempt in state `to` (with `changes`), if its table allows it."""
    if to not in ATTEMPT_TRANSITIONS[attempt.state]:
        raise IllegalTransition(record, to, why, what=f"attempt {attempt.attempt}", from_state=attempt.state)
    return msgspec.structs.replace(attempt, state=to, **changes)


def move_task(record: JobRecord, task: TaskRecord, to: TaskState, *, why: str, **changes: object) -> TaskRecord:
    """The task in state `to` (with `changes`), if its table allows it."""
    if to not in TASK_TRANSITIONS[task.state]:
        earlier = [f"task attempt {s.taskAttempt}: {s.state} (exit {s.exitCode})" for s in task.taskAttempts]
        raise IllegalTransition(
            record,
            to,
            why,
            what=f"task {task.role}/{task.index} (task attempt {task.taskAttempt})",
            from_state=task.state,
            extra=earlier,
        )
    return msgspec.structs.replace(task, state=to, **changes)
