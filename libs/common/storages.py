"""Storages, as OpenPAI has them: declared by admins, granted to groups, mounted by jobs.

A storage is a place for data that outlives a job (datasets, checkpoints): a
directory shared on the node or cluster (`hostPath`), an NFS export (`nfs`), or
a Kubernetes PersistentVolumeClaim (`pvc`). Admins declare storages (rest keeps
them in `pai_users` as `storage.<name>`, beside the groups that grant them) and
grant them to groups through the group's `extension.acls.storageConfigs`, as
OpenPAI does. A job asks for storages with OpenPAI's `teamwise_storage` runtime
plugin:

    extras:
      com.microsoft.pai.runtimeplugin:
        - plugin: teamwise_storage
          parameters:
            storageConfigNames: [team-data]

and each of its tasks finds each storage at its `mountPath` (default
`/mnt/<name>`, OpenPAI's). The plugin with no `storageConfigNames` mounts the
storages the user's groups grant that are declared `default: true` (OpenPAI's
default storages). Rest resolves the names at submission (unknown: 404 naming it;
not granted: 403 naming it) and the job carries the declarations it got
(`JobSpec.storages`), so a storage changed or revoked later does not change a job
already accepted.

Pure: shapes, checks and decisions only; no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from libs.common.errors import BadInput, Forbidden, NoStorage
from libs.common.ids import NAME_PATTERN

StorageType = Literal["hostPath", "nfs", "pvc"]
MAX_STORAGE_NAME_LENGTH = 64
MAX_PATH_LENGTH = 1024
MAX_STORAGES_PER_JOB = 32
MAX_MOUNT_OPTIONS = 32
# Where a storage appears in a task unless its declaration says otherwise (OpenPAI's).
DEFAULT_MOUNT_ROOT = "/mnt"
# Paths a storage may not cover or sit in: the task's own system directories.
RESERVED_MOUNT_PATHS = ("/proc", "/sys", "/dev", "/tmp", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr",
                        "/boot", "/run", "/var/run", "/usr/local/pai")


class StorageData(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Where the data is, by type (OpenPAI's `data` of a storage's detail)."""

    # hostPath: the directory on every node; nfs: the export's path on the server.
    path: str = ""
    server: str = ""  # nfs: the server's name or address
    claimName: str = ""  # pvc: the claim, in the namespace of the job's Pods ("": the storage's name)
    # nfs or pvc on a machine without Kubernetes (the local backend): where each
    # node has it mounted already; tasks get a bind of that directory.
    hostPath: str = ""


class Storage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An admin's declaration of one storage; a job carries the ones it mounts."""

    name: str
    type: StorageType
    data: StorageData = StorageData()
    mountPath: str = ""  # "": /mnt/<name>
    readOnly: bool = False
    # OpenPAI's default storage: mounted by a teamwise_storage plugin that names none.
    default: bool = False
    mountOptions: list[str] = []  # nfs mount options (Kubernetes: the volume's; local: the admin's mount)
    description: str = ""
    # A job's own: the subdirectory it mounts instead of the whole storage (OpenPAI's
    # `share: false` in extras.storages: the user's own directory, named after them).
    subPath: str = ""


class StorageRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of OpenPAI's `extras.storages` (the form its web portal writes):
    a storage by name, where the job wants it, read-only, or the user's own part."""

    name: str
    mountPath: str = ""  # "": the declaration's
    readOnly: bool = False  # a job may only narrow a storage to read-only
    share: bool = True  # false: the user's own subdirectory (subPath = user name)


def mount_path(storage: Storage) -> str:
    return storage.mountPath or f"{DEFAULT_MOUNT_ROOT}/{storage.name}"


def claim_name(storage: Storage) -> str:
    return storage.data.claimName or storage.name


def node_path(storage: Storage) -> str | None:
    """The directory a node has the storage at (what a process task or a container binds), if any;
    the job's subdirectory of it where it mounts one (subPath)."""
    root = storage.data.path if storage.type == "hostPath" else storage.data.hostPath
    if not root:
        return None
    return f"{root.rstrip('/')}/{storage.subPath}" if storage.subPath else root


# --- checks ------------------------------------------------------------------------------------


def _bad(path: str, rule: str, message: str) -> BadInput:
    return BadInput(f"{path}: {message}", details={"errors": [{"path": path, "rule": rule, "message": message}]})


# Sources a storage may not be: the whole machine, or the kernel's views of it.
RESERVED_SOURCES = ("/proc", "/sys", "/dev")


