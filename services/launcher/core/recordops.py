"""Small pure operations on the frozen job records (build, find, replace)."""

from __future__ import annotations

import msgspec

from libs.common.protocol.model import JobSpec
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from services.launcher.core.tasks import TaskKey

replace = msgspec.structs.replace


def new_attempt(spec: JobSpec, number: int, at: float) -> AttemptRecord:
    tasks = [
        TaskRecord(role=role.name, index=index, createdTime=at)
        for role in spec.taskRoles
        for index in range(role.instances)
    ]
    return AttemptRecord(attempt=number, createdTime=at, tasks=tasks)


def task_key(record: JobRecord, attempt: AttemptRecord, task: TaskRecord) -> TaskKey:
    return TaskKey(
        job=record.job, attempt=attempt.attempt, role=task.role, index=task.index, taskAttempt=task.taskAttempt
    )


def with_attempt(record: JobRecord, attempt: AttemptRecord) -> JobRecord:
    """The record with the attempt of the same number replaced."""
    attempts = [attempt if a.attempt == attempt.attempt else a for a in record.attempts]
    return replace(record, attempts=attempts)


def with_task(record: JobRecord, attempt_number: int, task: TaskRecord) -> JobRecord:
    """The record with the task of the same role and index in that attempt replaced."""
    return with_tasks(record, attempt_number, [task])


def with_tasks(record: JobRecord, attempt_number: int, tasks: list[TaskRecord]) -> JobRecord:
    """The record with those tasks (matched by role and index) replaced in that attempt."""
    attempt = record.attempt_record(attempt_number)
    if attempt is None:
        raise KeyError(f"{record.job}: no attempt {attempt_number}")
    changed = {(t.role, t.index): t for t in tasks}
    return with_attempt(record, replace(attempt, tasks=[changed.get((t.role, t.index), t) for t in attempt.tasks]))


def find_task(record: JobRecord, key: TaskKey) -> tuple[AttemptRecord, TaskRecord] | None:
    """The attempt and task whose *current* task attempt is `key`."""
    attempt = record.attempt_record(key.attempt)
    if attempt is None:
        return None
    task = attempt.task(key.role, key.index)
    if task is None or task.taskAttempt != key.taskAttempt:
        return None
    return attempt, task


def exit_recorded(record: JobRecord, key: TaskKey) -> bool:
    """Whether the exit of that task attempt is already in the record."""
    attempt = record.attempt_record(key.attempt)
    if attempt is not None and attempt.compacted:
        return True  # an ended older attempt (compaction.py): every task of it exited
    task = attempt.task(key.role, key.index) if attempt is not None else None
    if task is None:
        return False
    if task.taskAttempt == key.taskAttempt:
        return task.exited
    return any(s.taskAttempt == key.taskAttempt for s in task.taskAttempts)
