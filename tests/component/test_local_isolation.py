"""Local tasks isolated from the platform and from each other, and given their
secrets through memory only (the launcher runs as root here, as in CI)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from pathlib import Path

import pytest
import pytest_asyncio

from services.launcher.backends import local_uids, local_users
from services.launcher.backends.local_layout import OUTPUT_LOG, STDERR_LOG
from tests.component.test_local_backend import Harness, launch, open_harness, read_pid, task_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks change user only when the launcher runs as root")

TOKEN = "admin-token-text-0f9e8d7c"
SECRET = "s3cret-Local-Value-42"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir laid out as `pai up` leaves it: traverse-only, private files."""
    data = tmp_path_factory.mktemp("pai-data")
    (data / "admin-token").write_text(TOKEN + "\n")
    (data / "admin-token").chmod(0o600)
    (data / "secrets.key").write_text("PRIVATE KEY\n")
    (data / "secrets.key").chmod(0o600)
    (data / "nats").mkdir(mode=0o700)
    (data / "nats" / "store.blk").write_text(TOKEN)
    data.chmod(0o711)
    return data


@pytest_asyncio.fixture(scope="module")
async def isolated(data_dir: Path):
    harness = await open_harness(data_dir / "launcher", grace_seconds=2.0, task_user="")
    yield harness
    await harness.close()


def output(harness: Harness, key) -> str:
    return task_file(harness.backend, key, OUTPUT_LOG).read_text()


async def test_a_task_runs_as_its_jobs_own_uid_never_root(isolated: Harness):
    task = launch("whoami", "id -u > uid.txt", "id -g > gid.txt", "id -G > groups.txt", 'echo "$HOME $USER" > home.txt')
    finished = await isolated.run(task)
    assert finished.exitCode == 0, output(isolated, task.key)
    work = isolated.work_dir(task.key)
    users = local_users.resolve("")
    assert users is not None
    uid = int((work / "uid.txt").read_text())
    assert isolated.backend.uids is not None
    assert uid != 0 and uid == isolated.backend.uids.get("alice~whoami")  # allocated, recorded
    assert local_uids.JOB_UID_BASE <= uid < local_uids.JOB_UID_BASE + local_uids.JOB_UID_COUNT
    assert int((work / "gid.txt").read_text()) == users.gid != 0
    assert (work / "groups.txt").read_text().split() == [str(users.gid)]  # no supplementary group
    assert (work / "home.txt").read_text().split() == [str(work), users.name]
    assert stat.S_IMODE(work.stat().st_mode) == 0o700 and work.stat().st_uid == uid


@pytest.mark.parametrize(
    "attempt",
    [
        "cat {relative_data}/admin-token",
        "cat {data}/admin-token",
        "ls {data}",
        "ls {data}/launcher/tasks",
        "cat {data}/secrets.key",
        "cat {data}/nats/store.blk",
        "ls {data}/launcher/work",
        "cat {tasks}/$PAI_TASK_KEY/spec.json",
        "cat {tasks}/$PAI_TASK_KEY/output.log",
    ],
    ids=["token-relative", "token", "list-data", "list-tasks", "private-key", "nats-store", "list-work-root", "own-spec",
         "own-log-file"],
)
async def test_a_task_cannot_reach_the_platforms_files(isolated: Harness, data_dir: Path, attempt: str):
    name = f"intruder-{abs(hash(attempt)) % 10_000}"
    # From the task's own working directory, wherever the backend put it.
    relative_data = os.path.relpath(data_dir, isolated.work_dir(launch(name, "true").key))
    command = attempt.format(data=data_dir, tasks=isolated.backend.tasks_dir, relative_data=relative_data)
    task = launch(name, command)
    finished = await isolated.run(task)
    log = output(isolated, task.key)
    assert finished.exitCode != 0, log
    # Refused, or not there at all: a data dir under /tmp is covered by the task's own /tmp.
    assert "Permission denied" in log or "No such file or directory" in log
    assert TOKEN not in log and TOKEN not in finished.userLogTail
    assert "PRIVATE KEY" not in log


async def test_a_task_cannot_read_another_jobs_working_directory(isolated: Harness):
    owner = launch("owner", "echo private-data > mine.txt")
    assert (await isolated.run(owner)).exitCode == 0
    theirs = isolated.work_dir(owner.key)
    reader = launch("reader", f"cat {theirs}/mine.txt")
    finished = await isolated.run(reader)
    assert finished.exitCode != 0
    assert "private-data" not in output(isolated, reader.key)
    assert "Permission denied" in output(isolated, reader.key) or "No such file" in output(isolated, reader.key)