def _check_absolute(value: str, path: str) -> None:
    if not value.startswith("/") or len(value) > MAX_PATH_LENGTH or "\0" in value:
        raise _bad(path, "format", f"must be an absolute path of at most {MAX_PATH_LENGTH} characters")
    if posixpath.normpath(value) != value.rstrip("/") or ".." in value.split("/"):
        raise _bad(path, "format", f"{value[:80]!r} is not a normal path (no '..', '//' or '.' parts)")


def _check_source(value: str, path: str) -> None:
    _check_absolute(value, path)
    if value == "/" or any(value == r or value.startswith(r + "/") for r in RESERVED_SOURCES):
        raise _bad(path, "reserved", f"{value[:80]} cannot be a storage: give a directory of its own")


def check_storage_name(name: str, path: str = "name") -> None:
    if not name or len(name) > MAX_STORAGE_NAME_LENGTH or not NAME_PATTERN.match(name):
        raise _bad(path, "format", f"a storage name is 1 to {MAX_STORAGE_NAME_LENGTH} letters, digits, '-' or '_'")


def check_storage(storage: Storage) -> None:
    """A declaration PAI can mount; BadInput naming the field otherwise."""
    check_storage_name(storage.name)
    data = storage.data
    match storage.type:
        case "hostPath":
            if not data.path:
                raise _bad("data.path", "required", "a hostPath storage names its directory on the nodes")
            _check_source(data.path, "data.path")
            if data.server or data.claimName or data.hostPath:
                raise _bad("data", "unknown_key", "a hostPath storage has only data.path")
        case "nfs":
            if not data.server or not data.path:
                raise _bad("data", "required", "an nfs storage names its data.server and data.path (the export)")
            _check_absolute(data.path, "data.path")
            if data.claimName:
                raise _bad("data.claimName", "unknown_key", "only a pvc storage has a claim")
        case "pvc":
            if data.claimName:
                check_storage_name(data.claimName, "data.claimName")
            if data.server or data.path:
                raise _bad("data", "unknown_key", "a pvc storage has data.claimName (and data.hostPath) only")
    if data.hostPath:
        _check_source(data.hostPath, "data.hostPath")
    if storage.mountPath:
        _check_absolute(storage.mountPath, "mountPath")
    problem = mount_path_problem(mount_path(storage))
    if problem is not None:
        raise _bad("mountPath", "reserved", problem)
    if len(storage.mountOptions) > MAX_MOUNT_OPTIONS or any(
        not o or "," in o or len(o) > 256 for o in storage.mountOptions
    ):
        raise _bad("mountOptions", "format", f"at most {MAX_MOUNT_OPTIONS} options, each without ','")


def mount_path_problem(where: str) -> str | None:
    """Why a task cannot have a storage at `where` (an absolute, normal path), or None."""
    for reserved in RESERVED_MOUNT_PATHS:
        if where == "/" or where == reserved or where.startswith(reserved + "/"):
            return f"{where} is a system directory of the task; use one under /mnt"
    return None


def decode_storage(raw: object, where: str = "") -> Storage:
    """A declaration from JSON/YAML data (an admin's request or the storages file), checked."""
    try:
        storage = msgspec.convert(raw, Storage)
    except msgspec.ValidationError as exc:
        raise BadInput(f"{where}{exc}") from None
    try:
        check_storage(storage)
    except BadInput as exc:
        raise BadInput(f"{where}{exc.message}", details=exc.details) from None
    return storage


def parse_storages_file(raw: object, where: str) -> list[Storage]:
    """The storages file of `pai up` (storages_file): a list of declarations, or `storages:` holding one."""
    items = raw.get("storages") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise BadInput(f"{where}: expected a list of storages (or a mapping with `storages:`)")
    storages = [decode_storage(item, f"{where}: storages[{i}]: ") for i, item in enumerate(items)]
    names = [s.name for s in storages]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise BadInput(f"{where}: storage {doubled[0]} is declared twice")
    return storages


# --- who may use what --------------------------------------------------------------------------


def granted_names(acl_lists: Iterable[Iterable[str]]) -> frozenset[str]:
    """The storages the caller's groups grant (each group's `extension.acls.storageConfigs`)."""
    return frozenset(name for names in acl_lists for name in names)


def visible(declared: Iterable[Storage], granted: frozenset[str] | None) -> list[Storage]:
    """What the caller may see and use, by name; `granted` None: an admin, who sees all."""
    return sorted((s for s in declared if granted is None or s.name in granted), key=lambda s: s.name)


