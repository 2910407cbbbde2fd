"""A shell in a running process task: the step that enters it (run as a child of the
launcher, on the terminal's pty, still root where the launcher is).

    python -m services.launcher.backends.terminal_enter '{"pid": ..., "uid": ..., ...}'

In this order, each as far as the machine allows (a best effort only where said):
1. the pty becomes the controlling terminal of a session of its own (job control, ^C);
2. the task's cgroups, read from /proc/<pid>/cgroup, are joined (best effort): the
   shell's processes count against the task's memory, CPU and pids bounds, and the
   shim ends them with the task;
3. the task's mount namespace (its /proc hidepid=2, /tmp, /dev/shm, storages) is
   entered where the task has one of its own (`mounts`: local_namespaces);
4. supplementary groups dropped, then the job's gid and uid taken: never root in a
   task that runs under a uid of its own;
5. its working directory, then bash (sh where there is none) replaces this process, its
   prompt naming the task (PS1), reading the task's ~/.bashrc alone.
The environment is the task's own (the launcher passes spec.json's `env`, TERM added).
A step that fails where it must not (namespace, identity, directory) ends this process
with a message on the terminal, before any shell starts.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import sys
import termios

CLONE_NEWNS = 0x00020000
CGROUP_ROOT = "/sys/fs/cgroup"


def _cgroup_mounts() -> dict[str, str]:
    """Where each cgroup hierarchy is mounted: v1 controller name (and `name=...`) ->
    mount point, "" -> the cgroup2 mount."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            head, _, tail = line.partition(" - ")
            fields, more = head.split(), tail.split()
            if len(fields) < 5 or len(more) < 3:
                continue
            if more[0] == "cgroup2":
                found.setdefault("", fields[4])
            elif more[0] == "cgroup":
                for option in more[2].split(","):
                    found.setdefault(option, fields[4])
    return found


def join_cgroups(pid: int) -> list[str]:
    """Move this process into every cgroup of `pid`; the hierarchies it could not join."""
    mounts = _cgroup_mounts()
    missed: list[str] = []
    with open(f"/proc/{pid}/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            names = [c for c in controllers.split(",") if c] or [""]
            root = next((mounts[c] for c in names if c in mounts), None)
            if root is None or path == "/":
                continue
            try:
                with open(os.path.join(root, path.lstrip("/"), "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
            except OSError:
                missed.append(controllers or "cgroup2")
    return missed


def enter_mounts(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNS) != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"{os.strerror(number)} (entering the task's mount namespace)")
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    plan = json.loads(argv[1])
    pid = int(plan["pid"])
    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError:
        pass  # a shell without job control still works
    try:
        join_cgroups(pid)
        if plan.get("mounts"):
            enter_mounts(pid)
        uid, gid = plan.get("uid"), plan.get("gid")
        if uid is not None and os.getuid() == 0:
            os.setgroups([])
            os.setgid(int(gid if gid is not None else uid))
            os.setuid(int(uid))
        os.chdir(plan["cwd"])
    except OSError as exc:
        sys.stderr.write(f"pai: cannot enter the task: {exc}\r\n")
        sys.stderr.flush()
        os._exit(126)
    shell = shutil.which("bash") or "/bin/sh"
    # The task's uid has no name in the user database ("I have no name!" in the system
    # bashrc's prompt): the prompt names the task instead, and only the task's own
    # ~/.bashrc (HOME is its working directory) is read.
    os.environ.setdefault("PS1", r"\[\e[1m\]${PAI_CURRENT_TASK_ROLE_NAME:-task}[${PAI_TASK_INDEX:-0}]\[\e[0m\] \w\$ ")
    if shell.endswith("bash"):
        os.execv(shell, [shell, "--rcfile", os.path.join(os.environ.get("HOME", plan["cwd"]), ".bashrc"), "-i"])
    os.execv(shell, [shell, "-i"])


if __name__ == "__main__":
    main(sys.argv)
