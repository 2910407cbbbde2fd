"""OpenPAI's runtime plugins that PAI runs: `cmd` and `teamwise_storage`.

A job names plugins in `extras.com.microsoft.pai.runtimeplugin` (a list of
`{plugin, parameters, failurePolicy, taskroles}`), and a `script`, `data` or
`output` prerequisite with `plugin: com.microsoft.pai.runtimeplugin.cmd` is a
plugin too (its `callbacks` are the plugin's), for the task roles that select
it (`prerequisites:`, or the role's `script`/`data`/`output`). As OpenPAI's
runtime does (openpai-runtime, init.d/initializer.py and runtime.d/runtime_entry.sh):

- the plugins of a role are its prerequisites' first, in the role's order, then
  those of `extras` (a plugin with `taskroles` only for those roles);
- each plugin's pre-commands run before the role's commands, in that order; its
  post-commands after them, in the reverse order, and only when the commands
  succeeded;
- `cmd`'s parameters are `preCommands`/`postCommands`, or `callbacks` (a list of
  `{event, commands}`: `containerStarts`/`taskStarts` before, `containerEnds`/
  `taskSucceeds` after); templates (`<% $data.uri[0] %>`, `<% $secrets.x %>`)
  are rendered as in the role's commands.

Each plugin's pre (or post) commands run in a subshell of their own, stopping at
the first failure (a variable they set does not reach the role's commands: in
OpenPAI they are scripts of their own). A failure ends the task with exit code
`RUNTIME_PLUGIN_FAILED_EXIT_CODE` after a line naming the plugin
(libs/common/exitspecs.py), which the runtime's rule of that code explains;
`failurePolicy: ignore` logs the failure and goes on. The commands are folded
into the role's commands here, so every backend (processes, containers, Pods)
runs them the same way.

`teamwise_storage` names the storages the job mounts (`storageConfigNames`);
rest resolves them (libs/common/storages.py). `ssh` is checked here and folded
in by rest with the job's keys (libs/common/protocol/ssh.py), `tensorboard` likewise
(libs/common/protocol/tensorboard.py). Other plugins (git, ...) are kept and reported
as not run.
"""

from __future__ import annotations

import shlex

import msgspec

from libs.common.protocol.checks import Checker
from libs.common.protocol.commands import prerequisites_by_name, role_context
from libs.common.protocol.document import type_name
from libs.common.protocol.paths import DocPath, RawMapping
from libs.common.protocol.render import TEMPLATE_START, render
from libs.common.protocol.ssh import SSH, check_ssh_parameters
from libs.common.protocol.tensorboard import TENSORBOARD, check_tensorboard_parameters

PLUGINS_KEY = "com.microsoft.pai.runtimeplugin"
PREREQUISITE_PLUGIN_PREFIX = PLUGINS_KEY + "."
CMD = "cmd"
STORAGE = "teamwise_storage"
PLUGIN_KEYS = frozenset({"plugin", "parameters", "failurePolicy", "taskroles", "taskRoles"})
FAILURE_POLICIES = ("fail", "ignore")
PRE_EVENTS = frozenset({"containerStarts", "taskStarts"})
POST_EVENTS = frozenset({"containerEnds", "taskSucceeds"})
NOT_RUN = "runtime plugin {name!r} is not run by PAI (PAI runs cmd, ssh, tensorboard and teamwise_storage)"


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """The pre- or post-commands of one plugin for one task role."""

    name: str  # what the task's log and exit spec call it
    templates: list[tuple[DocPath, str]]
    ignore_failure: bool = False


# --- validation --------------------------------------------------------------------------------


def check_runtime_plugins(check: Checker, value: object, path: DocPath, data: RawMapping) -> None:
    """`extras.com.microsoft.pai.runtimeplugin`: a list of plugins; cmd and teamwise_storage checked."""
    if not isinstance(value, list):
        check.error(path, "type", f"must be a list of runtime plugins, not {type_name(value)}")
        return
    job_roles = data.get("taskRoles")
    roles: RawMapping = job_roles if isinstance(job_roles, dict) else {}
    for index, plugin in enumerate(value):
        where: DocPath = (*path, index)
        if not check.mapping(plugin, where):
            continue
        if "plugin" not in plugin:
            check.error((*where, "plugin"), "required", "a runtime plugin names its 'plugin'")
            continue
        if not check.string(plugin["plugin"], (*where, "plugin"), non_empty=True):
            continue
        name = plugin["plugin"]
        if name not in (CMD, STORAGE, SSH, TENSORBOARD):
            check.ignore(where, NOT_RUN.format(name=name[:64]))
            continue
        check.known_keys(plugin, where, PLUGIN_KEYS)
        _check_failure_policy(check, plugin, where)
        for key in ("taskroles", "taskRoles"):
            if key in plugin and check.string_list(plugin[key], (*where, key), non_empty=False):
                for i, role in enumerate(plugin[key]):
                    if role not in roles:
                        check.error((*where, key, i), "unknown_task_role", f"{role!r} is not a task role of this job")
        parameters = plugin.get("parameters", {})
        if parameters is None:
            parameters = {}
        if not check.mapping(parameters, (*where, "parameters")):
            continue
        if name == STORAGE:
            check.known_keys(parameters, (*where, "parameters"), ("storageConfigNames",))
            if "storageConfigNames" in parameters:
                check.string_list(parameters["storageConfigNames"], (*where, "parameters", "storageConfigNames"),
                                  non_empty=False)
        elif name == SSH:  # libs/common/protocol/ssh.py
            check_ssh_parameters(check, parameters, (*where, "parameters"))
        elif name == TENSORBOARD:  # libs/common/protocol/tensorboard.py
            check_tensorboard_parameters(check, parameters, (*where, "parameters"))
        else:
            _check_cmd_parameters(check, parameters, (*where, "parameters"))