def resolve_for_job(
    requested: list[str] | None,
    declared: Mapping[str, Storage],
    granted: frozenset[str] | None,
    *,
    path: str = "extras.com.microsoft.pai.runtimeplugin",
    asks: list[StorageRequest] | None = None,
    user: str = "",
) -> list[Storage]:
    """The storages a job mounts: `requested` None (no teamwise_storage plugin) and no
    `asks` (extras.storages): none; [] (the plugin names none): the granted default
    storages; else those named, each declared (NoStorage naming it) and granted
    (Forbidden naming it), with what `asks` says of each (mount path, read-only, the
    user's own subdirectory). `granted` None: an admin."""
    if asks:
        path = "extras.storages" if requested is None else path
        requested = [*(requested or []), *(a.name for a in asks)]
    if requested is None:
        return []
    if not requested:
        return [s for s in visible(declared.values(), granted) if s.default]
    if len(requested) > MAX_STORAGES_PER_JOB:
        raise _bad(path, "maximum", f"a job mounts at most {MAX_STORAGES_PER_JOB} storages")
    found: list[Storage] = []
    for name in dict.fromkeys(requested):
        storage = declared.get(name)
        if storage is None:
            raise NoStorage(f"storage {name[:64]!r} ({path}: storageConfigNames) is not declared; "
                            "`GET /api/v2/storages` lists the storages you may use",
                            details={"errors": [{"path": path, "rule": "unknown_storage", "storage": name}]})
        if granted is not None and name not in granted:
            raise Forbidden(f"storage {name!r} ({path}: storageConfigNames) is not granted to any of your groups; "
                            "ask an admin to add it to a group's extension.acls.storageConfigs",
                            details={"errors": [{"path": path, "rule": "storage_not_granted", "storage": name}]})
        for ask in asks or ():
            if ask.name == name:
                storage = msgspec.structs.replace(
                    storage, mountPath=ask.mountPath or storage.mountPath, readOnly=storage.readOnly or ask.readOnly,
                    subPath=storage.subPath if ask.share else user)
        found.append(storage)
    paths = [mount_path(s) for s in found]
    for i, where in enumerate(paths):
        for other in paths[:i]:
            if where == other or where.startswith(other + "/") or other.startswith(where + "/"):
                raise _bad(path, "mount_path_overlap",
                           f"storages {found[paths.index(other)].name} and {found[i].name} mount at {other} and {where}")
    return found


# --- OpenPAI's shapes (rest-server models/v2/storage.js) ----------------------------------------


def summary(storage: Storage) -> dict[str, Any]:
    """One entry of `GET /api/v2/storages`: OpenPAI's {name, share, volumeName, default}, and PAI's type and mountPath."""
    return {
        "name": storage.name,
        "share": True,
        "volumeName": claim_name(storage) if storage.type == "pvc" else storage.name,
        "default": storage.default,
        "type": storage.type,
        "mountPath": mount_path(storage),
        "readOnly": storage.readOnly,
    }


def detail(storage: Storage) -> dict[str, Any]:
    """`GET /api/v2/storages/{name}`: the summary with OpenPAI's type, data and mountOptions."""
    return {
        **summary(storage),
        "data": msgspec.to_builtins(storage.data),
        "mountOptions": list(storage.mountOptions),
        "description": storage.description,
    }


# --- OpenPAI's deprecated storage config and server (rest-server controllers/v2/storage-deprecated.js) ---
# OpenPAI's older split of a storage: a "server" (where the data is) and a "config"
# (which servers a job mounts, and where). A PAI declaration holds both: it is shown as a
# config of one server, the server named after the storage (so names stay unique where two
# pvc storages share a claim).


def legacy_config(storage: Storage) -> dict[str, Any]:
    """`GET /api/v2/storage/config[/{name}]`: {name, default, servers, mountInfos}."""
    return {
        "name": storage.name,
        "default": storage.default,
        "servers": [storage.name],
        "mountInfos": [{
            "mountPoint": mount_path(storage),
            "path": "",  # OpenPAI's "${PAI_USER_NAME}" for share: false; a declaration is always shared
            "server": storage.name,
            "permission": "ro" if storage.readOnly else "rw",
        }],
    }


def legacy_server(storage: Storage) -> dict[str, Any]:
    """`GET /api/v2/storage/server[/{name}]`: {spn, type (lower case), data, extension}; an nfs
    storage's data as OpenPAI's ({address, rootPath}), the other types' as PAI declares them."""
    data: dict[str, Any] = msgspec.to_builtins(storage.data)
    if storage.type == "nfs":
        data = {"address": data.pop("server", ""), "rootPath": data.pop("path", ""), **data}
    return {"spn": storage.name, "type": storage.type.lower(), "data": data, "extension": {}}
