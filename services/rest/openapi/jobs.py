"""OpenAPI fragment: jobs, their attempts, tasks, logs, tags and events; virtual
clusters; the cluster's sku types; cluster info; the document itself.

Shapes PAI declares as Structs (services/rest/jobs_api.py) are generated from
them; the job detail and attempt views (services/rest/views.py) are dicts in
OpenPAI's shape and are described here by hand, listing the fields a client
relies on and allowing the rest.
"""

from __future__ import annotations

from typing import Any

from services.rest import jobs_api
from services.rest.history import query as history_query
from services.rest.openapi.common import (
    ERROR_SCHEMA,
    json_content,
    operation,
    path_param,
    query_param,
    ref,
    schemas_of,
)

_STRUCTS = (jobs_api.JobRow, jobs_api.JobPage, jobs_api.ClusterInfo, jobs_api.SkuTypeInfo,
            jobs_api.VirtualClusterDetail, jobs_api.JobEvents, jobs_api.Message,
            jobs_api.TagBody)
_, _GENERATED = schemas_of(*_STRUCTS)

_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STRING = {"type": ["string", "null"]}
_STATES = ["WAITING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED", "STOPPED"]

_EXIT_SPEC = {"type": ["object", "null"], "description": "OpenPAI exit spec: code, phrase, type, reaction, reason, "
              "solution, ...", "properties": {"code": {"type": "integer"}, "phrase": {"type": "string"}}}

