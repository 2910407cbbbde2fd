"""Checks of `extras`: the part PAI acts on (gang allocation, HiveD scheduling
hints, status-change notification) is validated; everything else in `extras` is
free-form by the protocol, kept, and reported as not acted on.

HiveD's per-role fields (`hivedScheduler.taskRoles.<role>`), as OpenPAI's rest server
turns them into each pod's scheduling spec:
- `skuType` (HiveD's leafCellType) and `affinityGroupName` (roles naming the same
  group are placed together, all or nothing; services/scheduler/core/demand.py);
- `skuNumber` (HiveD's leafCellNumber): the leaf cells each task of the role gets,
  at least what its resources need;
- `pinnedCellId`: the role's tasks go to that pinned cell of the VC (the job's
  `pinnedCellId` is the default of every role); roles may be pinned to different
  cells, some pinned and some not. As in OpenPAI, a role names a skuType or a pin,
  not both, and the roles of one affinity group ask for the same sku and pin; a pin
  the VC does not have is refused by rest at submit (services/rest/capacity.py);
- `gangReleaseEnable` (also job-level, the roles' default): true, PAI's default, releases
  a role's cells with its attempt's; false releases each task's cells as soon as the
  task has ended for good in its attempt (HiveD's release per pod; the launcher sends a
  `job.released` naming the task, services/launcher/core/lifecycle.py).

Accepted for notification (OpenPAI writes both forms):

    extras:
      jobStatusChangeNotification: true            # every state change
      jobStatusChangeNotification: {running: true, failed: true, ...}
      notifyEmails: [alice@example.com]            # or one address as a string

A mapping turns notification on when any listed state is true, and the owner is
mailed on those states only (`JobSpec.notifyStates`); `true` mails on running,
succeeded, failed, stopped and retried (docs/alerts.md).
"""

from __future__ import annotations

import posixpath
import re

import msgspec

from libs.common.ids import NAME_PATTERN
from libs.common.protocol.checks import Checker
from libs.common.protocol.document import type_name
from libs.common.protocol.limits import MAX_MARKET_ITEM_ID_LENGTH, MAX_SKU_NUMBER
from libs.common.protocol.model import PRIORITY_CLASSES
from libs.common.protocol.paths import DocPath, RawMapping
from libs.common.protocol.plugins import check_runtime_plugins
from libs.common.storages import StorageRequest, mount_path_problem

HIVED_KEYS = frozenset({"jobPriorityClass", "skuType", "pinnedCellId", "lazyPreemptionEnable", "taskRoles",
                        "gangReleaseEnable"})
HIVED_ROLE_KEYS = frozenset({"skuType", "affinityGroupName", "pinnedCellId", "skuNumber", "gangReleaseEnable"})
NOTIFY_STATES = frozenset({"waiting", "running", "succeeded", "failed", "stopped", "stopping", "retried"})
EMAIL_PATTERN = re.compile(r"^[^@\s]+@[^@\s]+$")

EXTRAS_NOT_ACTED_ON = {
    "submitFrom": "kept as a note of where the job came from",
}


def check_extras(check: Checker, data: RawMapping) -> None:
    if "extras" not in data or not check.mapping(data["extras"], ("extras",)):
        return
    extras = data["extras"]
    for key in extras:
        path: DocPath = ("extras", str(key))
        match key:
            case "gangAllocation":
                check.boolean(extras[key], path)
            case "hivedScheduler":
                _check_hived(check, extras[key], path, data)
            case "jobStatusChangeNotification":
                _check_notification(check, extras[key], path)
            case "notifyEmails":
                _check_emails(check, extras[key], path)
            case "storages":
                _check_storages(check, extras[key], path)
            case "com.microsoft.pai.runtimeplugin":
                check_runtime_plugins(check, extras[key], path, data)
            case "marketplaceItem":  # the marketplace item the job was made from (services/rest/market)
                if check.string(extras[key], path, non_empty=True) and (
                        len(extras[key]) > MAX_MARKET_ITEM_ID_LENGTH or not NAME_PATTERN.match(extras[key])):
                    check.error(path, "pattern", f"a marketplace item id is 1 to {MAX_MARKET_ITEM_ID_LENGTH} "
                                "letters, digits, _ and -")
            case _:
                check.ignore(path, EXTRAS_NOT_ACTED_ON.get(str(key), "an extras field PAI does not know"))


