"""Checks of `taskRoles`: names, instances, completion, resources, commands and
the prerequisites a role names. The schema closes task roles and their inner
blocks (`additionalProperties: false`), so a misspelt key such as `gpus:` is an
error rather than a silently ignored field.
"""

from __future__ import annotations

from libs.common.protocol.checks import IDENTIFIER_PATTERN, Checker
from libs.common.protocol.commands import command_templates, prerequisites_by_name, role_context
from libs.common.protocol.limits import (
    MAX_COMMANDS_CHARS_PER_ROLE,
    MAX_CPU,
    MAX_GPU,
    MAX_INSTANCES_PER_ROLE,
    MAX_MEMORY_MB,
    MAX_NAME_LENGTH,
    MAX_PORTS_PER_INSTANCE,
    MAX_SHM_MB,
    MAX_TASK_RETRY_COUNT,
    MAX_TASK_ROLE_NAME_LENGTH,
    MAX_TASK_ROLES,
    MAX_TASKS_PER_JOB,
)
from libs.common.protocol.paths import DocPath, RawMapping
from libs.common.protocol.plugins import step_templates
from libs.common.protocol.render import TEMPLATE, TEMPLATE_START, RenderContext, UnknownReference, render, unresolved

ROLE_KEYS = frozenset({
    "instances", "completion", "taskRetryCount", "prerequisites", "dockerImage", "data", "output", "script",
    "extraContainerOptions", "resourcePerInstance", "commands",
})
COMPLETION_KEYS = frozenset({"minFailedInstances", "minSucceededInstances"})
# OpenPAI's earlier names of the same two counts, still in marketplace job files.
COMPLETION_ALIASES = {"minFailedTaskCount": "minFailedInstances", "minSucceededTaskCount": "minSucceededInstances"}
RESOURCE_KEYS = frozenset({"cpu", "memoryMB", "gpu", "ports"})
RESOURCE_MAXIMA = {
    "cpu": (MAX_CPU, "PAI's limit of CPUs per task instance"),
    "memoryMB": (MAX_MEMORY_MB, "PAI's limit of memory per task instance"),
    "gpu": (MAX_GPU, "PAI's limit of GPUs per task instance"),
}


def check_task_roles(check: Checker, data: RawMapping, prerequisite_types: dict[str, str]) -> None:
    """`prerequisite_types`: name -> type of every well-formed prerequisite."""
    if "taskRoles" not in data:
        check.error(("taskRoles",), "required", "'taskRoles' is required: a job needs at least one task role")
        return
    roles = data["taskRoles"]
    if not check.mapping(roles, ("taskRoles",)):
        return
    if not roles:
        check.error(("taskRoles",), "minProperties", "a job needs at least one task role")
    if len(roles) > MAX_TASK_ROLES:
        check.error(("taskRoles",), "maxProperties",
                    f"a job has at most {MAX_TASK_ROLES} task roles (PAI's limit), got {len(roles)}")
        return  # each role's own checks would only bury this one
    for name, role in roles.items():
        path: DocPath = ("taskRoles", str(name))
        if not isinstance(name, str):
            check.error(path, "pattern", "a task role name must be a name, not a number or boolean")
            continue
        if not check.max_length(name, path, MAX_TASK_ROLE_NAME_LENGTH, "task role name"):
            continue
        if not check.pattern(name, path, IDENTIFIER_PATTERN, "task role name"):
            continue
        if check.mapping(role, path):
            _check_role(check, data, name, role, path, prerequisite_types)
    _check_task_count(check, roles)


def _check_task_count(check: Checker, roles: RawMapping) -> None:
    """All instances of all roles: one job travels as one NATS message (limits.py)."""
    counts = [role.get("instances", 1) if isinstance(role, dict) else 1 for role in roles.values()]
    if not all(isinstance(count, int) and not isinstance(count, bool) and count >= 1 for count in counts):
        return  # reported on the role
    if sum(counts) > MAX_TASKS_PER_JOB:
        check.error(("taskRoles",), "maxTasks",
                    f"a job has at most {MAX_TASKS_PER_JOB} tasks in all (PAI's limit), got {sum(counts)}")


def _check_role(check: Checker, data: RawMapping, name: str, role: RawMapping, path: DocPath,
                prerequisite_types: dict[str, str]) -> None:
    check.known_keys(role, path, ROLE_KEYS)
    instances = role.get("instances", 1)
    instances_ok = check.integer(instances, (*path, "instances"), minimum=1, maximum=MAX_INSTANCES_PER_ROLE,
                                 limit="PAI's limit of instances per task role")
    if "completion" in role:
        _check_completion(check, role["completion"], (*path, "completion"), instances if instances_ok else None)
    if "taskRetryCount" in role:
        check.integer(role["taskRetryCount"], (*path, "taskRetryCount"), minimum=0, maximum=MAX_TASK_RETRY_COUNT,
                      limit="PAI's limit of task retries")
    if "resourcePerInstance" in role:
        _check_resources(check, role["resourcePerInstance"], (*path, "resourcePerInstance"))
    if "extraContainerOptions" in role:
        _check_container_options(check, role["extraContainerOptions"], (*path, "extraContainerOptions"))
    _check_prerequisite_choices(check, data, role, path, prerequisite_types)
    if "commands" not in role:
        check.error((*path, "commands"), "required", "'commands' is required: the shell lines the task runs")
    else:
        check.string_list(role["commands"], (*path, "commands"), non_empty=True)
    if _check_references(check, data, name, role):
        _check_commands_length(check, data, name, role, (*path, "commands"))


