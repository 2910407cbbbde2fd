"""OpenPAI's job-attempt, task and SSH views of PAI's jobs.

Attempt numbers. PAI numbers a job's attempts from 1 everywhere it keeps or shows them:
the launcher's records, the history database, events' `attempt`, `jobStatus.attempt`,
`GET /jobs/{id}/logs?attempt=` and PAI's own task routes
(`/job-attempts/{a}/tasks/{role}/{index}[/logs]`). OpenPAI numbers them from 0. The
OpenPAI routes therefore take and show OpenPAI's number (`attemptIndex`, `jobAttemptId`,
`attemptId`) and carry PAI's beside it as `attempt`; the offset is applied here and
nowhere else (`OPENPAI_OFFSET`): `job-attempts/0` is PAI's attempt 1.

The converters are pure; the handlers read the job as the rest of the job API does
(jobs_api.read_job) and leave its attempts, tasks and logs to the owner and admins.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import sqlalchemy
from aiohttp import web

from libs.common import ids
from libs.common.errors import NotFound
from libs.common.messages import TaskState
from libs.common.records import JobRecord
from services.rest import job_ssh, jobs_api, views
from services.rest.history import query as history_query
from services.rest.records import SubmittedJob
from services.rest.request import USER, bad_field, ctx_of

# PAI's attempt n is OpenPAI's n - 1.
OPENPAI_OFFSET = 1
# OpenPAI's log-manager names one location per file; PAI keeps one log per task attempt.
LOG_NAME = "all"
# What a tail location asks for (OpenPAI's `tailMode=true`: the end of the log).
TAIL_BYTES = 16 * 1024
# The SSH port label a task's ports may carry (OpenPAI's ssh plugin names it `ssh`).
SSH_PORT_LABEL = "ssh"


def to_openpai(attempt: int) -> int:
    return attempt - OPENPAI_OFFSET


def to_pai(attempt: int) -> int:
    return attempt + OPENPAI_OFFSET


def _spec_counts(sub: SubmittedJob | None) -> dict[str, int]:
    if sub is None:
        return {}
    return {"totalGpuNumber": sum(r.instances * r.resources.gpu for r in sub.spec.taskRoles),
            "totalTaskNumber": sub.spec.task_count, "totalTaskRoleNumber": len(sub.spec.taskRoles)}


def attempt_view(jid: str, entry: dict[str, Any], sub: SubmittedJob | None = None) -> dict[str, Any]:
    """One of PAI's attempt entries (views.job_attempts, jobs_api.history_attempts) in
    OpenPAI's JobAttempt shape, PAI's fields kept beside OpenPAI's (pure).

    `taskRoles` is OpenPAI's `{role: {taskRoleStatus, taskStatuses}}`; each task status
    keeps PAI's fields (taskAttempts, containerExitSpec, ...)."""
    user, _, name = jid.partition("~")
    pai_number = int(entry["attemptIndex"])
    roles = entry.get("taskRoles", {})
    shaped_roles = {role: tasks if isinstance(tasks, dict) else {"taskRoleStatus": {"name": role},
                                                                   "taskStatuses": tasks}
                    for role, tasks in roles.items()}
    spec = entry.get("exitSpec") or None
    return {
        **{k: v for k, v in entry.items() if k != "taskRoles"},
        "jobName": name,
        "frameworkName": jid,
        "userName": user,
        "attemptIndex": to_openpai(pai_number),
        "attempt": pai_number,  # PAI's number (from 1), as jobStatus.attempt and the events show it
        "attemptStartedTime": entry.get("launchedTime"),
        "attemptCompletedTime": entry.get("completedTime"),
        "exitPhrase": spec.get("phrase") if spec else None,
        "exitType": spec.get("type") if spec else None,
        **_spec_counts(sub),
        "taskRoles": shaped_roles,
    }


def attempts_view(jid: str, entries: list[dict[str, Any]], sub: SubmittedJob | None = None) -> list[dict[str, Any]]:
    return [attempt_view(jid, entry, sub) for entry in entries]