def check_prerequisite_plugin(check: Checker, prerequisite: RawMapping, path: DocPath) -> None:
    """A script/data/output prerequisite's `plugin` and `callbacks` (OpenPAI's cmd plugin)."""
    if "plugin" not in prerequisite:
        if "callbacks" in prerequisite:
            check.ignore((*path, "callbacks"), "callbacks run only with plugin: com.microsoft.pai.runtimeplugin.cmd")
        return
    if not check.string(prerequisite["plugin"], (*path, "plugin"), non_empty=True):
        return
    plugin = prerequisite["plugin"]
    if plugin != PREREQUISITE_PLUGIN_PREFIX + CMD:
        check.ignore((*path, "plugin"), NOT_RUN.format(name=plugin[:80]))
        return
    _check_failure_policy(check, prerequisite, path)
    _check_cmd_parameters(check, prerequisite, path, only_callbacks=True)


def _check_failure_policy(check: Checker, plugin: RawMapping, path: DocPath) -> None:
    if "failurePolicy" in plugin and plugin["failurePolicy"] not in FAILURE_POLICIES:
        check.error((*path, "failurePolicy"), "enum", f"must be one of {', '.join(FAILURE_POLICIES)}")


def _check_cmd_parameters(check: Checker, parameters: RawMapping, path: DocPath, *, only_callbacks: bool = False) -> None:
    if "callbacks" in parameters:
        if not only_callbacks:
            for key in ("preCommands", "postCommands"):
                if key in parameters:
                    check.error((*path, key), "exclusive", "give either callbacks or preCommands/postCommands")
        callbacks = parameters["callbacks"]
        if not isinstance(callbacks, list):
            check.error((*path, "callbacks"), "type", "must be a list of {event, commands}")
            return
        events = sorted(PRE_EVENTS | POST_EVENTS)
        for i, callback in enumerate(callbacks):
            where: DocPath = (*path, "callbacks", i)
            if not check.mapping(callback, where):
                continue
            check.known_keys(callback, where, ("event", "commands"))
            if callback.get("event") not in PRE_EVENTS | POST_EVENTS:
                check.error((*where, "event"), "enum", f"must be one of {', '.join(events)}")
            if check.required(callback, where, ("commands",)):
                check.string_list(callback["commands"], (*where, "commands"), non_empty=False)
    elif not only_callbacks:
        for key in ("preCommands", "postCommands"):
            if key in parameters:
                check.string_list(parameters[key], (*path, key), non_empty=False)


# --- what a role runs --------------------------------------------------------------------------


def storage_config_names(data: RawMapping) -> list[str] | None:
    """teamwise_storage's storageConfigNames over the job's plugins; None: no such plugin."""
    names: list[str] | None = None
    for plugin in _extras_plugins(data):
        if plugin.get("plugin") == STORAGE:
            parameters = plugin.get("parameters") or {}
            wanted = parameters.get("storageConfigNames") if isinstance(parameters, dict) else None
            names = (names or []) + [n for n in (wanted if isinstance(wanted, list) else []) if isinstance(n, str)]
    return None if names is None else list(dict.fromkeys(names))


def _extras_plugins(data: RawMapping) -> list[RawMapping]:
    extras = data.get("extras")
    plugins = extras.get(PLUGINS_KEY) if isinstance(extras, dict) else None
    return [p for p in plugins if isinstance(p, dict)] if isinstance(plugins, list) else []


