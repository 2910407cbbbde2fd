"""Which finished jobs' task directories and logs are due for removal.

A finished job keeps its record for good (GET /jobs, its attempts, its exit
spec); what it left on disk -- each task attempt's directory, its logs, its
working directory -- goes `retention_finished_seconds` after the job finished.
The launcher's shell sweeps periodically: it removes the files of every task
attempt `task_keys` names, then records `LogsPruned`, so a crash in between
only means the next sweep removes nothing twice and records it. The sweep works
from the records, so it goes on where it was after a restart, and it never
looks at a job that is not final (no live task can belong to one).

Pure: the shell asks, removes and reports.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.common.records import JobRecord
from services.launcher.core.tasks import TaskKey


def due_for_pruning(records: Iterable[JobRecord], *, now: float, retention_seconds: float) -> list[JobRecord]:
    """Finished jobs whose files are older than the retention; none when it is 0 (keep forever)."""
    if retention_seconds <= 0:
        return []
    return [
        record
        for record in records
        if record.state.is_final
        and record.logsPrunedAt is None
        and record.completedTime is not None
        and now - record.completedTime >= retention_seconds
    ]


def record_may_go(record: JobRecord, *, keeps_files: bool) -> bool:
    """Whether a finished job's record may leave pai_job_status: the history holds it
    (archived) and nothing of it is left on disk that its record is needed for (a log to
    read, files to prune) -- its logs pruned, or a backend that keeps no files."""
    return record.state.is_final and record.archivedAt is not None and (
        record.logsPrunedAt is not None or not keeps_files)


def task_keys(record: JobRecord) -> list[TaskKey]:
    """Every task attempt of the job that may have left files, in every attempt."""
    keys: list[TaskKey] = []

    def key(attempt: int, role: str, index: int, task_attempt: int) -> TaskKey:
        return TaskKey(job=record.job, attempt=attempt, role=role, index=index, taskAttempt=task_attempt)

    for attempt in record.attempts:
        number = attempt.attempt
        seen: set[tuple[str, int]] = set()
        for task in attempt.tasks:
            seen.add((task.role, task.index))
            keys.extend(key(number, task.role, task.index, s.taskAttempt) for s in task.taskAttempts)
            if task.startRequested:
                keys.append(key(number, task.role, task.index, task.taskAttempt))
        for brief in attempt.taskBriefs:  # a compacted attempt: its task attempts 0..n
            if (brief.role, brief.index) not in seen and brief.started:
                keys.extend(key(number, brief.role, brief.index, n) for n in range(brief.taskAttempt + 1))
    return keys
