"""Every `/api/v2/jobs` route, PAI's and OpenPAI's, in one list.

Attempt numbers: OpenPAI's routes (`job-attempts`, `job-attempts/{n}`, `attempts/{n}`
and the task routes under it) number attempts from 0, PAI's own (`job-attempts/{a}/tasks`,
`logs?attempt=`) from 1 (services/rest/openpai_jobs.py). aiohttp matches in the order
routes are added: `job-attempts/healthz` comes before `job-attempts/{attempt}`.
"""

from __future__ import annotations

from aiohttp import web

from services.rest import job_handlers, job_metrics, job_tensorboard, jobs_api, openpai_jobs, terminal

JOB = "/api/v2/jobs/{job}"
TASK = JOB + "/attempts/{jobAttemptId}/taskRoles/{taskRoleName}/taskIndex/{taskIndex}/attempts"

ROUTES = [
    web.post("/api/v2/jobs", job_handlers.submit_job),
    web.get("/api/v2/jobs", jobs_api.list_jobs),
    web.get(JOB, job_handlers.get_job),
    web.delete(JOB, jobs_api.delete_job),  # PAI's: OpenPAI has no job deletion
    web.get(JOB + "/config", job_handlers.get_job_config),
    web.put(JOB + "/executionType", job_handlers.put_execution_type),
    web.get(JOB + "/logs", job_handlers.get_job_logs),  # PAI's: a task's log text
    web.put(JOB + "/tag", jobs_api.put_tag),
    web.delete(JOB + "/tag", jobs_api.delete_tag),
    web.get(JOB + "/events", jobs_api.get_job_events),
    web.get(JOB + "/metrics", job_metrics.get_job_metrics),  # PAI's: utilisation over time
    web.get(JOB + "/ssh", openpai_jobs.get_ssh_info),
    # PAI's: the job's TensorBoard, relayed by the launcher (services/rest/job_tensorboard.py).
    web.get(JOB + "/tensorboard", job_tensorboard.get_tensorboard),
    web.get(JOB + "/tensorboard/{tail:.*}", job_tensorboard.get_tensorboard),
    web.post(JOB + "/tensorboard/{tail:.*}", job_tensorboard.get_tensorboard),
    web.get(JOB + "/terminal", terminal.open_terminal),  # PAI's: a shell in a running task (WebSocket)
    # OpenPAI's job history: attempts numbered from 0.
    web.get(JOB + "/job-attempts/healthz", openpai_jobs.attempts_healthz),
    web.get(JOB + "/job-attempts", openpai_jobs.list_attempts),
    web.get(JOB + "/job-attempts/{attempt}", openpai_jobs.get_attempt),
    # PAI's own task routes: attempts numbered from 1.
    web.get(JOB + "/job-attempts/{attempt}/tasks/{role}/{index}", jobs_api.get_task),
    web.get(JOB + "/job-attempts/{attempt}/tasks/{role}/{index}/logs", jobs_api.get_task_log),
    # OpenPAI's attempt and task routes: attempts numbered from 0.
    web.get(JOB + "/attempts/{jobAttemptId}", openpai_jobs.get_job_at_attempt),
    web.get(TASK, openpai_jobs.get_task_attempts),
    web.get(TASK + "/{taskAttemptId}/logs", openpai_jobs.get_task_log_locations),
]
