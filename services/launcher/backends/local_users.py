"""Who local tasks run as.

A task must not act as the platform: when PAI runs as root, no task does.
Each job runs under a uid of its own, allocated by the launcher and recorded
(local_uids: never derived from the job id or anything else a user chooses,
never shared by two jobs while either's files or processes remain), with the
primary group of the configured task user (`task_user`; `pai up` creates
`pai-task` when it is missing, else `nobody` is used), and no other group. A
uid of its own means a job's files (its working directories are 0700) are out
of every other job's reach; a numeric uid needs no passwd entry.

When PAI does not run as root it cannot switch users: tasks run as the
platform's own user, and the data directory's modes are then no barrier to
them, nor can the launcher tell its shims' reports from theirs (README: run
PAI as root, or as a user of its own, to isolate tasks).
"""

from __future__ import annotations

import os
import pwd

import msgspec

DEFAULT_TASK_USER = "nobody"


class TaskUsers(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # the task user whose group tasks get (USER/LOGNAME of tasks)
    gid: int


def resolve(task_user: str | None) -> TaskUsers | None:
    """The users tasks run as; None: as the platform's own user (it is not root,
    or `task_user` is None: the caller asked for no switch)."""
    if task_user is None or os.geteuid() != 0:
        return None
    name = task_user or DEFAULT_TASK_USER
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"task_user {name!r} does not exist on this machine") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ValueError(f"task_user {name!r} is root or in root's group; tasks never run as root")
    return TaskUsers(name=entry.pw_name, gid=entry.pw_gid)