def find_attempt(jid: str, entries: list[dict[str, Any]], openpai_index: int,
                 sub: SubmittedJob | None = None) -> dict[str, Any]:
    """The attempt OpenPAI numbers `openpai_index`, or 404 naming the ones there are (pure)."""
    for entry in entries:
        if int(entry["attemptIndex"]) == to_pai(openpai_index):
            return attempt_view(jid, entry, sub)
    have = ", ".join(str(to_openpai(int(e["attemptIndex"]))) for e in reversed(entries)) or "none yet"
    raise NotFound(f"job {jid} has no attempt {openpai_index} (its attempts, numbered from 0 as OpenPAI: {have})")


def _ms(t: Any) -> Any:
    """A live record's seconds as OpenPAI's milliseconds; the history's are milliseconds already."""
    return int(t * 1000) if isinstance(t, float) else t


def task_view(jid: str, attempt: dict[str, Any], role: str, index: int) -> dict[str, Any]:
    """OpenPAI's TaskStatus of one task of one (OpenPAI-shaped) attempt: its task
    attempts oldest first under `attempts` (pure)."""
    roles = attempt["taskRoles"]
    if role not in roles:
        raise NotFound(f"job {jid} has no task role {role[:64]!r} (its roles: {', '.join(roles) or 'none'})")
    for task in roles[role]["taskStatuses"]:
        if task.get("taskIndex") == index:
            break
    else:
        raise NotFound(f"attempt {attempt['attemptIndex']} of {jid} has no task {role}[{index}]")
    earlier = [{
        "attemptId": t.get("taskAttempt", i), "attemptState": t.get("state"),
        "currentAttemptCreatedTime": None, "currentAttemptLaunchedTime": _ms(t.get("launchedTime")),
        "currentAttemptCompletedTime": _ms(t.get("completedTime")),
        "containerId": None, "containerIp": None, "containerNodeName": t.get("node"), "containerPorts": {},
        "containerGpus": None, "containerLog": t.get("logPath") or "", "containerExitCode": t.get("exitCode"),
        "containerExitSpec": t.get("exitSpec"), "containerExitDiagnostics": "\n".join(t.get("diagnostics") or [])
        or None,
    } for i, t in enumerate(task.get("taskAttempts", []))]
    retries = int(task.get("retries") or 0)
    current = {
        "attemptId": retries, "attemptState": task.get("taskState"),
        "currentAttemptCreatedTime": None, "currentAttemptLaunchedTime": task.get("launchedTime"),
        "currentAttemptCompletedTime": task.get("completedTime"), "containerId": task.get("containerId"),
        "containerIp": task.get("containerIp"), "containerNodeName": task.get("containerNodeName"),
        "containerPorts": task.get("containerPorts") or {}, "containerGpus": task.get("containerGpus"),
        "containerLog": task.get("containerLog") or "", "containerExitCode": task.get("containerExitCode"),
        "containerExitSpec": task.get("containerExitSpec"),
        "containerExitDiagnostics": task.get("containerExitDiagnostics"),
    }
    return {
        "taskIndex": index,
        "taskUid": f"{jid}/{attempt['attemptIndex']}/{role}/{index}",
        "taskState": task.get("taskState"),
        "retries": retries,
        "accountableRetries": retries,
        "createdTime": attempt.get("createdTime"),
        "launchedTime": task.get("launchedTime"),
        "completedTime": task.get("completedTime"),
        "username": attempt["userName"],
        "jobName": attempt["jobName"],
        "jobAttemptId": attempt["attemptIndex"],
        "taskRoleName": role,
        "attempts": [*earlier, current],
    }