def _check_hived(check: Checker, hived: object, path: DocPath, data: RawMapping) -> None:
    if not check.mapping(hived, path):
        return
    for key, value in hived.items():
        where = (*path, str(key))
        match key:
            case "jobPriorityClass":
                if check.string(value, where) and value not in PRIORITY_CLASSES:
                    check.error(where, "enum", f"{value!r} is not a priority class; use one of "
                                + ", ".join(PRIORITY_CLASSES))
            case "skuType" if value is None:
                pass  # OpenPAI writes `skuType: null` for "any sku"
            case "skuType" | "pinnedCellId":
                check.string(value, where, non_empty=True)
            case "lazyPreemptionEnable":
                check.boolean(value, where)
            case "gangReleaseEnable":
                check.boolean(value, where)
            case "taskRoles":
                _check_hived_roles(check, value, where, data)
                _check_pins(check, hived, path, data)
            case _:
                check.ignore(where, "a hivedScheduler field PAI does not act on")


def _check_hived_roles(check: Checker, roles: object, path: DocPath, data: RawMapping) -> None:
    if not check.mapping(roles, path):
        return
    job_roles = data.get("taskRoles")
    if not isinstance(job_roles, dict):
        job_roles = {}
    for name, settings in roles.items():
        where = (*path, str(name))
        if name not in job_roles:
            check.error(where, "unknown_task_role", f"{str(name)!r} is not a task role of this job")
            continue
        if not check.mapping(settings, where):
            continue
        for key, value in settings.items():
            if key not in HIVED_ROLE_KEYS:
                check.ignore((*where, str(key)), "a hivedScheduler task role field PAI does not act on")
            elif value is None:
                continue  # `skuType: null`: any sku, as in OpenPAI; no affinity group, pin or number
            elif key == "skuNumber":
                check.integer(value, (*where, key), minimum=1, maximum=MAX_SKU_NUMBER,
                              limit="PAI's limit of leaf cells per task")
            elif key == "gangReleaseEnable":
                check.boolean(value, (*where, key))
            else:
                check.string(value, (*where, key), non_empty=True)


def role_pins(hived: RawMapping, job_roles: object) -> dict[str, str | None]:
    """Each role's pinned cell as the job asks: the role's own, else the job's."""
    job_pin = hived.get("pinnedCellId")
    settings_of = hived.get("taskRoles")
    pins: dict[str, str | None] = {}
    for name in job_roles if isinstance(job_roles, dict) else ():
        settings = settings_of.get(name) if isinstance(settings_of, dict) else None
        pin = settings.get("pinnedCellId") if isinstance(settings, dict) else None
        pins[str(name)] = pin if isinstance(pin, str) else (job_pin if isinstance(job_pin, str) else None)
    return pins


