"""Checks of `taskRoles`: names, instances, completion, resources, commands and
the prerequisites a role names. The schema closes task roles and their inner
blocks (`additionalProperties: false`), so a misspelt key such as `gpus:` is an
error rather than a silently ignored field.
"""

from __future__ import annotations

from libs.common.protocol.checks import IDENTIFIER_PATTERN, Checker
from libs.common.protocol.commands import command_templates, role_context
from libs.common.protocol.paths import DocPath
from libs.common.protocol.render import unresolved

ROLE_KEYS = frozenset({
    "instances", "completion", "taskRetryCount", "prerequisites", "dockerImage", "data", "output", "script",
    "extraContainerOptions", "resourcePerInstance", "commands",
})
COMPLETION_KEYS = frozenset({"minFailedInstances", "minSucceededInstances"})
RESOURCE_KEYS = frozenset({"cpu", "memoryMB", "gpu", "ports"})
CONTAINER_OPTION_KEYS = frozenset({"shmMB", "infiniband"})


def check_task_roles(check: Checker, data: dict, prerequisite_types: dict[str, str]) -> None:
    """`prerequisite_types`: name -> type of every well-formed prerequisite."""
    if "taskRoles" not in data:
        check.error(("taskRoles",), "required", "'taskRoles' is required: a job needs at least one task role")
        return
    roles = data["taskRoles"]
    if not check.mapping(roles, ("taskRoles",)):
        return
    if not roles:
        check.error(("taskRoles",), "minProperties", "a job needs at least one task role")
    for name, role in roles.items():
        path: DocPath = ("taskRoles", str(name))
        if not isinstance(name, str):
            check.error(path, "pattern", "a task role name must be a name, not a number or boolean")
            continue
        if not check.pattern(name, path, IDENTIFIER_PATTERN, "task role name"):
            continue
        if check.mapping(role, path):
            _check_role(check, data, name, role, path, prerequisite_types)


def _check_role(check: Checker, data: dict, name: str, role: dict, path: DocPath,
                prerequisite_types: dict[str, str]) -> None:
    check.known_keys(role, path, ROLE_KEYS)
    instances = role.get("instances", 1)
    instances_ok = check.integer(instances, (*path, "instances"), minimum=1)
    if "completion" in role:
        _check_completion(check, role["completion"], (*path, "completion"), instances if instances_ok else None)
    if "taskRetryCount" in role:
        check.integer(role["taskRetryCount"], (*path, "taskRetryCount"), minimum=0)
    if "resourcePerInstance" in role:
        _check_resources(check, role["resourcePerInstance"], (*path, "resourcePerInstance"))
    if "extraContainerOptions" in role:
        _check_container_options(check, role["extraContainerOptions"], (*path, "extraContainerOptions"))
    _check_prerequisite_choices(check, role, path, prerequisite_types)
    if "commands" not in role:
        check.error((*path, "commands"), "required", "'commands' is required: the shell lines the task runs")
    else:
        check.string_list(role["commands"], (*path, "commands"), non_empty=True)
    _check_references(check, data, name, role)


def _check_completion(check: Checker, completion: object, path: DocPath, instances: int | None) -> None:
    if not check.mapping(completion, path):
        return
    check.known_keys(completion, path, COMPLETION_KEYS)
    for key in sorted(COMPLETION_KEYS & completion.keys()):
        value = completion[key]
        where = (*path, key)
        if not check.integer(value, where, minimum=-1):
            continue
        # -1 means "not because of this count"; 0 would end the job before any task ran.
        if value == 0:
            check.error(where, "minimum", "must be -1 or at least 1, got 0")
        elif instances is not None and value > instances:
            check.error(where, "maximum", f"must not be above the role's instances ({instances}), got {value}")


def _check_resources(check: Checker, resources: object, path: DocPath) -> None:
    if not check.mapping(resources, path):
        return
    check.known_keys(resources, path, RESOURCE_KEYS)
    for key in ("cpu", "memoryMB", "gpu"):
        if key in resources:
            check.integer(resources[key], (*path, key), minimum=0)
    if "ports" in resources and check.mapping(resources["ports"], (*path, "ports")):
        for label, count in resources["ports"].items():
            where = (*path, "ports", str(label))
            if isinstance(label, str) and check.pattern(label, where, IDENTIFIER_PATTERN, "port label"):
                check.integer(count, where, minimum=0)
            elif not isinstance(label, str):
                check.error(where, "pattern", "a port label must be a name")


def _check_container_options(check: Checker, options: object, path: DocPath) -> None:
    if not check.mapping(options, path):
        return
    if "shmMB" in options:
        check.integer(options["shmMB"], (*path, "shmMB"), minimum=0)
    if "infiniband" in options:
        check.boolean(options["infiniband"], (*path, "infiniband"))
    check.ignore(path, "container options (shared memory size, InfiniBand) are not applied by PAI")


def _check_prerequisite_choices(check: Checker, role: dict, path: DocPath, prerequisite_types: dict[str, str]) -> None:
    for key, kind in (("dockerImage", "dockerimage"), ("data", "data"), ("output", "output"), ("script", "script")):
        if key not in role or not check.string(role[key], (*path, key)):
            continue
        wanted = role[key]
        if prerequisite_types.get(wanted) != kind:
            defined = sorted(n for n, t in prerequisite_types.items() if t == kind)
            known = f"defined: {', '.join(defined)}" if defined else f"the job defines no {kind} prerequisite"
            check.error((*path, key), "unknown_prerequisite",
                        f"{wanted!r} is not a {kind} prerequisite of this job; {known}")
    if "prerequisites" in role and check.string_list(role["prerequisites"], (*path, "prerequisites"), non_empty=False):
        for index, wanted in enumerate(role["prerequisites"]):
            if wanted not in prerequisite_types:
                check.error((*path, "prerequisites", index), "unknown_prerequisite",
                            f"{wanted!r} names no prerequisite of this job")
        check.ignore((*path, "prerequisites"), "per-role prerequisite lists are not acted on by PAI")


def _check_references(check: Checker, data: dict, name: str, role: dict) -> None:
    context = role_context(data, role)
    for where, template in command_templates(data, name):
        for problem in unresolved(template, context):
            check.error(where, "unknown_reference", problem)
