"""What a task role actually runs: the active deployment's preCommands, the role's
commands, then the deployment's postCommands, with templates rendered, except
secret references, which the launcher fills in (see render.py).

These helpers read a document that may still hold errors (validation uses them
to find unknown references), so they skip anything of the wrong shape rather
than fail; validation reports those shapes separately.
"""

from __future__ import annotations

from libs.common.protocol.paths import DocPath, RawMapping
from libs.common.protocol.render import PREREQUISITE_ROOTS, TEMPLATE_START, RenderContext, has_secret_references, render


def prerequisites_by_name(data: RawMapping) -> dict[str, RawMapping]:
    found: dict[str, RawMapping] = {}
    prerequisites = data.get("prerequisites")
    if isinstance(prerequisites, list):
        for prerequisite in prerequisites:
            if isinstance(prerequisite, dict) and isinstance(prerequisite.get("name"), str):
                found.setdefault(prerequisite["name"], prerequisite)
    return found


def active_deployment(data: RawMapping) -> tuple[int, RawMapping] | None:
    """(index, deployment) named by defaults.deployment; None when no deployment is active."""
    defaults = data.get("defaults")
    wanted = defaults.get("deployment") if isinstance(defaults, dict) else None
    deployments = data.get("deployments")
    if not isinstance(wanted, str) or not isinstance(deployments, list):
        return None
    for index, deployment in enumerate(deployments):
        if isinstance(deployment, dict) and deployment.get("name") == wanted:
            return index, deployment
    return None


def role_context(data: RawMapping, role: RawMapping) -> RenderContext:
    by_name = prerequisites_by_name(data)
    selected = {}
    for kind in PREREQUISITE_ROOTS:
        wanted = role.get(kind)
        if isinstance(wanted, str) and by_name.get(wanted, {}).get("type") == kind:
            selected[kind] = by_name[wanted]
    parameters = data.get("parameters")
    secrets = data.get("secrets")
    return RenderContext(
        parameters=parameters if isinstance(parameters, dict) else {},
        secrets=secrets if isinstance(secrets, dict) else {},
        selected=selected,
    )


def command_templates(data: RawMapping, role_name: str) -> list[tuple[DocPath, str]]:
    """Every line the role runs, in order, with the path it was written at."""
    lines: list[tuple[DocPath, str]] = []
    role = data["taskRoles"][role_name]
    pre: list[tuple[DocPath, str]] = []
    post: list[tuple[DocPath, str]] = []
    active = active_deployment(data)
    if active is not None:
        index, deployment = active
        roles = deployment.get("taskRoles")
        hooks = roles.get(role_name) if isinstance(roles, dict) else None
        if isinstance(hooks, dict):
            base: DocPath = ("deployments", index, "taskRoles", role_name)
            pre = _strings(hooks.get("preCommands"), (*base, "preCommands"))
            post = _strings(hooks.get("postCommands"), (*base, "postCommands"))
    lines += pre
    lines += _strings(role.get("commands"), ("taskRoles", role_name, "commands"))
    lines += post
    return lines


def rendered_commands(data: RawMapping, role_name: str) -> list[str]:
    """The shell lines of a role, secret references kept; the document must already be valid."""
    templates = [template for _, template in command_templates(data, role_name)]
    if not any(TEMPLATE_START in template for template in templates):
        return templates  # the usual job: no template, no context to build
    context = role_context(data, data["taskRoles"][role_name])
    return [render(template, context, keep_secrets=True) for template in templates]


def referenced_secrets(data: RawMapping, commands: list[list[str]]) -> RawMapping:
    """The job's `secrets` when some role's rendered commands use them, else {}:
    a job that uses no secret has nothing to seal (and the launcher nothing to open)."""
    secrets = data.get("secrets")
    if not isinstance(secrets, dict) or not secrets:
        return {}
    return secrets if any(has_secret_references(lines) for lines in commands) else {}


def _strings(value: object, path: DocPath) -> list[tuple[DocPath, str]]:
    if not isinstance(value, list):
        return []
    return [((*path, index), item) for index, item in enumerate(value) if isinstance(item, str)]
