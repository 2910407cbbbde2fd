"""OpenPAI-shaped JSON views of PAI's records (pure functions).

OpenPAI reports times in milliseconds since the epoch; so do we.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.messages import JobState
from libs.common.records import JobRecord, TaskRecord
from services.rest.market import core as market_core
from services.rest.records import SubmittedJob


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _spec(spec: Any) -> Any:
    return None if spec is None else msgspec.to_builtins(spec)


def job_summary(sub: SubmittedJob, rec: JobRecord | None, waiting_reason: str | None) -> dict[str, Any]:
    """One row of GET /api/v2/jobs. `sub` and `rec` may be the job index's briefs of the
    records (services/rest/job_index.py): the fields read here, in the same shape."""
    state = rec.state if rec else JobState.WAITING
    return {
        "debugId": sub.job,
        "name": sub.name,
        "username": sub.user,
        "state": state.value,
        "subState": state.value,
        "executionType": "STOP" if rec and rec.stopRequestedBy else "START",
        "retries": rec.retries if rec else 0,
        "totalTaskNumber": sub.spec.task_count,
        "totalGpuNumber": sum(r.instances * r.resources.gpu for r in sub.spec.taskRoles),
        "createdTime": _ms(sub.submittedAt),
        "completedTime": _ms(rec.completedTime) if rec else None,
        "appExitCode": rec.appExitCode if rec else None,
        "virtualCluster": sub.vc,
        "priority": sub.spec.priority,
        "waitingReason": waiting_reason if state == JobState.WAITING else None,
    }


def _task_status(task: TaskRecord) -> dict[str, Any]:
    return {
        "taskIndex": task.index,
        "taskState": task.state.value,
        "retries": task.retries,
        "containerId": None,
        "containerIp": task.hostIp,
        "containerNodeName": task.node,
        "containerPorts": {label: ",".join(map(str, ports)) for label, ports in task.ports.items()},
        "containerGpus": ",".join(map(str, task.gpus)) if task.gpus else None,
        "containerLog": task.logPath or None,
        "containerDetail": task.runtimeDetail or None,
        "runtimeMode": task.runtimeMode or None,
        "containerExitCode": task.exitCode,
        "containerExitSpec": _spec(task.exitSpec),
        "containerExitDiagnostics": "\n".join(task.diagnostics) or None,
        "launchedTime": _ms(task.launchedTime),
        "completedTime": _ms(task.completedTime),
    }


def job_detail(sub: SubmittedJob, rec: JobRecord | None, waiting_reason: str | None, *, backend: str,
               with_output: bool = True) -> dict[str, Any]:
    """GET /api/v2/jobs/{user}~{name}; `backend` is the launcher's ("local" ignores images).

    Anyone may see a job's status; without `with_output` (not its owner, not an
    admin) the exit diagnostics, which quote the job's own output, are left out.
    """
    summary = job_summary(sub, rec, waiting_reason)
    status = {
        "username": sub.user,
        "state": summary["state"],
        "subState": summary["subState"],
        "executionType": summary["executionType"],
        "retries": summary["retries"],
        "attempt": rec.attempt if rec else 1,
        "createdTime": summary["createdTime"],
        "completedTime": summary["completedTime"],
        "appLaunchedTime": _ms(rec.launchedTime) if rec else None,
        "virtualCluster": sub.vc,
        "priority": sub.spec.priority,
        "appExitCode": rec.appExitCode if rec else None,
        "appExitSpec": _spec(rec.appExitSpec) if rec else None,
        "appExitDiagnostics": "\n".join(rec.appExitDiagnostics) if with_output and rec and rec.appExitDiagnostics else None,
        "appExitTriggerTaskRoleName": rec.appExitTriggerTaskRoleName if rec else None,
        "appExitTriggerTaskIndex": rec.appExitTriggerTaskIndex if rec else None,
        "waitingReason": summary["waitingReason"],
    }
    current = {(t.role, t.index): t for t in rec.current.tasks} if rec and rec.attempts else {}
    roles: dict[str, Any] = {}
    for role in sub.spec.taskRoles:
        statuses = []
        for index in range(role.instances):
            task = current.get((role.name, index))
            if task is None:
                statuses.append({"taskIndex": index, "taskState": "WAITING", "retries": 0})
            else:
                statuses.append(_task_status(task) | ({} if with_output else {"containerExitDiagnostics": None}))
        roles[role.name] = {"taskRoleStatus": {"name": role.name}, "taskStatuses": statuses}
    notes = []
    if backend == "local":
        in_containers = {t.role for t in rec.current.tasks if t.runtimeMode == "container"} if current else set()
        for role in sub.spec.taskRoles:
            if role.dockerImageUri and role.name not in in_containers:
                notes.append(f"taskRoles.{role.name}.dockerImage {role.dockerImageUri!r}: not used by the local backend")
    return {
        "name": sub.name,
        "jobStatus": status,
        "taskRoles": roles,
        "ignoredFields": sub.spec.ignoredFields,
        "tags": list(sub.tags),
        "warnings": sub.warnings,
        "notes": notes,
        "marketplaceItem": market_core.item_of_job_config(sub.config),  # its page links back to the item
    }


def job_attempts(rec: JobRecord | None) -> list[dict[str, Any]]:
    """GET /api/v2/jobs/{id}/job-attempts: every attempt, newest first."""
    if rec is None:
        return []
    out = []
    for attempt in reversed(rec.attempts):
        roles: dict[str, list[dict[str, Any]]] = {}
        for task in attempt.tasks:
            roles.setdefault(task.role, []).append(
                _task_status(task) | {"taskAttempts": [msgspec.to_builtins(a) for a in task.taskAttempts]}
            )
        shown = {(t.role, t.index) for t in attempt.tasks}
        for brief in attempt.taskBriefs:  # a compacted older attempt: its other tasks, briefly
            if (brief.role, brief.index) not in shown:
                roles.setdefault(brief.role, []).append(
                    {"taskIndex": brief.index, "taskState": brief.state.value, "containerExitCode": brief.exitCode,
                     "retries": brief.taskAttempt, "brief": True}
                )
        if attempt.taskBriefs:
            for listed in roles.values():
                listed.sort(key=lambda status: status["taskIndex"])
        out.append(
            {
                "attemptIndex": attempt.attempt,
                "isLatest": attempt.attempt == rec.attempt,
                "state": attempt.state.value,
                "createdTime": _ms(attempt.createdTime),
                "launchedTime": _ms(attempt.launchedTime),
                "completedTime": _ms(attempt.completedTime),
                "exitCode": attempt.exitCode,
                "exitSpec": _spec(attempt.exitSpec),
                "endReason": attempt.endReason,
                "preemptedBy": attempt.preemptedBy,
                "isRetryCounted": attempt.isRetryCounted,
                "taskRoles": roles,
            }
        )
    return out
