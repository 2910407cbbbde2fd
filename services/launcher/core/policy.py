"""Completion and retry policies of the job protocol, as pure functions.

Completion (OpenPAI / FrameworkController semantics), checked each time a task
attempt is settled (succeeded, or failed with the runtime's verdict and no retry
of the task alone left):

1. the settled task failed, its role's `minFailedInstances` is not -1 and the
   role has at least that many failed tasks: the attempt FAILS, with the exit
   code and exit spec of that task;
2. the settled task succeeded, its role's `minSucceededInstances` is not -1 and
   the role has at least that many succeeded tasks: the attempt SUCCEEDS;
3. every task of the attempt is settled and neither rule fired: the attempt
   SUCCEEDS, failed tasks notwithstanding (so `minFailedInstances: -1` lets a
   role's tasks fail without failing the job, and `minSucceededInstances: -1`
   means the job waits for all of its tasks).

Retry of a failed attempt, by the trigger task's exit spec reaction:

- NEVER_RETRY: the job FAILS now, whatever `jobRetryCount` says;
- RETRY_TO_MAX: a new attempt while `retries < jobRetryCount`, counted;
- ALWAYS_RETRY: a new attempt, not counted;
- ALWAYS_BACKOFF_RETRY: a new attempt after a delay growing with each such retry
  (`base * 2**n`, capped), not counted.

Not counted is not unbounded: a job gets at most `MAX_PLATFORM_RETRIES`
retries that jobRetryCount does not count (a task that SIGKILLs itself, exit
137, would otherwise retry forever); past the first
`PLATFORM_RETRIES_BEFORE_BACKOFF` of them an ALWAYS_RETRY waits like an
ALWAYS_BACKOFF_RETRY; at the cap the job FAILS, its exit spec saying why.
Preemptions are not failures and do not use this budget.

Retry of a task alone (`gangAllocation: false` only, before any of the above):
while the task's `retries < taskRetryCount` and the reaction is not NEVER_RETRY,
the task gets a new task attempt on its placement; every such retry is counted,
whatever the reaction, so a task cannot loop forever in place. A task that
ended because its node was lost is the exception: retried in place it would
start again on the lost node, so its failure ends the attempt instead, and the
job's retry (PodNodeLost: ALWAYS_RETRY, not counted) gives the job back to the
scheduler, which places it on healthy nodes (see `task_retry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import msgspec

from libs.common.messages import Reaction, TaskState
from libs.common.protocol.model import JobSpec
from libs.common.records import TaskRecord

UNLIMITED = -1


def settled_failed(task: TaskRecord) -> bool:
    return task.state == TaskState.FAILED and not task.verdictPending


def settled(task: TaskRecord) -> bool:
    return task.state == TaskState.SUCCEEDED or settled_failed(task)


class Completion(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class CompletionResult(msgspec.Struct, frozen=True, kw_only=True):
    completion: Completion
    why: str


def attempt_completion(spec: JobSpec, tasks: Sequence[TaskRecord], trigger: TaskRecord) -> CompletionResult | None:
    """Whether settling `trigger` completes the attempt made of `tasks` (which include it)."""
    policy = spec.role(trigger.role).completion
    role_tasks = [t for t in tasks if t.role == trigger.role]
    if settled_failed(trigger) and policy.minFailedInstances != UNLIMITED:
        failed = sum(1 for t in role_tasks if settled_failed(t))
        if failed >= policy.minFailedInstances:
            return CompletionResult(
                completion=Completion.FAILED,
                why=(
                    f"task role {trigger.role}: {failed} failed task(s) reached minFailedInstances "
                    f"{policy.minFailedInstances}, triggered by {trigger.role}[{trigger.index}]"
                ),
            )
    if trigger.state == TaskState.SUCCEEDED and policy.minSucceededInstances != UNLIMITED:
        succeeded = sum(1 for t in role_tasks if t.state == TaskState.SUCCEEDED)
        if succeeded >= policy.minSucceededInstances:
            return CompletionResult(
                completion=Completion.SUCCEEDED,
                why=(
                    f"task role {trigger.role}: {succeeded} succeeded task(s) reached minSucceededInstances "
                    f"{policy.minSucceededInstances}"
                ),
            )
    if all(settled(t) for t in tasks):
        failed = sum(1 for t in tasks if settled_failed(t))
        return CompletionResult(
            completion=Completion.SUCCEEDED,
            why=f"all {len(tasks)} task(s) completed ({failed} failed) and no completion policy fired",
        )
    return None


MAX_PLATFORM_RETRIES = 10
PLATFORM_RETRIES_BEFORE_BACKOFF = 3


class JobRetry(msgspec.Struct, frozen=True, kw_only=True):
    retry: bool
    counted: bool = False
    backoff: bool = False
    # No retry because the job used up MAX_PLATFORM_RETRIES.
    exhausted: bool = False


def job_retry(reaction: Reaction, *, retries: int, job_retry_count: int, platform_retries: int = 0) -> JobRetry:
    match reaction:
        case Reaction.NEVER_RETRY:
            return JobRetry(retry=False)
        case Reaction.ALWAYS_RETRY | Reaction.ALWAYS_BACKOFF_RETRY if platform_retries >= MAX_PLATFORM_RETRIES:
            return JobRetry(retry=False, exhausted=True)
        case Reaction.ALWAYS_RETRY:
            return JobRetry(retry=True, backoff=platform_retries >= PLATFORM_RETRIES_BEFORE_BACKOFF)
        case Reaction.ALWAYS_BACKOFF_RETRY:
            return JobRetry(retry=True, backoff=True)
        case _:  # RETRY_TO_MAX
            if retries < job_retry_count:
                return JobRetry(retry=True, counted=True)
            return JobRetry(retry=False)


def task_retry_allowed(reaction: Reaction, *, gang_allocation: bool, retries: int, task_retry_count: int) -> bool:
    if gang_allocation or reaction == Reaction.NEVER_RETRY:
        return False
    return retries < task_retry_count


class TaskRetry(StrEnum):
    NONE = "none"  # the task's failure is settled: the completion policy decides
    IN_PLACE = "in_place"  # a new task attempt on the task's placement
    # The task's placement is gone (its node was lost): the attempt fails with
    # this task as its trigger and the job retry asks the scheduler for a new placement.
    NEW_PLACEMENT = "new_placement"


def task_retry(
    reaction: Reaction, *, gang_allocation: bool, retries: int, task_retry_count: int, node_lost: bool
) -> TaskRetry:
    if not task_retry_allowed(
        reaction, gang_allocation=gang_allocation, retries=retries, task_retry_count=task_retry_count
    ):
        return TaskRetry.NONE
    return TaskRetry.NEW_PLACEMENT if node_lost else TaskRetry.IN_PLACE


def backoff_seconds(previous_backoffs: int, *, base: float, maximum: float) -> float:
    """Delay before the (previous_backoffs + 1)-th backoff retry of a job."""
    # Cap the exponent too: 2**previous_backoffs overflows a float eventually.
    return min(maximum, base * 2.0 ** min(previous_backoffs, 62))
