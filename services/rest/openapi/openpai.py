"""The OpenPAI routes PAI serves beside its own (services/rest/openpai_jobs.py,
kubernetes_views.py, routes/cluster.py, identity/openpai.py). OpenPAI's routes number
job attempts from 0; PAI's own from 1 (docs/api.md)."""

from __future__ import annotations

from typing import Any

from services.rest.openapi.common import json_content, operation, path_param, query_param

_JOBS = ["jobs"]
_CLUSTER = ["cluster"]
_USERS = ["users"]
_GROUPS = ["groups"]
_TOKENS = ["tokens"]
_OBJECT = {"type": "object"}
_MESSAGE = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
_JOB = path_param("job", "the job id, user~name")
_OPENPAI_ATTEMPT = path_param("jobAttemptId", "OpenPAI's attempt number, from 0", {"type": "integer", "minimum": 0})
_TASK_PARAMS = [_JOB, _OPENPAI_ATTEMPT, path_param("taskRoleName", "task role"),
                path_param("taskIndex", "task index", {"type": "integer", "minimum": 0})]
_USER = path_param("user", "user name", {"type": "string", "pattern": "^[a-zA-Z0-9_-]+$"})
_GROUP = path_param("group", "group name", {"type": "string", "pattern": "^[a-zA-Z0-9_-]+$"})
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_K8S_LIST = {"type": "object", "required": ["kind", "apiVersion", "items"],
             "properties": {"kind": {"type": "string"}, "apiVersion": {"type": "string"},
                            "items": {"type": "array", "items": _OBJECT}}}


def _ok(status: int, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {str(status): {"description": description, "content": json_content(schema)}}


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"required": True, "content": json_content({"type": "object", "properties": properties,
                                                       "required": required})}


def _edit(summary: str, tags: list[str], params: list[dict[str, Any]], properties: dict[str, Any],
          required: list[str], fails: tuple[int, ...] = (400, 403, 404)) -> dict[str, Any]:
    return operation(summary, tags=tags, fails=fails, params=params, body=_body(properties, required),
                     ok=_ok(201, "changed", _MESSAGE))


_STR = {"type": "string"}
_STRS = {"type": "array", "items": _STR}
_DATA_USER = {"data": {"type": "object", "properties": {"username": _STR}, "required": ["username"]},
              "patch": {"type": "boolean"}}
_DATA_GROUP = {"data": {"type": "object", "properties": {"groupname": _STR}, "required": ["groupname"]},
               "patch": {"type": "boolean"}}

