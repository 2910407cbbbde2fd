"""Checking a restored schedule against the launcher's truth.

The scheduler's own bucket (pai_schedule) says which attempts hold cells. It can
be stale: a crash between the launcher's release and the scheduler's record of
it, a record that failed, a bucket restored from an older copy. The launcher's
job status documents (pai_job_status) are the truth about what runs: the
launcher saves a document *before* it publishes the events that change it (its
outbox), so an attempt whose `JobReleased` is already in the event stream is
marked `released` there, and a job it ended is final there.

`check_restore` decides, before the core is given any `Restore` or `Submit`:

- a placement of an attempt the launcher released (or of a job it finished) is
  dropped: its cells are free; when the launcher already runs a later attempt
  of the job, that attempt is queued (or adopted, when it is placed);
- a placement the launcher has not heard of yet is kept (its `JobPlaced` may
  still be on its way: the cells must stay held);
- an attempt the launcher holds on cells (placed, not released) that the
  scheduler's bucket lost, or has as waiting or as an older attempt, is adopted
  onto the launcher's cells;
- a waiting entry of a job the launcher finished is dropped.

Pure and synchronous: the shell reads both buckets and carries out the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

import msgspec

from libs.common.messages import TaskPlacement, TaskState
from libs.common.protocol.model import JobSpec
from libs.common.records import JobRecord as LauncherRecord
from services.scheduler.core.events import Restore, Submit


class AttemptTruth(msgspec.Struct, frozen=True, kw_only=True):
    """What the launcher says about one attempt of a job."""

    attempt: int
    released: bool  # its JobReleased is published (or is in the launcher's outbox)
    holding: list[TaskPlacement] = []  # placed tasks of an attempt not released
    released_tasks: list[tuple[str, int]] = []  # cells given back early (gangReleaseEnable: false)


class LauncherTruth(msgspec.Struct, frozen=True, kw_only=True):
    """What the launcher says about one job."""

    job: str
    spec: JobSpec
    finished: bool  # SUCCEEDED, FAILED or STOPPED
    current: int  # its current attempt number
    submittedAt: float | None = None  # keeps its place in the queue when queued again
    attempts: list[AttemptTruth] = []

    def attempt(self, number: int) -> AttemptTruth | None:
        return next((a for a in self.attempts if a.attempt == number), None)


class Outcome(StrEnum):
    KEPT = "kept"
    RELEASED = "released"
    ADOPTED = "adopted"
    REQUEUED = "requeued"
    DROPPED = "dropped"  # a waiting entry of a finished job


class RestoreNote(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    attempt: int
    outcome: Outcome
    why: str


class RestoreCheck(msgspec.Struct, frozen=True, kw_only=True):
    restores: list[Restore]  # give these to the core first
    queued: list[Submit]  # then these, in this order
    notes: list[RestoreNote]  # one per attempt whose fate the launcher's truth changed or confirmed

    def changed_jobs(self) -> list[str]:
        """Jobs whose stored entry no longer says what the core now holds."""
        return list(dict.fromkeys(n.job for n in self.notes if n.outcome is not Outcome.KEPT))


def truth_from_record(record: LauncherRecord) -> LauncherTruth:
    """The part of a launcher job document the check needs."""
    attempts = []
    per_task = {role.name for role in record.spec.taskRoles if not role.gangReleaseEnable}
    for attempt in record.attempts:
        # A task of such a role that ended for good had its own JobReleased (launcher, _settle).
        released = [(t.role, t.index) for t in attempt.tasks if t.role in per_task and not t.verdictPending
                    and t.state in (TaskState.SUCCEEDED, TaskState.FAILED)]
        holding = [] if attempt.released else [
            TaskPlacement(role=t.role, index=t.index, node=t.node, hostIp=t.hostIp or "127.0.0.1",
                          gpus=list(t.gpus), leafCells=list(t.leafCells), skuType=t.skuType)
            for t in attempt.tasks
            if t.node is not None and (t.role, t.index) not in released
        ]
        attempts.append(AttemptTruth(attempt=attempt.attempt, released=attempt.released, holding=holding,
                                     released_tasks=released))
    return LauncherTruth(job=record.job, spec=record.spec, finished=record.state.is_final,
                         current=record.attempt, submittedAt=record.createdTime or None, attempts=attempts)


def check_restore(
    placed: Iterable[Restore], queued: Iterable[Submit], truth: Mapping[str, LauncherTruth]
) -> RestoreCheck:
    restores: list[Restore] = []
    submits: list[Submit] = []
    notes: list[RestoreNote] = []
    settled: set[str] = set()  # jobs whose fate is decided by a placement of the scheduler's
    for restore in placed:
        settled.add(restore.job)
        known = truth.get(restore.job)
        said = known.attempt(restore.attempt) if known is not None else None
        if known is None or said is None:
            restores.append(restore)
            notes.append(RestoreNote(job=restore.job, attempt=restore.attempt, outcome=Outcome.KEPT,
                                     why="the launcher has not seen this attempt yet"))
            continue
        if not said.released and not known.finished:
            restores.append(restore)
            notes.append(RestoreNote(job=restore.job, attempt=restore.attempt, outcome=Outcome.KEPT,
                                     why="the launcher holds it"))
            continue
        why = "the launcher finished the job" if known.finished else "the launcher released it"
        notes.append(RestoreNote(job=restore.job, attempt=restore.attempt, outcome=Outcome.RELEASED, why=why))
        notes.extend(_follow_up(known, after=restore.attempt, restores=restores, submits=submits))
    for submit in queued:
        known = truth.get(submit.job)
        if known is None:
            submits.append(submit)
            continue
        settled.add(submit.job)
        if known.finished:
            notes.append(RestoreNote(job=submit.job, attempt=submit.attempt, outcome=Outcome.DROPPED,
                                     why="the launcher finished the job"))
            continue
        current = known.attempt(known.current)
        holding = current is not None and bool(current.holding)
        if known.current > submit.attempt or (known.current == submit.attempt and holding):
            follow = _follow_up(known, after=0, restores=restores, submits=submits)
            if follow:
                notes.extend(follow)
                continue
        submits.append(submit)
    for job, known in truth.items():
        if job in settled or known.finished:
            continue
        current = known.attempt(known.current)
        if current is not None and current.holding:  # running, and the scheduler's bucket lost it
            notes.extend(_follow_up(known, after=0, restores=restores, submits=submits))
    return RestoreCheck(restores=restores, queued=submits, notes=notes)


def _follow_up(known: LauncherTruth, *, after: int, restores: list[Restore], submits: list[Submit]) -> list[RestoreNote]:
    """The launcher's current attempt, when later than `after`: adopted onto the
    cells it holds, or queued when it waits for cells."""
    if known.finished or known.current <= after:
        return []
    current = known.attempt(known.current)
    if current is None or current.released:
        return []
    if current.holding:
        restores.append(Restore(job=known.job, attempt=current.attempt, spec=known.spec, tasks=list(current.holding),
                                released=list(current.released_tasks)))
        return [RestoreNote(job=known.job, attempt=current.attempt, outcome=Outcome.ADOPTED,
                            why=f"the launcher runs it on {len(current.holding)} placed task(s)")]
    submits.append(Submit(job=known.job, attempt=current.attempt, spec=known.spec, at=known.submittedAt))
    return [RestoreNote(job=known.job, attempt=current.attempt, outcome=Outcome.REQUEUED,
                        why="the launcher waits for its cells")]
