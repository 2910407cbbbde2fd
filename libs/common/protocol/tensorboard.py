"""OpenPAI's `tensorboard` runtime plugin: TensorBoard over the job's logs, reached through rest.

A job asks for it in `extras.com.microsoft.pai.runtimeplugin`, as OpenPAI's web portal
writes it:

    - plugin: tensorboard
      parameters:
        logdir: {path: /mnt/tensorboard}   # {name: directory}; a list or one string too
        port: 10053                        # OpenPAI's fixed port: PAI gives one of the job's range

As in OpenPAI's runtime, TensorBoard runs in the first task of the first role (of
`taskroles`, where given), in the background while the role's commands run, over the
directories named (one: `--logdir`; several: `--logdir_spec name:dir,...`). A relative
directory is under the task's working directory; each is made if missing. It listens
on the task's `tensorboard` port from the job's port range, on the task's host
address (PAI_CONTAINER_HOST_IP), and nobody is given that address: rest serves it at
`/api/v2/jobs/{job}/tensorboard/` to the job's owner, relayed over the bus by the
launcher (libs/common/tensorboard_relay.py).

The TensorBoard run is the task's own `tensorboard` (its PATH: the image's, or what the
commands installed), else the platform's (`PAI_TENSORBOARD`, which a process task gets
where the launcher's environment has TensorBoard: services/launcher/backends/local.py).
A task with neither fails at the
plugin's step naming what is missing (RuntimePluginFailed), before its commands, unless
the plugin's `failurePolicy` is `ignore`: the job then runs without TensorBoard.

Pure: the launcher-facing result is the role's commands and ports.
"""

from __future__ import annotations

import re
import shlex

import msgspec

from libs.common.protocol.checks import Checker
from libs.common.protocol.document import type_name
from libs.common.protocol.model import JobSpec
from libs.common.protocol.paths import DocPath, RawMapping

TENSORBOARD = "tensorboard"
PORT_LABEL = "tensorboard"
PARAMETERS = ("logdir", "port")
# Where TensorBoard's own output goes (its start line, its errors), in the task's working directory.
LOG_FILE = ".tensorboard.log"
DEFAULT_LOGDIR = {"logs": "tensorboard"}
MAX_LOGDIRS = 16
MAX_LOGDIR_CHARS = 1024
# A run name of --logdir_spec: no ':' or ',' (its separators).
LOGDIR_NAME = re.compile(r"^[A-Za-z0-9_.@+-]{1,64}$")


class TensorBoardRequest(msgspec.Struct, frozen=True, kw_only=True):
    logdirs: dict[str, str]  # run name -> directory
    taskroles: list[str] | None = None
    ignoreFailure: bool = False


def _logdirs(value: object) -> dict[str, str] | None:
    """OpenPAI's `logdir` ({name: dir}; the newer portal's list of dirs; one string) as
    {name: dir}; None when malformed."""
    if isinstance(value, str):
        return {"logs": value}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {(f"run{i}" if len(value) > 1 else "logs"): v for i, v in enumerate(value)}
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    return None


def check_tensorboard_parameters(check: Checker, parameters: RawMapping, path: DocPath) -> None:
    check.known_keys(parameters, path, PARAMETERS)
    if "port" in parameters:
        check.ignore((*path, "port"), "PAI serves TensorBoard on a port of the job's range ('tensorboard'), "
                                      "reached through rest at /api/v2/jobs/{job}/tensorboard/")
    if "logdir" not in parameters:
        return
    where: DocPath = (*path, "logdir")
    dirs = _logdirs(parameters["logdir"])
    if dirs is None:
        check.error(where, "type", "must be {name: directory}, a list of directories or one directory, not "
                                   f"{type_name(parameters['logdir'])}")
        return
    if not dirs:
        check.error(where, "minItems", "names at least one directory")
    if len(dirs) > MAX_LOGDIRS:
        check.error(where, "maxItems", f"names {len(dirs)} directories; at most {MAX_LOGDIRS}")
    for name, directory in dirs.items():
        at: DocPath = (*where, name) if isinstance(parameters["logdir"], dict) else where
        if isinstance(parameters["logdir"], dict) and not LOGDIR_NAME.match(name):
            check.error(at, "pattern", "a run name is 1 to 64 letters, digits or _.@+- (no ':' or ',')")
        if not directory or len(directory) > MAX_LOGDIR_CHARS or any(c in directory for c in ",\n\r\0"):
            check.error(at, "format", f"a directory is 1 to {MAX_LOGDIR_CHARS} characters, without ',' or "
                                      "line breaks")


def tensorboard_request(data: RawMapping) -> TensorBoardRequest | None:
    """The job's tensorboard plugin (valid document), or None when it asks for none."""
    extras = data.get("extras")
    plugins = extras.get("com.microsoft.pai.runtimeplugin") if isinstance(extras, dict) else None
    for plugin in plugins if isinstance(plugins, list) else []:
        if not isinstance(plugin, dict) or plugin.get("plugin") != TENSORBOARD:
            continue
        parameters = plugin.get("parameters") or {}
        dirs = _logdirs(parameters.get("logdir")) if "logdir" in parameters else None
        roles = plugin.get("taskroles", plugin.get("taskRoles"))
        return TensorBoardRequest(logdirs=dirs or dict(DEFAULT_LOGDIR),
                                  taskroles=list(roles) if isinstance(roles, list) else None,
                                  ignoreFailure=plugin.get("failurePolicy") == "ignore")
    return None