TASK_STATUS = {
    "type": "object",
    "properties": {
        "taskIndex": {"type": "integer"},
        "taskState": {"type": "string", "enum": _STATES},
        "retries": {"type": "integer"},
        "containerIp": _NULLABLE_STRING,
        "containerNodeName": _NULLABLE_STRING,
        "containerPorts": {"type": "object"},
        "containerGpus": _NULLABLE_STRING,
        "containerExitCode": _NULLABLE_INT,
        "containerExitSpec": _EXIT_SPEC,
        "containerExitDiagnostics": _NULLABLE_STRING,
        "launchedTime": _NULLABLE_INT,
        "completedTime": _NULLABLE_INT,
        "taskAttempts": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["taskIndex", "taskState"],
}

TASK_ROLES = {
    "type": "object",
    "description": "task role name -> its status and task statuses",
    "additionalProperties": {
        "type": "object",
        "properties": {"taskRoleStatus": {"type": "object", "properties": {"name": {"type": "string"}}},
                       "taskStatuses": {"type": "array", "items": ref("TaskStatus")}},
        "required": ["taskRoleStatus", "taskStatuses"],
    },
}

JOB_DETAIL = {
    "type": "object",
    "description": "OpenPAI's job detail; diagnostics that quote the job's output only for its owner and admins",
    "properties": {
        "name": {"type": "string"},
        "jobStatus": {
            "type": "object",
            "properties": {
                "username": {"type": "string"},
                "state": {"type": "string", "enum": _STATES},
                "subState": {"type": "string"},
                "executionType": {"type": "string", "enum": ["START", "STOP"]},
                "retries": {"type": "integer"},
                "attempt": {"type": "integer"},
                "createdTime": _NULLABLE_INT,
                "completedTime": _NULLABLE_INT,
                "appLaunchedTime": _NULLABLE_INT,
                "virtualCluster": {"type": "string"},
                "priority": {"type": "integer"},
                "appExitCode": _NULLABLE_INT,
                "appExitSpec": _EXIT_SPEC,
                "appExitDiagnostics": _NULLABLE_STRING,
                "waitingReason": _NULLABLE_STRING,
            },
            "required": ["username", "state", "virtualCluster", "createdTime"],
        },
        "taskRoles": TASK_ROLES,
        "ignoredFields": {"type": "array", "items": {"type": "string"}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
        "marketplaceItem": {**_NULLABLE_STRING, "description": "the marketplace item the job was made from "
                                                               "(its extras.marketplaceItem)"},
    },
    "required": ["name", "jobStatus", "taskRoles"],
}

JOB_ATTEMPT = {
    "type": "object",
    "properties": {
        "attemptIndex": {"type": "integer", "description": "OpenPAI's number: 0 for the first attempt"},
        "attempt": {"type": "integer", "description": "PAI's number: 1 for the first attempt"},
        "isLatest": {"type": "boolean"},
        "state": {"type": "string", "enum": _STATES},
        "createdTime": _NULLABLE_INT,
        "launchedTime": _NULLABLE_INT,
        "completedTime": _NULLABLE_INT,
        "exitCode": _NULLABLE_INT,
        "exitSpec": _EXIT_SPEC,
        "endReason": {"type": "string"},
        "taskRoles": {"type": "object"},
    },
    "required": ["attemptIndex", "isLatest", "state", "taskRoles"],
}

SUBMITTED = {
    "type": "object",
    "properties": {
        "job": {"type": "string", "description": "the job id, user~name"},
        "name": {"type": "string"},
        "state": {"type": "string", "enum": ["WAITING"]},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "ignoredFields": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["job", "name", "state"],
}

JOB_PROTOCOL = {
    "type": "object",
    "description": "An OpenPAI job protocol v2 document (protocolVersion, name, type, prerequisites, parameters, "
                   "secrets, jobRetryCount, taskRoles, deployments, defaults, extras)",
    "properties": {"protocolVersion": {"type": ["integer", "string"]}, "name": {"type": "string"},
                   "type": {"type": "string"}, "taskRoles": {"type": "object"}},
    "required": ["protocolVersion", "name", "type", "taskRoles"],
}

SCHEMAS: dict[str, Any] = {
    **_GENERATED,
    "Error": ERROR_SCHEMA,
    "TaskStatus": TASK_STATUS,
    "JobDetail": JOB_DETAIL,
    "JobAttempt": JOB_ATTEMPT,
    "JobSubmitted": SUBMITTED,
    "JobProtocol": JOB_PROTOCOL,
}

_JOB = path_param("job", "the job id, `user~name`", {"type": "string", "pattern": "^[A-Za-z0-9_-]+~[A-Za-z0-9_-]+$"})
_ATTEMPT = path_param("attempt", "attempt number, 1 for the first", {"type": "integer", "minimum": 1})
_ROLE = path_param("role", "task role name", {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"})
_INDEX = path_param("index", "task index within its role, from 0", {"type": "integer", "minimum": 0})
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_JOBS = ["jobs"]
_CLUSTER = ["cluster"]
_TAG_BODY = {"required": True, "content": json_content(ref("TagBody"))}

_LIST_PARAMS = [
    query_param("username", "only this user's jobs"),
    query_param("vc", "only jobs of this virtual cluster"),
    query_param("state", "comma-separated states, e.g. WAITING,RUNNING"),
    query_param("keyword", "jobs whose id (user~name) contains this, any case"),
    query_param("tags", "comma-separated: jobs with at least one of these tags (OpenPAI: tagsContain)"),
    query_param("tagsContain", "as `tags`"),
    query_param("tagsNotContain", "comma-separated: jobs with none of these tags"),
    query_param("order", "`field,ASC|DESC`; field one of " + ", ".join(jobs_api.ORDER_FIELDS)
                + " (default submissionTime,DESC)"),
    query_param("offset", "rows to skip (default 0)", {"type": "integer", "minimum": 0, "maximum": jobs_api.MAX_LIST_OFFSET}),
    query_param("limit", f"rows to return, 1-{jobs_api.MAX_LIST_LIMIT} (default {jobs_api.DEFAULT_LIST_LIMIT})",
                {"type": "integer", "minimum": 1, "maximum": jobs_api.MAX_LIST_LIMIT}),
    query_param("withTotalCount", "true: answer {totalCount, data} instead of the bare list",
                {"type": "string", "enum": ["true", "false"]}),
]

PATHS: dict[str, Any] = {
    "/api/v2/jobs": {
        "post": operation(
            "Submit a job (OpenPAI protocol v2)", tags=_JOBS, fails=(400, 403, 404, 409, 413),
            description="YAML (`text/yaml`) or JSON. 400 names each bad field and rule, and refuses a job that "
                        "can never fit its virtual cluster even when empty; 404 NoVirtualClusterError for an "
                        "unknown VC; 409 when user~name exists.",
            body={"required": True, "content": {"text/yaml": {"schema": {"type": "string"}},
                                                 "application/json": {"schema": ref("JobProtocol")}}},
            ok={"202": {"description": "accepted; the job waits to be scheduled",
                        "content": json_content(ref("JobSubmitted"))}}),
        "get": operation(
            "List jobs", tags=_JOBS, fails=(400,), params=_LIST_PARAMS,
            description="Every user sees every job's row. The number of rows matching the filters is in the "
                        "`X-Total-Count` header (and in the body with withTotalCount=true). With a keyword the "
                        "count stops at " + f"{history_query.KEYWORD_TOTAL_MAX:,}" + " matches from the history "
                        "database: then `X-Total-Count-Capped: true` (and totalCountCapped in the body) says the "
                        "total is a lower bound.",
            ok={"200": {"description": "the page asked for",
                        "headers": {"X-Total-Count": {"schema": {"type": "integer"}},
                                    "X-Total-Count-Capped": {"schema": {"type": "string", "enum": ["true"]}}},
                        "content": json_content({"oneOf": [{"type": "array", "items": ref("JobRow")},
                                                           ref("JobPage")]})}}),
    },
    "/api/v2/jobs/{job}": {
        "get": operation("A job's status, tasks and why it waits", tags=_JOBS, fails=(404,), params=[_JOB],
                         ok={"200": {"description": "the job", "content": json_content(ref("JobDetail"))}}),
        "delete": operation("Delete a finished job: its records, logs and files (owner and admins); PAI's addition",
                            tags=_JOBS, fails=(403, 404, 409), params=[_JOB],
                            description="409 while the job is not finished (stop it first). Its name can be used "
                                        "again once the event stream's duplicate window (10 minutes) has passed.",
                            ok={"200": {"description": "deleted", "content": json_content(ref("Message"))}}),
    },
    "/api/v2/jobs/{job}/config": {
        "get": operation("The job as submitted, secrets masked (owner and admins)", tags=_JOBS, fails=(403, 404),
                         params=[_JOB],
                         ok={"200": {"description": "the job document (YAML with Accept: text/yaml)",
                                     "content": {**json_content({"type": "object"}),
                                                 "text/yaml": {"schema": {"type": "string"}}}}}),
    },
    "/api/v2/jobs/{job}/job-attempts": {
        "get": operation("Every attempt with its tasks, newest first (owner and admins)", tags=_JOBS,
                         fails=(403, 404), params=[_JOB],
                         ok={"200": {"description": "attempts",
                                     "content": json_content({"type": "array", "items": ref("JobAttempt")})}}),
    },
    "/api/v2/jobs/{job}/job-attempts/{attempt}": {
        "get": operation("One attempt with its task roles and task statuses (owner and admins)", tags=_JOBS,
                         fails=(400, 403, 404), params=[_JOB, _ATTEMPT],
                         ok={"200": {"description": "the attempt", "content": json_content(ref("JobAttempt"))}}),
    },
    "/api/v2/jobs/{job}/job-attempts/{attempt}/tasks/{role}/{index}": {
        "get": operation("One task of an attempt, with its earlier task attempts (owner and admins)", tags=_JOBS,
                         fails=(400, 403, 404), params=[_JOB, _ATTEMPT, _ROLE, _INDEX],
                         ok={"200": {"description": "the task", "content": json_content(ref("TaskStatus"))}}),
    },
    "/api/v2/jobs/{job}/job-attempts/{attempt}/tasks/{role}/{index}/logs": {
        "get": operation("A task's output in that attempt (owner and admins)", tags=_JOBS, fails=(400, 403, 404),
                         params=[_JOB, _ATTEMPT, _ROLE, _INDEX,
                                 query_param("tailBytes", "only the last N bytes", {"type": "integer", "minimum": 0}),
                                 query_param("taskAttempt", "the task's own retry, from 0 (default: its latest)",
                                             {"type": "integer", "minimum": 0})],
                         ok={"200": {"description": "the output, secrets masked", "content": _TEXT}}),
    },
    "/api/v2/jobs/{job}/logs": {
        "get": operation("A task's output in the current attempt (owner and admins)", tags=_JOBS,
                         fails=(400, 403, 404), params=[
                             _JOB, query_param("taskRole", "task role (default: the first)"),
                             query_param("taskIndex", "task index (default 0)", {"type": "integer", "minimum": 0}),
                             query_param("attempt", "attempt (default: the current)", {"type": "integer", "minimum": 1}),
                             query_param("tailBytes", "only the last N bytes", {"type": "integer", "minimum": 0}),
                             query_param("follow", "true: stream until the job ends", {"type": "string",
                                                                                       "enum": ["false"]})],
                         ok={"200": {"description": "the output, secrets masked", "content": _TEXT}}),
    },
    "/api/v2/jobs/{job}/executionType": {
        "put": operation("Stop a job (owner and admins)", tags=_JOBS, fails=(400, 403, 404), params=[_JOB],
                         body={"required": True, "content": json_content(
                             {"type": "object", "properties": {"value": {"type": "string", "enum": ["STOP"]}},
                              "required": ["value"]})},
                         ok={"202": {"description": "stop requested", "content": json_content(ref("Message"))}}),
    },
    "/api/v2/jobs/{job}/tag": {
        "put": operation("Tag a job (owner and admins)", tags=_JOBS, fails=(400, 403, 404), params=[_JOB],
                         body=_TAG_BODY,
                         ok={"200": {"description": "tagged (or already was)", "content": json_content(ref("Message"))}}),
        "delete": operation("Remove a tag (owner and admins)", tags=_JOBS, fails=(400, 403, 404), params=[_JOB],
                            body=_TAG_BODY,
                            ok={"200": {"description": "removed (or was not there)",
                                        "content": json_content(ref("Message"))}}),
    },
    "/api/v2/jobs/{job}/events": {
        "get": operation("What happened to a job: submission, state changes, failed tasks, why it waits "
                         "(owner and admins)", tags=_JOBS, fails=(400, 403, 404),
                         params=[_JOB, query_param("type", "Normal or Warning",
                                                   {"type": "string", "enum": ["Normal", "Warning"]})],
                         ok={"200": {"description": "events, oldest first", "content": json_content(ref("JobEvents"))}}),
    },
    "/api/v2/jobs/{job}/metrics": {
        "get": operation("A job's utilisation over time, per task and for the whole job, as columns for charts "
                         "(t, cpuPercent, memoryBytes; gpuPercent, gpus and gpuMemoryPercent where the node reads "
                         "its GPUs), whether it holds GPUs idle (gpuIdle) and its Grafana dashboard (grafanaUrl) "
                         "(owner and admins)", tags=_JOBS, fails=(400, 403, 404),
                         params=[_JOB,
                                 query_param("from", "only points at or after this time (Unix seconds)", {"type": "number"}),
                                 query_param("to", "only points at or before this time (Unix seconds)", {"type": "number"}),
                                 query_param("step", "merge points into steps of at least this many seconds",
                                             {"type": "number"})],
                         ok={"200": {"description": "per task and total series",
                                     "content": json_content({"type": "object", "required": ["job", "tasks", "total", "gpuIdle"],
                                                              "properties": {
                                                                  "job": {"type": "string"},
                                                                  "step": {"type": "number"},
                                                                  "tasks": {"type": "array", "items": {"type": "object"}},
                                                                  "total": {"type": "object"},
                                                                  "gpuIdle": {"type": "object"},
                                                                  "grafanaUrl": {"type": ["string", "null"]}}})}}),
    },
    "/api/v2/jobs/{job}/terminal": {
        "get": operation("A shell in a running task, over a WebSocket (owner and admins): binary frames are the "
                         "terminal's bytes both ways, a text frame {\"resize\": {\"cols\", \"rows\"}} resizes it, the "
                         "last text frame {\"closed\": why} says why it ended. A browser sends its token as the "
                         "subprotocol base64url.bearer.pai.<token in base64url> beside pai.terminal.v1. Each session "
                         "is in the job's events (TerminalOpened, TerminalClosed)", tags=_JOBS, fails=(400, 403, 404, 409),
                         params=[_JOB, query_param("taskRole", "the task's role (default: the first)"),
                                 query_param("taskIndex", "the task's index (default 0)", {"type": "integer"}),
                                 query_param("cols", "columns (default 80)", {"type": "integer"}),
                                 query_param("rows", "rows (default 24)", {"type": "integer"})],
                         ok={"101": {"description": "switched to the WebSocket protocol pai.terminal.v1"}}),
    },
    "/api/v2/jobs/{job}/tensorboard": {
        "get": operation("The job's TensorBoard (its owner alone): redirects to the same path with a slash, under "
                         "which TensorBoard's pages are served", tags=_JOBS, fails=(403, 404),
                         params=[_JOB], ok={"302": {"description": "to .../tensorboard/"}}),
    },
    "/api/v2/jobs/{job}/tensorboard/{tail}": {
        method: operation("TensorBoard's own pages and data API of the job (its owner alone; a browser tab sends "
                          "the pai_tensorboard cookie the portal sets on this path), relayed by the launcher from "
                          "the task that runs it", tags=_JOBS, fails=(403, 404, 409, 413, 503),
                          params=[_JOB, path_param("tail", "TensorBoard's own path")],
                          ok={"200": {"description": "what TensorBoard answered, in a content coding the "
                                                       "request's Accept-Encoding takes (none without one)"}})
        for method in ("get", "post")
    },
    "/api/v2/virtual-clusters": {
        "get": operation("Every virtual cluster: capacity, cells per sku (guaranteed, used, total), queue",
                         tags=_CLUSTER,
                         ok={"200": {"description": "VC name -> the VC",
                                     "content": json_content({"type": "object",
                                                              "additionalProperties": ref("VirtualClusterDetail")})}}),
    },
    "/api/v2/virtual-clusters/{vc}": {
        "get": operation("One virtual cluster: capacity, use, resources, queue", tags=_CLUSTER, fails=(404,),
                         params=[path_param("vc", "virtual cluster name")],
                         ok={"200": {"description": "the VC", "content": json_content(ref("VirtualClusterDetail"))}}),
    },
    "/api/v2/cluster/sku-types": {
        "get": operation("What one leaf cell of each sku offers", tags=_CLUSTER, fails=(404,),
                         params=[query_param("vc", "only the skus this virtual cluster has")],
                         ok={"200": {"description": "sku name -> cell resources (memory in MB)",
                                     "content": json_content({"type": "object",
                                                              "additionalProperties": ref("SkuTypeInfo")})}}),
    },
    "/api/v2/info": {
        "get": operation("Cluster info: name, version, launcher and authentication", tags=_CLUSTER, public=True,
                         ok={"200": {"description": "info", "content": json_content(ref("ClusterInfo"))}}),
    },
    "/api/v2/openapi.json": {
        "get": operation("This document", tags=["docs"], public=True,
                         ok={"200": {"description": "OpenAPI 3.1", "content": json_content({"type": "object"})}}),
    },
    "/api/v2/docs": {
        "get": operation("The API reference page (renders this document)", tags=["docs"], public=True,
                         ok={"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}),
    },
}