def role_steps(data: RawMapping, role_name: str) -> tuple[list[Step], list[Step]]:
    """(pre, post) steps of a role in the order they run; templates unrendered, with their paths."""
    role = data["taskRoles"][role_name]
    by_name = prerequisites_by_name(data)
    prerequisites = data.get("prerequisites")
    index_of = {id(p): i for i, p in enumerate(prerequisites if isinstance(prerequisites, list) else [])}
    selected: list[str] = []
    listed = role.get("prerequisites")
    for name in (listed if isinstance(listed, list) else []) + [role.get(k) for k in ("script", "data", "output")]:
        if isinstance(name, str) and name in by_name and name not in selected:
            selected.append(name)
    pre: list[Step] = []
    post: list[Step] = []
    for name in selected:
        prerequisite = by_name[name]
        if prerequisite.get("plugin") != PREREQUISITE_PLUGIN_PREFIX + CMD:
            continue
        base: DocPath = ("prerequisites", index_of[id(prerequisite)])
        what = f"prerequisite {name} ({prerequisite.get('type')}, cmd plugin)"
        ignore = prerequisite.get("failurePolicy") == "ignore"
        before, after = _callbacks(prerequisite.get("callbacks"), base)
        if before:
            pre.append(Step(name=f"{what} taskStarts", templates=before, ignore_failure=ignore))
        if after:
            post.append(Step(name=f"{what} taskSucceeds", templates=after, ignore_failure=ignore))
    for index, plugin in enumerate(_extras_plugins(data)):
        if plugin.get("plugin") != CMD:
            continue
        roles = plugin.get("taskroles", plugin.get("taskRoles"))
        if isinstance(roles, list) and role_name not in roles:
            continue
        base = ("extras", PLUGINS_KEY, index, "parameters")
        parameters = plugin.get("parameters") or {}
        if not isinstance(parameters, dict):
            continue
        what = f"runtime plugin cmd (extras.{PLUGINS_KEY}[{index}])"
        ignore = plugin.get("failurePolicy") == "ignore"
        if "callbacks" in parameters:
            before, after = _callbacks(parameters["callbacks"], base)
        else:
            before = _lines(parameters.get("preCommands"), (*base, "preCommands"))
            after = _lines(parameters.get("postCommands"), (*base, "postCommands"))
        if before:
            pre.append(Step(name=f"{what} preCommands", templates=before, ignore_failure=ignore))
        if after:
            post.append(Step(name=f"{what} postCommands", templates=after, ignore_failure=ignore))
    post.reverse()  # OpenPAI inserts each plugin's post script first
    return pre, post


def step_templates(data: RawMapping, role_name: str) -> list[tuple[DocPath, str]]:
    """Every plugin command a role runs, with its path (for the checks of references and lengths)."""
    pre, post = role_steps(data, role_name)
    return [template for step in pre + post for template in step.templates]


def with_steps(data: RawMapping, role_name: str, commands: list[str]) -> list[str]:
    """The role's commands with its plugins' pre- and post-commands around them, rendered
    (secret references kept, as in the commands); the document must be valid."""
    pre, post = role_steps(data, role_name)
    if not pre and not post:
        return commands
    context = role_context(data, data["taskRoles"][role_name])

    def lines(step: Step) -> list[str]:
        return [render(t, context, keep_secrets=True) if TEMPLATE_START in t else t for _, t in step.templates]

    return [*(shell_step(s.name, lines(s), s.ignore_failure) for s in pre), *commands,
            *(shell_step(s.name, lines(s), s.ignore_failure) for s in post)]


def shell_step(name: str, lines: list[str], ignore_failure: bool = False) -> str:
    """One plugin's commands as one shell line of the task's `bash -e` script.

    In a subshell started with `&` and waited for: a subshell in `if`/`||` would
    run with errexit off; this one keeps it (the first failing command ends it) and
    `wait` hands its status to the `||`."""
    # Here, not at the top: exitspecs imports messages, which imports this package.
    from libs.common.exitspecs import RUNTIME_PLUGIN_FAILED_EXIT_CODE, runtime_plugin_failed_line

    body = "\n".join(lines)
    if ignore_failure:  # not the marker: the task goes on, and its end is not this plugin's
        line = shlex.quote(f"[PAI] {name} failed, ignored (failurePolicy: ignore)")
        on_failure = f"__pai_rc=$?; printf '%s (exit code %s)\\n' {line} \"$__pai_rc\" >&2"
    else:
        line = shlex.quote(runtime_plugin_failed_line(name))
        on_failure = (f"__pai_rc=$?; printf '%s (exit code %s)\\n' {line} \"$__pai_rc\" >&2; "
                      f"exit {RUNTIME_PLUGIN_FAILED_EXIT_CODE}")
    return f"(\n{body}\n) & wait $! || {{ {on_failure}; }}"


def _callbacks(value: object, base: DocPath) -> tuple[list[tuple[DocPath, str]], list[tuple[DocPath, str]]]:
    before: list[tuple[DocPath, str]] = []
    after: list[tuple[DocPath, str]] = []
    for i, callback in enumerate(value if isinstance(value, list) else []):
        if not isinstance(callback, dict):
            continue
        lines = _lines(callback.get("commands"), (*base, "callbacks", i, "commands"))
        if callback.get("event") in PRE_EVENTS:
            before += lines
        elif callback.get("event") in POST_EVENTS:
            after += lines
    return before, after


def _lines(value: object, path: DocPath) -> list[tuple[DocPath, str]]:
    if not isinstance(value, list):
        return []
    return [((*path, i), item) for i, item in enumerate(value) if isinstance(item, str)]
