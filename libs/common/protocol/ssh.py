"""OpenPAI's `ssh` runtime plugin: an SSH server in every task, brought by PAI.

A job asks for it in `extras.com.microsoft.pai.runtimeplugin`:

    - plugin: ssh
      parameters:
        jobssh: true                                  # tasks reach each other with the job's key
        userssh: {type: custom, value: "ssh-ed25519 AAAA..."}  # one more key the owner brings
      taskroles: [worker]                             # optional: only these roles

rest generates the job's key pair at submission (Ed25519, OpenSSH format). Its private
key is sealed with the job's secrets (under SECRET_NAME, filled in at launch as any
`<% $secrets.x %>`), and it is every task's host key too, so a client that knows the
job's public key checks the server it reaches (`pai ssh`, and the tasks among
themselves, pin it). A task's server accepts the job's key (when `jobssh`), the
`userssh` key and the keys of the owner's profile (`extension.sshKeys`) as they were
at submission; nothing else (no passwords).

The server is the node's OpenSSH `sshd` (in a container task, the same programs PAI
binds read-only at BUNDLE with their own libraries and loader, so any image will do:
services/launcher/backends/ssh_bundle.py), run as the job's own uid from the task's
working directory with a config written there (its own host key, no PAM, no
privilege separation: an unprivileged sshd logs in only its own user). A job's uid
has no passwd entry, and sshd and ssh look their user up: libnss_wrapper answers
from a passwd file in the task's `.ssh` (the login name is the job's owner, home
the working directory), exported to the task's commands too, so `ssh` works in
them (MPI). The server listens on the task's `ssh` port from the job's port range
(one is reserved for each task of a role that runs the plugin), and a session gets
the task's PAI_* environment (`~/.ssh/environment`).

Pure: the launcher-facing result is the role's commands and ports.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import msgspec

from libs.common.protocol.checks import Checker
from libs.common.protocol.model import JobSpec
from libs.common.protocol.paths import DocPath, RawMapping

SSH = "ssh"
PORT_LABEL = "ssh"
# The sealed secret holding the job's private key; a job's own secret of that name is refused.
SECRET_NAME = "paiJobSshPrivateKey"
SSHD = "/usr/sbin/sshd"
NSS_WRAPPER = "libnss_wrapper.so"
# Where a container task finds PAI's own sshd and ssh (services/launcher/backends/ssh_bundle.py).
BUNDLE = "/pai/ssh"
SSH_PARAMETERS = ("jobssh", "userssh", "sshbarrier", "sshbarrierTimeout", "sshbarriertaskroles")
USERSSH_TYPES = ("custom", "system")
# One public key: its type and base64 body; the comment is dropped, options are refused
# (a line of authorized_keys may not carry `command=` or a second key).
KEY_LINE = re.compile(
    r"^\s*(?P<type>ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com)\s+(?P<body>[A-Za-z0-9+/]{16,}={0,3})(?:\s+[^\r\n]*)?\s*$")
MAX_PROFILE_KEYS = 32
# A key line's length: a 16384-bit RSA key is under 3 KiB; 32 of these keep the user record small.
MAX_PUBLIC_KEY_CHARS = 8 * 1024
# A profile key's title: shown in the portal and named in DELETE .../ssh-keys/{title}, so no '/'.
KEY_TITLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}$")


class SshRequest(msgspec.Struct, frozen=True, kw_only=True):
    jobssh: bool = True
    userKey: str | None = None  # userssh's custom key, normalised
    taskroles: list[str] | None = None
    ignoreFailure: bool = False


def public_key_line(text: object) -> str | None:
    """`type base64` of one OpenSSH public key, or None when `text` is not one."""
    if not isinstance(text, str) or len(text) > MAX_PUBLIC_KEY_CHARS:
        return None
    match = KEY_LINE.match(text)
    return f"{match['type']} {match['body']}" if match else None


def check_ssh_parameters(check: Checker, parameters: RawMapping, path: DocPath) -> None:
    check.known_keys(parameters, path, SSH_PARAMETERS)
    if "jobssh" in parameters and not isinstance(parameters["jobssh"], bool):
        check.error((*path, "jobssh"), "type", "must be true or false")
    for key in ("sshbarrier", "sshbarrierTimeout", "sshbarriertaskroles"):
        if key in parameters:
            check.ignore((*path, key), "PAI starts every task's SSH server before its commands; it has no barrier")
    if "userssh" not in parameters or parameters["userssh"] in (None, "", {}):
        return
    userssh = parameters["userssh"]
    where: DocPath = (*path, "userssh")
    if isinstance(userssh, str):  # OpenPAI's older shape: the key itself
        userssh = {"type": "custom", "value": userssh}
    if not check.mapping(userssh, where):
        return
    check.known_keys(userssh, where, ("type", "value"))
    if userssh.get("type", "custom") not in USERSSH_TYPES:
        check.error((*where, "type"), "enum", f"must be one of {', '.join(USERSSH_TYPES)}")
    elif userssh.get("type", "custom") == "custom" and userssh.get("value") not in (None, "") \
            and public_key_line(userssh.get("value")) is None:
        check.error((*where, "value"), "format", "must be one OpenSSH public key ('ssh-ed25519 AAAA...', "
                                                 "'ssh-rsa AAAA...' or 'ecdsa-sha2-nistp256 AAAA...'), no options")


def ssh_request(data: RawMapping) -> SshRequest | None:
    """The job's ssh plugin (valid document), or None when it asks for none."""
    extras = data.get("extras")
    plugins = extras.get("com.microsoft.pai.runtimeplugin") if isinstance(extras, dict) else None
    for plugin in plugins if isinstance(plugins, list) else []:
        if not isinstance(plugin, dict) or plugin.get("plugin") != SSH:
            continue
        parameters = plugin.get("parameters") or {}
        userssh = parameters.get("userssh")
        if isinstance(userssh, str):
            userssh = {"type": "custom", "value": userssh}
        key = None
        if isinstance(userssh, dict) and userssh.get("type", "custom") == "custom":
            key = public_key_line(userssh.get("value"))
        roles = plugin.get("taskroles", plugin.get("taskRoles"))
        return SshRequest(jobssh=parameters.get("jobssh", True) is not False, userKey=key,
                          taskroles=list(roles) if isinstance(roles, list) else None,
                          ignoreFailure=plugin.get("failurePolicy") == "ignore")
    return None


