"""Check a decoded job document against OpenPAI's protocol v2 schema.

Returns every problem found (not just the first) and the fields PAI keeps but
does not act on. The top level, prerequisites, deployments and defaults live
here; task roles and extras have their own modules.
"""

from __future__ import annotations

from collections.abc import Callable

from libs.common.ids import NAME_PATTERN
from libs.common.protocol.checks import Checker, Ignored
from libs.common.protocol.encodable import MESSAGE as UNENCODABLE_MESSAGE, RULE as UNENCODABLE_RULE, unencodable_paths
from libs.common.protocol.limits import MAX_JOB_NAME_LENGTH, MAX_JOB_RETRY_COUNT, MAX_NAME_LENGTH
from libs.common.protocol.model import FieldError
from libs.common.protocol.paths import DocPath, RawMapping
from libs.common.protocol.plugins import check_prerequisite_plugin
from libs.common.protocol.validate_extras import check_extras
from libs.common.protocol.validate_roles import check_task_roles

TOP_LEVEL_KEYS = frozenset({
    "protocolVersion", "name", "type", "version", "contributor", "description", "prerequisites", "parameters",
    "secrets", "jobRetryCount", "taskRoles", "deployments", "defaults", "extras",
})
PREREQUISITE_TYPES = ("dockerimage", "script", "data", "output")
# Only docker image prerequisites are closed by the schema; script, data and
# output prerequisites allow extra fields for the plugins that read them.
DOCKER_IMAGE_KEYS = frozenset({
    "protocolVersion", "name", "version", "contributor", "description", "type", "auth", "uri",
})
AUTH_KEYS = frozenset({"username", "password", "registryuri"})
DEPLOYMENT_KEYS = frozenset({"name", "taskRoles"})
DEPLOYMENT_ROLE_KEYS = frozenset({"preCommands", "postCommands"})
DEFAULTS_KEYS = frozenset({"virtualCluster", "deployment"})


def validate_document(data: RawMapping, line_of: Callable[[DocPath], int | None]) -> tuple[list[FieldError], list[Ignored]]:
    check = Checker(line_of)
    unencodable = unencodable_paths(data)
    if unencodable:
        # Refused alone: the other checks would quote these strings back in their messages.
        for path in unencodable:
            check.error(path, UNENCODABLE_RULE, UNENCODABLE_MESSAGE)
        return check.errors, []
    check.known_keys(data, (), TOP_LEVEL_KEYS)
    _check_header(check, data)
    for section in ("parameters", "secrets"):
        if section in data:
            check.mapping(data[section], (section,))
    if "jobRetryCount" in data:
        _check_job_retry_count(check, data["jobRetryCount"])
    prerequisite_types = _check_prerequisites(check, data)
    check_task_roles(check, data, prerequisite_types)
    deployment_names = _check_deployments(check, data)
    _check_defaults(check, data, deployment_names)
    check_extras(check, data)
    return check.errors, check.ignored


def _check_header(check: Checker, data: RawMapping) -> None:
    if "protocolVersion" not in data:
        check.error(("protocolVersion",), "required", "'protocolVersion' is required; use 2")
    else:
        _check_protocol_version(check, data["protocolVersion"], ("protocolVersion",))
    if "name" not in data:
        check.error(("name",), "required", "'name' is required: the job's name")
    else:
        _check_name(check, data["name"], ("name",), "job name", max_length=MAX_JOB_NAME_LENGTH)
    if "type" in data and data["type"] != "job":
        check.error(("type",), "enum", "must be 'job'")
    for key in ("version", "contributor", "description"):
        if key in data:
            check.text(data[key], (key,))


def _check_protocol_version(check: Checker, value: object, path: DocPath) -> None:
    # The schema allows the number 2 or the string "2"; `2.0` is the number 2 too.
    if isinstance(value, bool) or value not in (2, "2"):
        check.error(path, "enum", "must be 2 (this is protocol version 2)")


def _check_name(check: Checker, value: object, path: DocPath, what: str, *, max_length: int = MAX_NAME_LENGTH) -> bool:
    # Shorter than OpenPAI's 255: names become parts of file names, KV keys and subjects (limits.py).
    if not check.string(value, path, non_empty=True):
        return False
    return check.max_length(value, path, max_length, what) and check.pattern(value, path, NAME_PATTERN, what)


# OpenPAI's framework controller reads a negative retry count as "retry without
# limit" (-1 on failures, -2 always); marketplace serving jobs use -2.
UNLIMITED_RETRY_COUNTS = frozenset({-1, -2})


def _check_job_retry_count(check: Checker, value: object) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value in UNLIMITED_RETRY_COUNTS:
        check.ignore(("jobRetryCount",), f"OpenPAI's {value} means retry without limit; "
                     f"PAI retries at most {MAX_JOB_RETRY_COUNT} times")
        return
    check.integer(value, ("jobRetryCount",), minimum=0, maximum=MAX_JOB_RETRY_COUNT,
                  limit="PAI's limit of job retries")