PATHS: dict[str, Any] = {
    "/api/v2": {"get": operation("OpenPAI's v2 banner", tags=_CLUSTER, public=True,
                                 ok={"200": {"description": "a line of text", "content": _TEXT}})},
    "/api/v1": {"get": operation("OpenPAI's v1 banner: what this server is (as /api/v2/info)", tags=_CLUSTER,
                                 public=True, ok=_ok(200, "info", _OBJECT))},
    "/api/v2/jobs/{job}/ssh": {
        "get": operation("OpenPAI's SSH info: each running task's SSH address, where it exposes an `ssh` port "
                         "(owner and admins)", tags=_JOBS, fails=(403, 404), params=[_JOB],
                         ok=_ok(200, "the SSH info", {"type": "object", "properties": {
                             "containers": {"type": "array", "items": _OBJECT}}, "required": ["containers"]})),
    },
    "/api/v2/jobs/{job}/job-attempts/healthz": {
        "get": operation("OpenPAI's probe of the job history (PAI's history database)", tags=_JOBS,
                         params=[_JOB],
                         ok={"200": {"description": "ok", "content": _TEXT},
                             "501": {"description": "the history database does not answer", "content": _TEXT}}),
    },
    "/api/v2/jobs/{job}/attempts/{jobAttemptId}": {
        "get": operation("The job as it was in one attempt (OpenPAI's number, from 0)", tags=_JOBS,
                         fails=(400, 403, 404), params=[_JOB, _OPENPAI_ATTEMPT],
                         ok=_ok(200, "the job detail of that attempt", _OBJECT)),
    },
    "/api/v2/jobs/{job}/attempts/{jobAttemptId}/taskRoles/{taskRoleName}/taskIndex/{taskIndex}/attempts": {
        "get": operation("One task of an attempt with its task attempts, OpenPAI's TaskStatus (owner and admins)",
                         tags=_JOBS, fails=(400, 403, 404), params=_TASK_PARAMS,
                         ok=_ok(200, "the task", {"type": "object", "required": ["taskIndex", "attempts"],
                                                  "properties": {"attempts": {"type": "array", "items": _OBJECT}}})),
    },
    "/api/v2/jobs/{job}/attempts/{jobAttemptId}/taskRoles/{taskRoleName}/taskIndex/{taskIndex}/attempts/"
    "{taskAttemptId}/logs": {
        "get": operation("Where a task attempt's logs are (OpenPAI's PodLogInfo; the URIs are PAI's task-log "
                         "route)", tags=_JOBS, fails=(400, 403, 404),
                         params=[*_TASK_PARAMS, path_param("taskAttemptId", "the task's attempt, from 0",
                                                           {"type": "integer", "minimum": 0}),
                                 query_param("tailMode", "true: the end of the log only")],
                         ok=_ok(200, "log locations", {"type": "object", "required": ["locations"], "properties": {
                             "locations": {"type": "array", "items": {"type": "object", "properties": {
                                 "name": _STR, "uri": _STR}}}}})),
    },
    "/api/v2/virtual-clusters/{vc}": {
        "put": operation("OpenPAI's VC creation: 400 NotImplementedError, as OpenPAI with HiveD (VCs are cells "
                         "in the cluster configuration)", tags=_CLUSTER, fails=(400, 403),
                         params=[path_param("vc", "virtual cluster name")], ok={}),
        "delete": operation("OpenPAI's VC removal: 400 NotImplementedError, as OpenPAI with HiveD", tags=_CLUSTER,
                            fails=(400, 403), params=[path_param("vc", "virtual cluster name")], ok={}),
    },
    "/api/v2/virtual-clusters/{vc}/status": {
        "put": operation("OpenPAI's VC stop or start: 400 NotImplementedError, as OpenPAI with HiveD",
                         tags=_CLUSTER, fails=(400, 403), params=[path_param("vc", "virtual cluster name")], ok={}),
    },
    "/api/v2/virtual-clusters/{vc}/sku-types": {
        "get": operation("The sku types of one virtual cluster", tags=_CLUSTER, fails=(404,),
                         params=[path_param("vc", "virtual cluster name")],
                         ok=_ok(200, "sku name -> cell resources", _OBJECT)),
    },
    "/api/v2/kubernetes/nodes": {
        "get": operation("The nodes as a Kubernetes NodeList (admins)", tags=_CLUSTER, fails=(403,),
                         ok=_ok(200, "NodeList", _K8S_LIST)),
    },
    "/api/v2/kubernetes/pods": {
        "get": operation("Every live task as a Pod of a Kubernetes PodList (admins)", tags=_CLUSTER, fails=(403,),
                         params=[query_param("namespace", "only this namespace (PAI's tasks are in `default`)")],
                         ok=_ok(200, "PodList", _K8S_LIST)),
    },
    "/api/v2/users/{user}/group": {
        "put": _edit("Add a user to a group (admins)", _USERS, [_USER], {"groupname": _STR}, ["groupname"]),
        "delete": _edit("Remove a user from a group (admins)", _USERS, [_USER], {"groupname": _STR}, ["groupname"]),
    },
    "/api/v2/users/{user}/grouplist": {
        "put": _edit("Set a user's groups (admins)", _USERS, [_USER], {"grouplist": _STRS}, ["grouplist"]),
    },
    "/api/v2/users/{user}/extension": {
        "put": _edit("Merge into a user's extension (self or admins); its jobStatusChangeNotification (true, or states to "
                     "booleans) is the status mail of the user's jobs that do not say", _USERS, [_USER], {"extension": _OBJECT},
                     ["extension"]),
    },
    "/api/v2/users/{user}/virtualcluster": {
        "put": _edit("Grant a user these VCs through the groups named after them (admins)", _USERS, [_USER],
                     {"virtualCluster": _STRS}, ["virtualCluster"]),
    },
    "/api/v2/users/{user}/password": {
        "put": _edit("Change a user's password (self with oldPassword, or admins)", _USERS, [_USER],
                     {"oldPassword": _STR, "newPassword": _STR}, ["newPassword"], fails=(400, 401, 403, 404)),
    },
    "/api/v2/users/{user}/email": {
        "put": _edit("Change a user's email (self or admins)", _USERS, [_USER], {"email": _STR}, ["email"]),
    },
    "/api/v2/users/{user}/admin": {
        "put": _edit("Make a user an admin or not (admins)", _USERS, [_USER], {"admin": {"type": "boolean"}},
                     ["admin"]),
    },
    "/api/v2/users": {
        "put": _edit("Change a user in OpenPAI's {data, patch} body (admins)", _USERS, [], _DATA_USER, ["data"]),
    },
    "/api/v2/groups": {
        "put": _edit("Change a group in OpenPAI's {data, patch} body (admins)", _GROUPS, [], _DATA_GROUP, ["data"]),
    },
    "/api/v2/groups/{group}/extension": {
        "put": _edit("Replace a group's extension (admins)", _GROUPS, [_GROUP], {"extension": _OBJECT},
                     ["extension"]),
    },
    "/api/v2/groups/{group}/extension/{path}": {
        "put": _edit("Set one attribute of a group's extension, e.g. acls/virtualClusters (admins)", _GROUPS,
                     [_GROUP, path_param("path", "the attribute's path, a/b/c")], {"data": {}}, ["data"]),
    },
    "/api/v2/groups/{group}/description": {
        "put": _edit("Change a group's description (admins)", _GROUPS, [_GROUP], {"description": _STR},
                     ["description"]),
    },
    "/api/v2/groups/{group}/externalname": {
        "put": _edit("Change the directory group a group maps to (admins)", _GROUPS, [_GROUP],
                     {"externalName": _STR}, ["externalName"]),
    },
    "/api/v2/tokens/application": {
        "post": operation("Make an application token (OpenPAI's)", tags=_TOKENS,
                          ok=_ok(200, "made", {"type": "object", "required": ["token", "application"], "properties": {
                              "token": _STR, "application": {"type": "boolean"}}})),
    },
    "/api/v2/tokens/check": {
        "get": operation("Who this token is", tags=_TOKENS,
                         ok=_ok(200, "the token's user", {"type": "object", "required": ["username"],
                                                          "properties": {"username": _STR}})),
    },
}