def profile_keys(extension: RawMapping) -> list[str]:
    """The public keys of a user's profile (OpenPAI's `extension.sshKeys`: a list of
    `{title, value}` or of key strings); what is not a key is left out."""
    keys = extension.get("sshKeys") if isinstance(extension, dict) else None
    found = []
    for item in keys if isinstance(keys, list) else []:
        line = public_key_line(item.get("value") if isinstance(item, dict) else item)
        if line is not None and line not in found:
            found.append(line)
    return found[:MAX_PROFILE_KEYS]


def profile_key_entries(extension: RawMapping) -> list[dict[str, Any]]:
    """The profile's keys as listed and edited by title, `{title, value, time}`: a bare key
    string (an older OpenPAI client's) is titled by its place, `key-1`..."""
    keys = extension.get("sshKeys") if isinstance(extension, dict) else None
    entries = []
    for i, item in enumerate(keys if isinstance(keys, list) else []):
        if isinstance(item, str):
            item = {"value": item}
        if isinstance(item, dict) and isinstance(item.get("value"), str):
            title = item.get("title")
            entries.append({"title": title if isinstance(title, str) and title else f"key-{i + 1}",
                            "value": item["value"], "time": item.get("time")})
    return entries


def profile_key_problem(entries: list[dict[str, Any]], title: object, value: object) -> tuple[str, str, str] | None:
    """(field, rule, message) of what keeps `{title, value}` from joining the profile's
    `entries`, or None. One OpenSSH public key line of KEY_LINE's types, nothing else."""
    if not isinstance(title, str) or not KEY_TITLE.match(title):
        return ("title", "pattern", "must be 1 to 64 letters, digits, spaces or ._@+- , starting with a letter "
                                    "or digit (the key's name in the list)")
    if not isinstance(value, str) or not value.strip():
        return ("value", "required", "must be an OpenSSH public key line ('ssh-ed25519 AAAA... comment')")
    if len(value) > MAX_PUBLIC_KEY_CHARS:
        return ("value", "maxLength", f"is {len(value)} characters; a public key line has at most "
                                      f"{MAX_PUBLIC_KEY_CHARS}")
    if "\n" in value.strip() or "\r" in value.strip():
        return ("value", "format", "must be one key on one line (add each key on its own)")
    line = public_key_line(value)
    if line is None:
        return ("value", "format", "must be one OpenSSH public key: a type (ssh-ed25519, ssh-rsa, "
                                   "ecdsa-sha2-nistp256/384/521, sk-ssh-ed25519@openssh.com, "
                                   "sk-ecdsa-sha2-nistp256@openssh.com), its base64 body and an optional comment; "
                                   "no options such as command= or from=")
    if any(e["title"] == title for e in entries):
        return ("title", "unique", f"a key titled {title!r} is in the profile already; delete it first")
    if any(public_key_line(e["value"]) == line for e in entries):
        return ("value", "unique", "this key is in the profile already")
    if len(entries) >= MAX_PROFILE_KEYS:
        return ("sshKeys", "maxItems", f"the profile holds {MAX_PROFILE_KEYS} keys at most; delete one first")
    return None


