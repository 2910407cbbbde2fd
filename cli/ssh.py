"""`pai ssh JOB [ROLE [INDEX]]`: a shell in a running task of a job with OpenPAI's ssh plugin.

Reads GET /api/v2/jobs/{job}/ssh (the owner's answer carries the job's private key),
writes the key to a 0600 file in a private temporary directory, pins the task's host
key (every task's host key is the job's public key) and runs the system `ssh`; the
files are removed when ssh ends. Arguments after `--` go to ssh (a command to run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cli.client import Client, connect


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ssh", help="ssh into a running task of a job that runs the ssh plugin")
    p.add_argument("job", help="user~name")
    p.add_argument("role", nargs="?", help="task role (default: the first with an ssh server)")
    p.add_argument("index", nargs="?", type=int, default=0, help="task index (default 0)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then a command to run instead of a shell")
    p.set_defaults(func=cmd_ssh)


def choose(info: dict[str, Any], role: str | None, index: int) -> dict[str, Any]:
    """The task to reach, or SystemExit naming the ones there are (pure)."""
    tasks = info.get("containers") or []
    for task in tasks:
        if (role is None or task.get("taskRoleName") == role) and task.get("taskIndex") == index:
            return task
    there = ", ".join(f"{t.get('taskRoleName')} {t.get('taskIndex')}" for t in tasks) or "none"
    raise SystemExit(f"no running task {role or '(any role)'} {index} with an ssh server; there are: {there}")


def ssh_argv(task: dict[str, Any], key: Path, known_hosts: Path, command: list[str]) -> list[str]:
    return ["ssh", "-i", str(key), "-p", str(task["sshPort"]), "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            f"{task['user']}@{task['sshIp']}", *command]


def cmd_ssh(args: argparse.Namespace) -> int:
    client = Client(connect(args))
    info = asyncio.run(client.request("GET", f"/api/v2/jobs/{args.job}/ssh"))
    task = choose(info, args.role, args.index)
    pair = info.get("keyPair") or {}
    if not pair.get("privateKey"):
        print("the job's private key is given to the job's owner only; use a key of your profile "
              f"(extension.sshKeys): {task.get('sshCommand', '')}", file=sys.stderr)
        return 2
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with tempfile.TemporaryDirectory(prefix="pai-ssh-") as tmp:  # 0700
        key = Path(tmp) / "job_key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(pair["privateKey"])
        known_hosts = Path(tmp) / "known_hosts"
        known_hosts.write_text(f"[{task['sshIp']}]:{task['sshPort']} {pair['publicKey']}\n")
        return subprocess.call(ssh_argv(task, key, known_hosts, command))
