"""The job state machine: the only way a job's state changes.

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

Anything else is a bug in the launcher: `IllegalTransition` carries the job's
history so the report shows how it got there.
"""

from __future__ import annotations

import msgspec

from libs.common.messages import JobState
from libs.common.records import JobRecord, Transition

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


class IllegalTransition(Exception):
    """A transition outside `LEGAL_TRANSITIONS`: a launcher bug."""

    def __init__(self, record: JobRecord, to: JobState, why: str):
        self.job = record.job
        self.from_state = record.state
        self.to_state = to
        self.history = list(record.history)
        lines = "\n".join(
            f"  {t.at:.3f} attempt {t.attempt}: {t.from_ or '-'} -> {t.to} ({t.why})" for t in record.history
        )
        super().__init__(f"job {record.job}: illegal transition {record.state} -> {to} ({why}); history:\n{lines}")


def is_legal(from_state: JobState, to: JobState) -> bool:
    return to in LEGAL_TRANSITIONS[from_state]


def transition(record: JobRecord, to: JobState, *, at: float, why: str, attempt: int | None = None) -> JobRecord:
    """The record in state `to`, with the change appended to its history."""
    if not is_legal(record.state, to):
        raise IllegalTransition(record, to, why)
    step = Transition(at=at, from_=record.state, to=to, why=why, attempt=attempt or record.attempt)
    return msgspec.structs.replace(record, state=to, history=[*record.history, step])