def log_locations(base_url: str, jid: str, pai_attempt: int, role: str, index: int, task_attempt: int,
                  tail: bool) -> dict[str, Any]:
    """OpenPAI's PodLogInfo: where each log of one task attempt is read, here PAI's own
    task-log route (which takes PAI's attempt number) (pure)."""
    path = (f"/api/v2/jobs/{quote(jid, safe='~')}/job-attempts/{pai_attempt}/tasks/{quote(role, safe='')}/"
            f"{index}/logs")
    query: dict[str, Any] = {"taskAttempt": task_attempt}
    if tail:
        query["tailBytes"] = TAIL_BYTES
    return {"locations": [{"name": LOG_NAME, "uri": f"{base_url}{path}?{urlencode(query)}"}]}


def ssh_info(jid: str, rec: JobRecord | None, login: str = "") -> dict[str, Any]:
    """OpenPAI's SSH info (its v1 shape: a container per task with its SSH address) from
    the tasks of the current attempt that expose an `ssh` port; 404 as OpenPAI's
    NoJobSshInfoError where none does (pure). PAI adds each task's login and the
    command line that reaches it with the job's private key (saved as
    keyPair.privateKeyFileName)."""
    containers = []
    if rec is not None and rec.attempts:
        for task in rec.current.tasks:
            ports = task.ports.get(SSH_PORT_LABEL)
            # Placed is not enough: its port and host are known before the task starts, and
            # its server listens only once it runs (and is gone once it ended).
            if ports and task.hostIp and task.state is TaskState.RUNNING:
                entry = {"id": f"{task.role}-{task.index}", "taskRoleName": task.role,
                         "taskIndex": task.index, "sshIp": task.hostIp, "sshPort": str(ports[0])}
                if login:
                    entry |= {"user": login, "sshCommand": f"ssh -i {ids.job_key(jid)} -p {ports[0]} "
                                                           f"{login}@{task.hostIp}"}
                containers.append(entry)
    if not containers:
        raise SshInfoNotFound(f"SSH info of job {jid} is not found: none of its running tasks exposes an "
                              f"'{SSH_PORT_LABEL}' port")
    return {"containers": containers, "keyPair": None}


class SshInfoNotFound(NotFound):
    code = "NoJobSshInfoError"


# --- handlers -------------------------------------------------------------------------------


def _index_param(request: web.Request, name: str) -> int:
    raw = request.match_info[name]
    try:
        value = int(raw)
    except ValueError:
        raise bad_field(name, "type", f"{name} must be an integer (OpenPAI numbers attempts from 0), "
                                      f"got {raw[:40]!r}") from None
    if value < 0:
        raise bad_field(name, "minimum", f"{name} must be >= 0 (OpenPAI numbers attempts from 0)")
    return value


async def pai_attempts(request: web.Request, jid: str) -> tuple[SubmittedJob | None, list[dict[str, Any]]]:
    """The job and its attempts in PAI's numbering, newest first: live from the launcher's
    record, or from the history database once the job left the buckets."""
    try:
        sub, rec, _ = await jobs_api.read_job(request, jid)
    except NotFound as gone:  # finished and expired from the buckets: the history database has it
        engine = await jobs_api.from_history(request, jid, "read the attempts of", gone)
        return None, jobs_api.history_attempts(await history_query.job_attempts(engine, jid))
    jobs_api.require_owner_or_admin(request, sub, "read the attempts of")
    return sub, views.job_attempts(rec)


async def list_attempts(request: web.Request) -> web.Response:
    """GET /api/v2/jobs/{job}/job-attempts: every attempt, newest first, OpenPAI's shape."""
    jid = jobs_api.job_param(request)
    sub, entries = await pai_attempts(request, jid)
    return jobs_api.json_response(attempts_view(jid, entries, sub))


async def get_attempt(request: web.Request) -> web.Response:
    """GET /api/v2/jobs/{job}/job-attempts/{attempt}: OpenPAI's attempt number, from 0."""
    jid = jobs_api.job_param(request)
    index = _index_param(request, "attempt")
    sub, entries = await pai_attempts(request, jid)
    return jobs_api.json_response(find_attempt(jid, entries, index, sub))