async def test_a_bare_working_directory_passes_to_the_next_task_and_a_used_one_stays(isolated: Harness):
    users = local_users.resolve("")
    assert users is not None
    quiet = launch("quiet", "true")
    assert (await isolated.run(quiet)).exitCode == 0
    left_bare = os.stat(isolated.work_dir(quiet.key))
    # The next task gets that directory (the backend offers the latest one a
    # shim reported ended), made its own: empty, 0700, its uid.
    looker = launch("looker", "ls -A", "stat -c '%a %u' .", "echo seen > seen.txt")
    finished = await isolated.run(looker)
    assert finished.exitCode == 0, output(isolated, looker.key)
    work = isolated.work_dir(looker.key)
    assert os.stat(work).st_ino == left_bare.st_ino and not isolated.work_dir(quiet.key).exists()
    uids = isolated.backend.uids
    assert uids is not None
    assert output(isolated, looker.key) == f"700 {uids.get('alice~looker')}\n"
    # The looker wrote a file: its directory is its own to keep, and the task
    # after it gets a new one.
    after = launch("after", "ls -A", "stat -c '%a %u' .")
    assert (await isolated.run(after)).exitCode == 0
    assert os.stat(isolated.work_dir(after.key)).st_ino != left_bare.st_ino
    assert output(isolated, after.key) == f"700 {uids.get('alice~after')}\n"
    assert (work / "seen.txt").read_text() == "seen\n"
    assert (os.stat(work).st_uid, stat.S_IMODE(os.stat(work).st_mode)) == (uids.get("alice~looker"), 0o700)


async def test_secret_commands_reach_the_task_through_memory_only(isolated: Harness, data_dir: Path):
    references = [
        'printf %s "<% $secrets.token %>" | sha256sum | cut -d" " -f1 > secret.sha256',
        "tr '\\0' ' ' < /proc/$$/cmdline > cmdline.txt",
        "ls /proc/$$/fd > fds.txt",
        'echo "printed: <% $secrets.token %>"',
    ]
    filled_in = [line.replace("<% $secrets.token %>", SECRET) for line in references]
    task = launch("uses-secret", *references)
    await isolated.backend.start(task, secret_commands=filled_in)
    finished = await isolated.events.finished(task.key)
    assert finished.exitCode == 0, output(isolated, task.key)
    work = isolated.work_dir(task.key)
    # The task received the value ...
    assert (work / "secret.sha256").read_text().strip() == hashlib.sha256(SECRET.encode()).hexdigest()
    assert f"printed: {SECRET}" in output(isolated, task.key)
    # ... not through its argv (readable by every user), nor an fd left open.
    assert SECRET not in (work / "cmdline.txt").read_text()
    assert sorted((work / "fds.txt").read_text().split(), key=int) == ["0", "1", "2"]
    # The record keeps the references; no file but the task's own log holds the value.
    spec = (isolated.backend.tasks_dir / task.key.slug).read_text()
    assert "<% $secrets.token %>" in spec and SECRET not in spec
    own_log = {task_file(isolated.backend, task.key, name) for name in (OUTPUT_LOG, STDERR_LOG)}
    holding = [p for p in data_dir.rglob("*") if p.is_file() and p not in own_log and SECRET.encode() in p.read_bytes()]
    assert holding == []
    assert stat.S_IMODE(task_file(isolated.backend, task.key, OUTPUT_LOG).stat().st_mode) == 0o600


async def test_a_task_of_another_user_is_stopped_with_its_grace_and_readopted(isolated: Harness, data_dir: Path):
    task = launch("stoppable", "trap 'echo got-term; exit 7' TERM", "echo $$ > pid", "while true; do sleep 0.1; done")
    await isolated.backend.start(task)
    await isolated.events.running(task.key)
    pid = await read_pid(isolated.work_dir(task.key) / "pid")
    # A launcher restart: the new one re-adopts the task, then stops it.
    await isolated.close()
    again = await open_harness(data_dir / "launcher", grace_seconds=2.0, task_user="")
    try:
        assert task.key in await again.backend.recover()
        await again.backend.kill(task.key, grace_seconds=2.0, reason="Stopped")
        finished = await again.events.finished(task.key)
    finally:
        await again.close()
    assert finished.exitCode == 7 and finished.platformReason == "Stopped"
    assert "got-term" in finished.userLogTail
    await asyncio.sleep(0)
    assert not Path(f"/proc/{pid}").exists()
