"""A task cannot tell the local backend that another task ended (issue 31).

Shims ring an abstract unix socket that every process of the machine can reach;
the backend believes only datagrams whose sender (SCM_CREDENTIALS) runs as the
platform's user, as shims do. Tasks run as job uids (the launcher runs as root
here, as in CI)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import pytest_asyncio

from services.launcher import metrics
from services.launcher.core.tasks import TaskFinished
from tests.component.test_local_backend import Harness, is_running, launch, open_harness, read_pid, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks run as other uids only when the launcher runs as root")

# A program any uid can run (the project's virtualenv may sit where job uids cannot reach).
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else "python3"
FORGED_EXIT = {"exitCode": 0, "startedAt": 1.0, "finishedAt": 2.0, "outputBytes": 0}


def forge(doorbell: str, slug: str) -> str:
    """A Python program that rings the backend's doorbell: the victim ran and finished with exit 0."""
    return textwrap.dedent(
        f"""
        import json, socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for message in (b"R" + {slug!r}.encode() + b"\\nforged",
                        b"F" + {slug!r}.encode() + b"\\n" + json.dumps({FORGED_EXIT!r}).encode()):
            s.sendto(message, "\\0" + {doorbell!r})
        print("rang")
        """
    )


def victim(name: str):
    """A task that runs until the test creates `release` in its working directory, then exits 4."""
    return launch(name, "echo $$ > pid", "while [ ! -e release ]; do sleep 0.05; done", "exit 4")


@pytest_asyncio.fixture
async def isolated(tmp_path: Path):
    tmp_path.chmod(0o711)  # job uids traverse to their working directories
    harness = await open_harness(tmp_path / "launcher", grace_seconds=1.0, task_user="")
    yield harness
    await harness.close()


async def test_a_task_cannot_report_another_users_task_finished(isolated: Harness):
    target = victim("victim")
    await isolated.backend.start(target)
    await isolated.events.running(target.key)
    pid = await read_pid(isolated.work_dir(target.key) / "pid")

    # Another job's task, under its own uid, rings as the victim's shim would.
    program = forge(isolated.backend._doorbell, target.key.slug)
    attacker = launch("attacker", f'{PYTHON} -c "$FORGE"', env={"FORGE": program})
    attack = await isolated.run(attacker)
    # The attacker's datagrams were queued before its own shim's bell: all read by now.
    assert attack.exitCode == 0 and "rang" in attack.userLogTail, attack.userLogTail

    assert not [e for e in isolated.events.of(target.key) if isinstance(e, TaskFinished)]
    assert is_running(pid)
    # Its real end is still reported, with its real exit code.
    (isolated.work_dir(target.key) / "release").touch()
    finished = await isolated.events.finished(target.key)
    assert (finished.exitCode, finished.platformReason) == (4, "")


async def test_a_process_of_another_uid_cannot_report_a_task_finished_and_is_counted(isolated: Harness):
    target = victim("victim-2")
    await isolated.backend.start(target)
    await isolated.events.running(target.key)
    pid = await read_pid(isolated.work_dir(target.key) / "pid")
    dropped_before = metrics.FORGED_BELLS._value.get()

    program = forge(isolated.backend._doorbell, target.key.slug)
    sent = subprocess.run([PYTHON, "-c", program], user=0x7ABCDEF0, group=0x7ABCDEF0, capture_output=True, timeout=30)
    assert sent.stdout == b"rang\n", sent.stderr

    await wait_until(lambda: metrics.FORGED_BELLS._value.get() >= dropped_before + 2)
    assert not [e for e in isolated.events.of(target.key) if isinstance(e, TaskFinished)]
    assert is_running(pid)
    (isolated.work_dir(target.key) / "release").touch()
    finished = await isolated.events.finished(target.key)
    assert finished.exitCode == 4