async def attempts_healthz(request: web.Request) -> web.Response:
    """GET /api/v2/jobs/{job}/job-attempts/healthz: OpenPAI's probe of its job-history
    store, answered from PAI's history database (PAI keeps attempts in any case)."""
    engine = jobs_api.history_engine(request)
    if engine is not None:
        try:
            async with engine.connect() as connection:
                await connection.execute(sqlalchemy.text("SELECT 1"))
        except Exception:  # noqa: BLE001 - whatever the database says, the probe's answer is 501
            return web.Response(status=501, text="Not healthy")
    return web.Response(text="ok")


async def get_job_at_attempt(request: web.Request) -> web.Response:
    """GET /api/v2/jobs/{job}/attempts/{jobAttemptId}: the job detail with that attempt's
    state and tasks (OpenPAI's number, from 0)."""
    jid = jobs_api.job_param(request)
    index = _index_param(request, "jobAttemptId")
    sub, rec, sched = await jobs_api.read_job(request, jid)
    detail = views.job_detail(sub, rec, jobs_api.waiting_reason(rec, sched), backend=ctx_of(request).config.backend,
                              with_output=jobs_api.may_read_output(request, sub))
    current = rec.attempt if rec is not None else 1
    detail["jobStatus"]["attemptId"] = to_openpai(current)
    if to_pai(index) != current or rec is None:
        jobs_api.require_owner_or_admin(request, sub, "read the attempts of")
        attempt = find_attempt(jid, views.job_attempts(rec), index, sub)
        detail["jobStatus"] |= {"attemptId": index, "attempt": to_pai(index), "state": attempt["state"],
                                "attemptState": attempt["state"]}
        detail["taskRoles"] = attempt["taskRoles"]
    return jobs_api.json_response(detail)


async def _task(request: web.Request) -> tuple[str, dict[str, Any], str, int]:
    jid = jobs_api.job_param(request)
    index = _index_param(request, "jobAttemptId")
    role = request.match_info["taskRoleName"]
    task_index = _index_param(request, "taskIndex")
    sub, entries = await pai_attempts(request, jid)
    attempt = find_attempt(jid, entries, index, sub)
    return jid, task_view(jid, attempt, role, task_index), role, task_index


async def get_task_attempts(request: web.Request) -> web.Response:
    """GET /api/v2/jobs/{job}/attempts/{a}/taskRoles/{role}/taskIndex/{i}/attempts."""
    _, task, _, _ = await _task(request)
    return jobs_api.json_response(task)


async def get_task_log_locations(request: web.Request) -> web.Response:
    """GET .../taskIndex/{i}/attempts/{taskAttemptId}/logs: where the logs are (PAI's own
    task-log route, which streams the text)."""
    jid, task, role, index = await _task(request)
    task_attempt = _index_param(request, "taskAttemptId")
    have = [a["attemptId"] for a in task["attempts"]]
    if task_attempt not in have:
        raise NotFound(f"task {role}[{index}] of attempt {task['jobAttemptId']} of {jid} has no attempt "
                       f"{task_attempt} (its attempts: {', '.join(map(str, have))})")
    tail = request.query.get("tailMode", request.query.get("tail-mode", "")).lower() in ("1", "true", "yes")
    base = f"{request.scheme}://{request.host}"
    return jobs_api.json_response(log_locations(base, jid, to_pai(task["jobAttemptId"]), role, index, task_attempt,
                                                tail))


async def get_ssh_info(request: web.Request) -> web.Response:
    """GET /api/v2/jobs/{job}/ssh: OpenPAI's SSH info, for the owner and admins."""
    jid = jobs_api.job_param(request)
    sub, rec, _ = await jobs_api.read_job(request, jid)
    jobs_api.require_owner_or_admin(request, sub, "read the SSH info of")
    pair = await job_ssh.read(ctx_of(request).bus, jid)
    info = ssh_info(jid, rec, sub.user if pair is not None else "")
    # The job's private key to its owner alone (an admin sees where the tasks are, not the key).
    info["keyPair"] = job_ssh.key_pair_view(jid, pair, with_private=request[USER].username == sub.user)
    return jobs_api.json_response(info)