def server_script(logdirs: dict[str, str]) -> str:
    """The shell lines (sh and bash alike: images may have only busybox) that start
    TensorBoard in the background in the first task of its role."""
    q = shlex.quote
    if len(logdirs) == 1:
        where = f"--logdir {q(next(iter(logdirs.values())))}"
    else:
        where = "--logdir_spec " + q(",".join(f"{name}:{directory}" for name, directory in logdirs.items()))
    shown = ", ".join(logdirs.values())
    return "\n".join([
        '[ "${PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX:-0}" = 0 ] || exit 0',
        '__pai_tb=$(command -v tensorboard 2>/dev/null || true)',
        # The platform's (a command line: its Python and the module, with the packages' path).
        '__pai_tbpath=${PYTHONPATH:-}',
        'if [ -z "$__pai_tb" ] && [ -n "${PAI_TENSORBOARD:-}" ]; then __pai_tb=$PAI_TENSORBOARD; '
        '__pai_tbpath=${PAI_TENSORBOARD_PYTHONPATH:-$__pai_tbpath}; fi',
        'if [ -z "$__pai_tb" ]; then echo "[PAI] tensorboard plugin: no TensorBoard in this task: \'tensorboard\' '
        'is not on its PATH ($PATH) and the platform gives none here; install it in the image '
        '(pip install tensorboard)" >&2; exit 1; fi',
        "mkdir -p " + " ".join(q(d) for d in logdirs.values()),
        f'__pai_tblog="${{PAI_WORK_DIR:-.}}/{LOG_FILE}"; '
        '__pai_tbport=${PAI_CONTAINER_HOST_tensorboard_PORT_LIST:?the task has no tensorboard port}',
        # Run under a subshell that waits for it (no polling): a TensorBoard that ends while the
        # task runs (its port taken, a bad directory) says so in the task's log, with its last lines.
        # (In an `if`: the task's shell runs with errexit, which would end the subshell at once.)
        f'__pai_tbrun() {{ if PYTHONPATH=$__pai_tbpath $__pai_tb {where} --host "$1" --port "$__pai_tbport" '
        '> "$__pai_tblog" 2>&1 < /dev/null; then __pai_rc=0; else __pai_rc=$?; fi; }',
        # The task's host address, where the launcher reaches it (the node's network: processes,
        # local containers, Pods on the host network); a Pod on its own network has no such
        # address, and its port is the node's through hostPort: there, all the Pod's addresses.
        '( __pai_tbrun "${PAI_CONTAINER_HOST_IP:-127.0.0.1}"; '
        'if grep -q "could not bind to unavailable address" "$__pai_tblog"; then '
        'echo "[PAI] tensorboard plugin: the task has a network of its own: TensorBoard listens on all its '
        'addresses" >&2; __pai_tbrun 0.0.0.0; fi; '
        'echo "[PAI] tensorboard plugin: TensorBoard ended (exit code $__pai_rc); its last lines:" >&2; '
        'tail -n 20 "$__pai_tblog" >&2 ) &',
        f'echo "[PAI] tensorboard plugin: TensorBoard ($__pai_tb) started over {shown} on port '
        f'$PAI_CONTAINER_HOST_tensorboard_PORT_LIST; its output: {LOG_FILE} in the working directory"',
    ])


def with_tensorboard(spec: JobSpec, request: TensorBoardRequest) -> JobSpec:
    """The job with TensorBoard folded into the commands of its first selected role, and a
    `tensorboard` port for that role's tasks (pure)."""
    # Here, not at the top: plugins imports this module.
    from libs.common.protocol.plugins import shell_step

    chosen = next((r.name for r in spec.taskRoles if request.taskroles is None or r.name in request.taskroles), None)
    step = shell_step("runtime plugin tensorboard", [server_script(request.logdirs)], request.ignoreFailure)
    roles = []
    for role in spec.taskRoles:
        if role.name != chosen:
            roles.append(role)
            continue
        ports = dict(role.resources.ports)
        ports.setdefault(PORT_LABEL, 1)
        resources = msgspec.structs.replace(role.resources, ports=ports)
        roles.append(msgspec.structs.replace(role, resources=resources, commands=[step, *role.commands]))
    return msgspec.structs.replace(spec, taskRoles=roles)


def serving_task(spec: JobSpec) -> str | None:
    """The role whose first task runs TensorBoard: the one given a `tensorboard` port by
    `with_tensorboard`; None when the job runs none."""
    for role in spec.taskRoles:
        if any(PORT_LABEL == label for label in role.resources.ports) and any(
                "runtime plugin tensorboard" in c for c in role.commands):
            return role.name
    return None
