"""Keeping a job's status document under NATS's max payload.

The document is one KV value (libs/common/records.py) and NATS refuses a value
over its max payload (1 MiB by default): a 512-task job that retries keeps
512 task records per attempt. So:

- while the job's attempts hold at most `FULL_DETAIL_TASK_RECORDS` task records
  in all, nothing is compacted: a small job keeps every detail of every attempt;
- past that, the latest attempt keeps every `TaskRecord`;
- an attempt that ended and was followed by another is compacted: its own
  outcome (exit code, exit spec, end reason) stays, `tasks` keeps the full
  records of the tasks that failed by themselves (the launcher did not kill
  them; at most `FULL_TASKS_OF_OLDER_ATTEMPT`), and `taskBriefs` has every
  task as (role, index, state, exit code, task attempt, started);
- only the `BRIEFED_OLDER_ATTEMPTS` most recent older attempts keep their
  briefs; older ones keep their outcome and their first self-failed task;
- within a task, the earlier task attempts (taskRetryCount) beyond the last
  `FULL_TASK_ATTEMPTS` keep their exit code and phrase, not the rest of their
  exit spec nor their diagnostics.

Pure functions: the core applies them when it records the change.
"""

from __future__ import annotations

from msgspec.structs import replace

from libs.common.messages import ExitSpec, TaskState
from libs.common.records import AttemptRecord, TaskAttemptSummary, TaskBrief, TaskRecord

# 256 full task records stay well under 1 MiB (each is at most a few KiB with
# its diagnostics cut to the tail the runtime keeps).
FULL_DETAIL_TASK_RECORDS = 256
FULL_TASKS_OF_OLDER_ATTEMPT = 8
FULL_TASK_ATTEMPTS = 2
BRIEFED_OLDER_ATTEMPTS = 10


def compact_older(attempts: list[AttemptRecord]) -> list[AttemptRecord]:
    """Every attempt but the latest compacted, the oldest ones down to their outcome,
    once the attempts hold more than `FULL_DETAIL_TASK_RECORDS` task records."""
    if sum(len(a.tasks) for a in attempts) <= FULL_DETAIL_TASK_RECORDS:
        return attempts
    older = [compact_attempt(a) for a in attempts[:-1]]
    far = len(older) - BRIEFED_OLDER_ATTEMPTS
    if far > 0:
        older[:far] = [replace(a, tasks=a.tasks[:1], taskBriefs=[]) for a in older[:far]]
    return [*older, *attempts[-1:]]


def compact_attempt(attempt: AttemptRecord) -> AttemptRecord:
    """An ended attempt as an older one is kept. Idempotent."""
    if attempt.compacted:
        return attempt
    briefs = [
        TaskBrief(task.role, task.index, task.state, task.exitCode, task.taskAttempt, task.startRequested)
        for task in attempt.tasks
    ]
    failed_alone = [t for t in attempt.tasks if t.state == TaskState.FAILED and t.killReason is None]
    kept = [trim_task_attempts(t) for t in failed_alone[:FULL_TASKS_OF_OLDER_ATTEMPT]]
    return replace(attempt, tasks=kept, taskBriefs=briefs, compacted=True)


def trim_task_attempts(task: TaskRecord) -> TaskRecord:
    """The task with only its last `FULL_TASK_ATTEMPTS` earlier task attempts in full."""
    older = len(task.taskAttempts) - FULL_TASK_ATTEMPTS
    if older <= 0 or all(_is_trimmed(s) for s in task.taskAttempts[:older]):
        return task
    return replace(task, taskAttempts=[*(_trimmed(s) for s in task.taskAttempts[:older]),
                                       *task.taskAttempts[older:]])


def _is_trimmed(summary: TaskAttemptSummary) -> bool:
    return not summary.diagnostics and (summary.exitSpec is None or summary.exitSpec == _short(summary.exitSpec))


def _trimmed(summary: TaskAttemptSummary) -> TaskAttemptSummary:
    return replace(summary, diagnostics=[], exitSpec=_short(summary.exitSpec) if summary.exitSpec else None)


def _short(spec: ExitSpec) -> ExitSpec:
    return ExitSpec(code=spec.code, phrase=spec.phrase, type=spec.type, reaction=spec.reaction)