def generate_key_pair(comment: str) -> tuple[str, str]:
    """(private key in OpenSSH's PEM, public key line) of a new Ed25519 key."""
    # Imported here: the protocol package is imported by every service (through the
    # messages), and only rest makes key pairs; cryptography at import costs them all.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


def server_script(login: str, job_public: str, authorized: list[str]) -> str:
    """The shell lines that set a task's SSH server up and start it (in the plugin's
    subshell; the private key arrives through the sealed secret)."""
    q = shlex.quote
    keys = " ".join(q(k) for k in authorized) or "''"
    config = "\n".join([
        'Port ${PAI_CONTAINER_SSH_PORT:?the task has no ssh port}',
        'HostKey "$d/id_ed25519"', 'AuthorizedKeysFile "$d/authorized_keys"', 'PidFile "$d/sshd.pid"',
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "UsePAM no", "StrictModes no", "PermitUserEnvironment yes", "PrintMotd no", "AllowTcpForwarding yes",
        f"AllowUsers {login}", "Subsystem sftp internal-sftp",
    ])
    client = "\n".join(['Host *', '  IdentityFile "$d/id_ed25519"', '  UserKnownHostsFile "$d/known_hosts"',
                        "  StrictHostKeyChecking yes", f"  User {login}", "  LogLevel ERROR"])
    return "\n".join([
        # In a container the server is PAI's bundle, bound at BUNDLE (any image, even one
        # without a C library: services/launcher/backends/ssh_bundle.py); else the node's.
        f'__pai_sshd={SSHD}; __pai_bundle=; if [ -x {BUNDLE}/sbin/sshd ]; then __pai_sshd={BUNDLE}/sbin/sshd; '
        '__pai_bundle=1; fi',
        # Where the task cannot run a server (no bundle, no sshd), it runs without one, saying so.
        'test -x "$__pai_sshd" || { echo "[PAI] ssh plugin: not run: no OpenSSH server ($__pai_sshd) here" >&2; '
        'exit 0; }',
        f'[ -n "$__pai_bundle" ] || [ -n "$(ls /usr/lib/*/{NSS_WRAPPER} /usr/lib/{NSS_WRAPPER} 2>/dev/null)" ] || '
        f'{{ echo "[PAI] ssh plugin: not run: no {NSS_WRAPPER} here (Debian: libnss-wrapper)" >&2; exit 0; }}',
        'd="$PAI_WORK_DIR/.ssh"; mkdir -p "$d"; chmod 700 "$d"; umask 077',
        f"cat > \"$d/id_ed25519\" <<'__PAI_SSH_KEY__'\n<% $secrets.{SECRET_NAME} %>\n__PAI_SSH_KEY__",
        f'printf "%s\\n" {q(job_public)} > "$d/id_ed25519.pub"',
        f'printf "%s\\n" {keys} > "$d/authorized_keys"',
        # Every task's host key is the job's key: a task trusts its job's servers, and no other.
        f'printf "* %s\\n" {q(job_public)} > "$d/known_hosts"',
        f'cat > "$d/config" <<__PAI_SSH_CONFIG__\n{client}\n__PAI_SSH_CONFIG__',
        # The login shell: the image's bash, else its sh (busybox images have only that).
        '__pai_shell=$(command -v bash 2>/dev/null || echo /bin/sh)',
        f'printf "%s:x:%s:%s:PAI job:%s:%s\\n" {q(login)} "$(id -u)" "$(id -g)" "$PAI_WORK_DIR" "$__pai_shell" '
        '> "$d/passwd"',
        'printf "pai:x:%s:\\n" "$(id -g)" > "$d/group"',
        # What a session gets of the task's environment (sshd starts sessions afresh).
        "env | grep -E '^(PAI_[A-Za-z0-9_]*|CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES|PATH|LANG|TZ)=' "
        '> "$d/environment" || true',
        # The bundle's programs find the user through NSS_WRAPPER_* alone (they preload it
        # themselves); the node's need LD_PRELOAD. A session's ssh is the bundle's in a container.
        f'if [ -n "$__pai_bundle" ]; then __pai_preload=; printf "%s\\n" "PATH={BUNDLE}/bin:$PATH" >> "$d/environment"; '
        f'else __pai_preload={NSS_WRAPPER}; printf "%s\\n" "LD_PRELOAD={NSS_WRAPPER}" >> "$d/environment"; fi',
        'printf "%s\\n" "NSS_WRAPPER_PASSWD=$d/passwd" "NSS_WRAPPER_GROUP=$d/group" >> "$d/environment"',
        f'cat > "$d/sshd_config" <<__PAI_SSHD_CONFIG__\n{config}\n__PAI_SSHD_CONFIG__',
        'export NSS_WRAPPER_PASSWD="$d/passwd" NSS_WRAPPER_GROUP="$d/group"',
        'LD_PRELOAD=$__pai_preload "$__pai_sshd" -t -f "$d/sshd_config"',
        'LD_PRELOAD=$__pai_preload "$__pai_sshd" -D -e -f "$d/sshd_config" > "$d/sshd.log" 2>&1 < /dev/null & '
        '__pai_sshd_pid=$!',
        # Listening before the role's commands start (a peer's ssh may come at once), or the step
        # fails; told by sshd's own log line, which any shell can read (busybox's has no /dev/tcp).
        'for __i in $(seq 1 200); do grep -q "Server listening" "$d/sshd.log" 2>/dev/null && break; '
        'kill -0 "$__pai_sshd_pid" 2>/dev/null || { cat "$d/sshd.log" >&2; exit 1; }; sleep 0.05; done',
        f'echo "[PAI] ssh plugin: sshd listening on port $PAI_CONTAINER_SSH_PORT as {login}"',
    ])