def _check_completion(check: Checker, completion: object, path: DocPath, instances: int | None) -> None:
    if not check.mapping(completion, path):
        return
    check.known_keys(completion, path, COMPLETION_KEYS | COMPLETION_ALIASES.keys())
    for alias, name in COMPLETION_ALIASES.items():
        if alias in completion and name in completion:
            check.error((*path, alias), "duplicate", f"{alias} is the older name of {name}; give one of them")
    for key in sorted((COMPLETION_KEYS | COMPLETION_ALIASES.keys()) & completion.keys()):
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
    for key, (maximum, limit) in RESOURCE_MAXIMA.items():
        if key in resources:
            # memoryMB 0 is refused, not read as "no limit": every task's memory is bounded.
            check.integer(resources[key], (*path, key), minimum=1 if key == "memoryMB" else 0, maximum=maximum,
                          limit=limit)
    if "ports" in resources and check.mapping(resources["ports"], (*path, "ports")):
        total = 0
        for label, count in resources["ports"].items():
            where = (*path, "ports", str(label))
            if not isinstance(label, str):
                check.error(where, "pattern", "a port label must be a name")
            elif (check.max_length(label, where, MAX_NAME_LENGTH, "port label")
                  and check.pattern(label, where, IDENTIFIER_PATTERN, "port label")
                  and check.integer(count, where, minimum=0, maximum=MAX_PORTS_PER_INSTANCE,
                                    limit="PAI's limit of ports per task instance")):
                total += count
        if total > MAX_PORTS_PER_INSTANCE:
            check.error((*path, "ports"), "maximum",
                        f"at most {MAX_PORTS_PER_INSTANCE} ports per task instance in all (PAI's limit), got {total}")


def _check_container_options(check: Checker, options: object, path: DocPath) -> None:
    if not check.mapping(options, path):
        return
    if "shmMB" in options:
        check.integer(options["shmMB"], (*path, "shmMB"), minimum=0, maximum=MAX_SHM_MB,
                      limit="PAI's limit of shared memory")
    if "infiniband" in options:
        check.boolean(options["infiniband"], (*path, "infiniband"))
    if "hostNetwork" in options:  # PAI's: the task's Pod on its node's network (Kubernetes backend)
        check.boolean(options["hostNetwork"], (*path, "hostNetwork"))
    check.ignore(path, "container options (shared memory size, InfiniBand) are not applied by PAI")


def _check_prerequisite_choices(check: Checker, data: RawMapping, role: RawMapping, path: DocPath,
                                prerequisite_types: dict[str, str]) -> None:
    plugin_prerequisites = {name for name, p in prerequisites_by_name(data).items() if "plugin" in p}
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
        if not any(isinstance(p, str) and p in prerequisite_types and p in plugin_prerequisites
                   for p in role["prerequisites"]):
            check.ignore((*path, "prerequisites"), "PAI acts only on the listed prerequisites that carry "
                         "a cmd runtime plugin (their callbacks); these carry none")


def _check_references(check: Checker, data: RawMapping, name: str, role: RawMapping) -> bool:
    """True when every template of the role's commands resolves."""
    templates = [(where, line) for where, line in command_templates(data, name) + step_templates(data, name)
                 if TEMPLATE_START in line]
    if not templates:
        return True  # the usual job: nothing to resolve, no context to build
    context = role_context(data, role)
    ok = True
    for where, template in templates:
        for problem in unresolved(template, context):
            check.error(where, "unknown_reference", problem)
            ok = False
    return ok


def _check_commands_length(check: Checker, data: RawMapping, name: str, role: RawMapping, path: DocPath) -> None:
    """The role's commands as they will run, templates rendered, counted without rendering
    more than the limit: a small document can name a large parameter thousands of times."""
    context = None
    total = 0
    for _, line in command_templates(data, name) + step_templates(data, name):
        total += len(line)
        if TEMPLATE_START in line:  # the context is built only for a role whose commands use templates
            if context is None:
                context = role_context(data, role)
            for match in TEMPLATE.finditer(line):
                total += _rendered_length(match.group(0), context) - len(match.group(0))
                if total > MAX_COMMANDS_CHARS_PER_ROLE:
                    break
        if total > MAX_COMMANDS_CHARS_PER_ROLE:
            check.error(path, "maxLength",
                        f"a task role's commands, rendered and with its deployment's pre- and post-commands, "
                        f"are at most {MAX_COMMANDS_CHARS_PER_ROLE} characters (PAI's limit); these are longer")
            return


def _rendered_length(template: str, context: RenderContext) -> int:
    try:
        return len(render(template, context))
    except UnknownReference:  # reported by _check_references
        return len(template)
