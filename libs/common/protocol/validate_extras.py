"""Checks of `extras`: the part PAI acts on (gang allocation, HiveD scheduling
hints, status-change notification) is validated; everything else in `extras` is
free-form by the protocol, kept, and reported as not acted on.

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

import re

from libs.common.protocol.checks import Checker
from libs.common.protocol.document import type_name
from libs.common.protocol.model import PRIORITY_CLASSES
from libs.common.protocol.paths import DocPath, RawMapping
from libs.common.protocol.plugins import check_runtime_plugins

HIVED_KEYS = frozenset({"jobPriorityClass", "skuType", "pinnedCellId", "lazyPreemptionEnable", "taskRoles"})
HIVED_ROLE_KEYS = frozenset({"skuType", "affinityGroupName"})
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
            case "com.microsoft.pai.runtimeplugin":
                check_runtime_plugins(check, extras[key], path, data)
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
            case "taskRoles":
                _check_hived_roles(check, value, where, data)
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
            if key in HIVED_ROLE_KEYS:
                if value is None:
                    continue  # `skuType: null`: any sku, as in OpenPAI; no affinity group
                check.string(value, (*where, key), non_empty=True)
            else:
                check.ignore((*where, str(key)), "a hivedScheduler task role field PAI does not act on")


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