def exports() -> str:
    """The task's commands find their user and ssh's config (MPI's ssh) as the server does."""
    return (f'if [ -e "$PAI_WORK_DIR/.ssh/passwd" ]; then export NSS_WRAPPER_PASSWD="$PAI_WORK_DIR/.ssh/passwd" '
            f'NSS_WRAPPER_GROUP="$PAI_WORK_DIR/.ssh/group"; if [ -x {BUNDLE}/bin/ssh ]; then export PATH="{BUNDLE}/bin:$PATH"; '
            f'else export LD_PRELOAD={NSS_WRAPPER}; fi; fi')


def login_name(user: str) -> str:
    """The SSH login of a job's tasks: its owner's name (PAI's user names are already
    valid login names)."""
    return user


def with_ssh(spec: JobSpec, request: SshRequest, job_public: str, profile: list[str]) -> JobSpec:
    """The job with the ssh plugin folded into the commands of the roles it selects,
    and an `ssh` port for each of their tasks (pure)."""
    # Here, not at the top: plugins imports this module.
    from libs.common.protocol.plugins import shell_step

    authorized = list(dict.fromkeys(
        ([job_public.rsplit(" ", 1)[0]] if request.jobssh else [])
        + ([request.userKey] if request.userKey else []) + profile))
    login = login_name(spec.user)
    step = shell_step("runtime plugin ssh", [server_script(login, job_public, authorized)], request.ignoreFailure)
    roles = []
    for role in spec.taskRoles:
        if request.taskroles is not None and role.name not in request.taskroles:
            roles.append(role)
            continue
        ports = dict(role.resources.ports)
        ports.setdefault(PORT_LABEL, 1)
        resources = msgspec.structs.replace(role.resources, ports=ports)
        roles.append(msgspec.structs.replace(role, resources=resources, commands=[step, exports(), *role.commands]))
    return msgspec.structs.replace(spec, taskRoles=roles)