def _check_prerequisites(check: Checker, data: RawMapping) -> dict[str, str]:
    """name -> type of every prerequisite well-formed enough to be referred to."""
    types: dict[str, str] = {}
    prerequisites = data.get("prerequisites", [])
    if not isinstance(prerequisites, list):
        check.error(("prerequisites",), "type", "must be a list of prerequisites")
        return types
    for index, prerequisite in enumerate(prerequisites):
        path: DocPath = ("prerequisites", index)
        if not check.mapping(prerequisite, path):
            continue
        kind = prerequisite.get("type")
        if kind not in PREREQUISITE_TYPES:
            rule, message = ("required", "'type' is required") if "type" not in prerequisite else (
                "enum", f"must be one of {', '.join(PREREQUISITE_TYPES)}")
            check.error((*path, "type"), rule, message)
            continue
        # The schema lets a data prerequisite go unnamed; every other kind needs a name.
        if kind != "data" or "name" in prerequisite:
            if "name" not in prerequisite:
                check.error((*path, "name"), "required", f"a {kind} prerequisite needs a 'name'")
            elif _check_name(check, prerequisite["name"], (*path, "name"), "prerequisite name"):
                name = prerequisite["name"]
                if name in types:
                    check.error((*path, "name"), "duplicate", f"another prerequisite is already named {name!r}")
                else:
                    types[name] = kind
        if "protocolVersion" in prerequisite:
            _check_protocol_version(check, prerequisite["protocolVersion"], (*path, "protocolVersion"))
        for key in ("version", "contributor", "description"):
            if key in prerequisite:
                check.text(prerequisite[key], (*path, key))
        if kind == "dockerimage":
            _check_docker_image(check, prerequisite, path)
        else:
            _check_plugin_prerequisite(check, prerequisite, path, kind)
    return types


def _check_docker_image(check: Checker, prerequisite: RawMapping, path: DocPath) -> None:
    check.known_keys(prerequisite, path, DOCKER_IMAGE_KEYS)
    if "uri" not in prerequisite:
        check.error((*path, "uri"), "required", "a dockerimage prerequisite needs the image 'uri'")
    else:
        check.string(prerequisite["uri"], (*path, "uri"), non_empty=True)
    if "auth" in prerequisite and check.mapping(prerequisite["auth"], (*path, "auth")):
        auth = prerequisite["auth"]
        check.known_keys(auth, (*path, "auth"), AUTH_KEYS)
        for key in AUTH_KEYS & auth.keys():
            check.string(auth[key], (*path, "auth", key))
        # Not ignored: the role's image is pulled with them (the job's secrets filled in) by
        # Kubernetes (a per-job imagePullSecret) and by the local backend's container mode
        # (the engine's X-Registry-Auth); where no engine runs the image, the job's notes
        # say the image was not used (rest's views), and with it its credentials.


def _check_plugin_prerequisite(check: Checker, prerequisite: RawMapping, path: DocPath, kind: str) -> None:
    if "uri" in prerequisite:
        if kind == "data":
            check.string_list(prerequisite["uri"], (*path, "uri"), non_empty=True)
        else:
            check.string(prerequisite["uri"], (*path, "uri"))
    check_prerequisite_plugin(check, prerequisite, path)
    if "require" in prerequisite:
        check.string_list(prerequisite["require"], (*path, "require"), non_empty=False)
    if "plugin" not in prerequisite:
        check.ignore(path, f"PAI does not fetch {kind} prerequisites; commands can still use "
                           f"<% ${kind}.uri %> and the other fields, and a cmd plugin's callbacks run")


def _check_deployments(check: Checker, data: RawMapping) -> set[str]:
    names: set[str] = set()
    if "deployments" not in data:
        return names
    deployments = data["deployments"]
    if not isinstance(deployments, list):
        check.error(("deployments",), "type", "must be a list of deployments")
        return names
    roles = data.get("taskRoles")
    if not isinstance(roles, dict):
        roles = {}
    for index, deployment in enumerate(deployments):
        path: DocPath = ("deployments", index)
        if not check.mapping(deployment, path):
            continue
        check.known_keys(deployment, path, DEPLOYMENT_KEYS)
        if "name" not in deployment:
            check.error((*path, "name"), "required", "a deployment needs a 'name'")
        elif check.string(deployment["name"], (*path, "name"), non_empty=True) and check.max_length(
                deployment["name"], (*path, "name"), MAX_NAME_LENGTH, "deployment name"):
            if deployment["name"] in names:
                check.error((*path, "name"), "duplicate", f"another deployment is already named {deployment['name']!r}")
            names.add(deployment["name"])
        if "taskRoles" in deployment and check.mapping(deployment["taskRoles"], (*path, "taskRoles")):
            for role, hooks in deployment["taskRoles"].items():
                where = (*path, "taskRoles", str(role))
                if role not in roles:
                    check.error(where, "unknown_task_role", f"{str(role)!r} is not a task role of this job")
                if not check.mapping(hooks, where):
                    continue
                check.known_keys(hooks, where, DEPLOYMENT_ROLE_KEYS)
                for key in DEPLOYMENT_ROLE_KEYS & hooks.keys():
                    check.string_list(hooks[key], (*where, key), non_empty=True)
    return names


def _check_defaults(check: Checker, data: RawMapping, deployment_names: set[str]) -> None:
    if "defaults" not in data or not check.mapping(data["defaults"], ("defaults",)):
        return
    defaults = data["defaults"]
    check.known_keys(defaults, ("defaults",), DEFAULTS_KEYS)
    if "virtualCluster" in defaults:
        _check_name(check, defaults["virtualCluster"], ("defaults", "virtualCluster"), "virtual cluster name")
    if "deployment" in defaults and check.string(defaults["deployment"], ("defaults", "deployment")):
        wanted = defaults["deployment"]
        if wanted not in deployment_names:
            known = ", ".join(sorted(deployment_names)) or "none"
            check.error(("defaults", "deployment"), "unknown_deployment",
                        f"{wanted!r} names no deployment of this job (defined: {known})")