def _check_pins(check: Checker, hived: RawMapping, path: DocPath, data: RawMapping) -> None:
    """OpenPAI's rules for pins and affinity groups: a role names a skuType or a pinnedCellId, not
    both (the pinned cell has its sku); the roles of one affinity group ask for the same sku and the
    same pinned cell (a group is one cell request, placed in one cell)."""
    settings_of = hived.get("taskRoles")
    if not isinstance(settings_of, dict):
        return
    pins = role_pins(hived, data.get("taskRoles"))
    job_sku = hived.get("skuType")
    first_of_group: dict[str, tuple[str, str | None, str | None]] = {}  # group -> (role, sku, pin)
    for name, settings in settings_of.items():
        if not isinstance(settings, dict) or str(name) not in pins:
            continue
        where = (*path, "taskRoles", str(name))
        if isinstance(settings.get("skuType"), str) and isinstance(settings.get("pinnedCellId"), str):
            check.error((*where, "pinnedCellId"), "sku_and_pin",
                        "a task role names a skuType or a pinnedCellId, not both: the pinned cell's sku is used")
            continue
        group = settings.get("affinityGroupName")
        if not isinstance(group, str) or not group:
            continue
        sku = settings.get("skuType") if isinstance(settings.get("skuType"), str) else job_sku
        sku = sku if isinstance(sku, str) else None
        pin = pins[str(name)]
        first = first_of_group.setdefault(group, (str(name), sku, pin))
        if first[1:] != (sku, pin):
            field = "pinnedCellId" if first[2] != pin else "skuType"
            check.error((*where, field), "affinity_group_mismatch",
                        f"affinity group {group!r} is one cell request: its roles must ask for the same skuType "
                        f"and pinnedCellId, but role {first[0]!r} asks for sku {first[1]!r} in pinned cell "
                        f"{first[2]!r} and this one for sku {sku!r} in {pin!r}")


STORAGE_KEYS = ("name", "mountPath", "readOnly", "share")


def _check_storages(check: Checker, value: object, path: DocPath) -> None:
    """OpenPAI's `extras.storages`: [{name, mountPath, readOnly, share}] (libs/common/storages.py)."""
    if not isinstance(value, list):
        check.error(path, "type", f"must be a list of storages ({{name, mountPath}}), not {type_name(value)}")
        return
    for index, item in enumerate(value):
        where: DocPath = (*path, index)
        if not check.mapping(item, where):
            continue
        check.known_keys(item, where, STORAGE_KEYS)
        if check.required(item, where, ("name",)) and check.string(item["name"], (*where, "name"), non_empty=True):
            check.pattern(item["name"], (*where, "name"), NAME_PATTERN, "storage name")
        for key in ("readOnly", "share"):
            if key in item:
                check.boolean(item[key], (*where, key))
        if "mountPath" in item and check.string(item["mountPath"], (*where, "mountPath"), non_empty=True):
            mount = item["mountPath"]
            problem = (None if mount.startswith("/") and posixpath.normpath(mount) == mount.rstrip("/")
                       and len(mount) <= 1024 else "must be an absolute, normal path (no '..', '//' or '.' parts)")
            problem = problem or mount_path_problem(mount.rstrip("/") or "/")
            if problem:
                check.error((*where, "mountPath"), "format", problem)


def extras_storages(data: RawMapping) -> list[StorageRequest]:
    """The storages `extras.storages` asks for; the document must be valid."""
    extras = data.get("extras")
    items = extras.get("storages") if isinstance(extras, dict) else None
    return [msgspec.convert(item, StorageRequest) for item in items] if isinstance(items, list) else []


def _check_notification(check: Checker, value: object, path: DocPath) -> None:
    if isinstance(value, bool):
        return
    if not isinstance(value, dict):
        check.error(path, "type",
                    f"must be true/false or a mapping of job states to true/false, not {type_name(value)}")
        return
    for state, wanted in value.items():
        where = (*path, str(state))
        if str(state).lower() not in NOTIFY_STATES:
            states = ", ".join(sorted(NOTIFY_STATES))
            check.error(where, "enum", f"{str(state)!r} is not a job state; use one of {states}")
        else:
            check.boolean(wanted, where)


def _check_emails(check: Checker, value: object, path: DocPath) -> None:
    addresses = [value] if isinstance(value, str) else value
    if not isinstance(addresses, list):
        check.error(path, "type", f"must be an email address or a list of them, not {type_name(value)}")
        return
    for index, address in enumerate(addresses):
        where = path if isinstance(value, str) else (*path, index)
        if check.string(address, where) and not EMAIL_PATTERN.match(address):
            check.error(where, "format", f"{address!r} is not an email address")
