"""A job's secret reaches its task and nothing else: not the JetStream store
(events and every bucket), not any file of the data dir but the task's own log,
not an API answer; and a task cannot read the platform's files."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from services.launcher.backends.local_layout import OUTPUT_LOG, STDERR_LOG, TaskFiles, is_record_name
from tests.integration.conftest import Api, job_yaml

pytestmark = pytest.mark.integration

SECRET = f"Sk-{uuid.uuid4().hex}-never-shown"
# Text the job writes next to the secret: proof that the store was searched
# after the job's events reached it.
MARKER = f"marker-{uuid.uuid4().hex}"


def files_under(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and not path.is_symlink()]


def content(path: Path) -> bytes:
    """A file's bytes; b"" for one that went away meanwhile (a store's temporary file)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def holding(root: Path, needle: bytes, *, but: set[Path] = frozenset()) -> list[Path]:
    return [path for path in files_under(root) if path not in but and needle in content(path)]


async def store_holds(nats_dir: Path, needle: bytes, timeout: float = 15.0) -> bool:
    for _ in range(int(timeout / 0.25)):
        if holding(nats_dir, needle):
            return True
        await asyncio.sleep(0.25)
    return False


async def test_a_secret_reaches_its_task_and_nothing_else(platform: Api):
    data = platform.platform.data
    token = platform.conn.token
    name = f"secret-{uuid.uuid4().hex[:6]}"
    commands = [
        "printf %s '<% $secrets.token %>' | sha256sum | cut -d' ' -f1 > secret.sha256",
        "id -u > uid.txt",
        f"echo 'printed <% $secrets.token %> {MARKER}'",
        "cat ../../../admin-token > stolen.txt 2>&1 || true",
        f"cat {data}/admin-token >> stolen.txt 2>&1 || true",
        f"ls {data} >> stolen.txt 2>&1 || true",
        f"cat {data}/secrets.key >> stolen.txt 2>&1 || true",
        f"ls {data}/nats >> stolen.txt 2>&1 || true",
    ]
    accepted = await platform.submit(job_yaml(name, commands, extra=f"secrets:\n  token: {SECRET}\n"))
    job = accepted["job"]
    detail = await platform.wait_state(job, {"SUCCEEDED", "FAILED"})
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail

    # The task received the secret, as its own user, and could not read the platform's files.
    # Where the launcher keeps working directories (outside the data dir when a directory above it bars task users).
    work_dirs = [path for path in platform.work_root.iterdir() if path.name.startswith(f"admin.{name}.")]
    assert len(work_dirs) == 1
    work = work_dirs[0]
    assert (work / "secret.sha256").read_text().strip() == hashlib.sha256(SECRET.encode()).hexdigest()
    if os.geteuid() == 0:
        assert int((work / "uid.txt").read_text()) != 0
        stolen = (work / "stolen.txt").read_text()
        assert token not in stolen and "PRIVATE KEY" not in stolen
        # Each read refused; the relative one finds nothing when the working directories are not in the data dir.
        assert stolen.count("Permission denied") + stolen.count("No such file") == 5, stolen
        assert stat.S_IMODE(data.stat().st_mode) & 0o044 == 0  # nobody else lists it (0711 or 0700)
        for private in ("admin-token", "secrets.key", "secrets.pub"):
            assert stat.S_IMODE((data / private).stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "nats").stat().st_mode) == 0o700

    # The API shows the output scrubbed, and the secret in no answer.
    logs = await platform.logs(job, taskRole="main", taskIndex=0)
    assert f"printed ****** {MARKER}" in logs
    answers = [
        logs,
        json.dumps(await platform.job(job)),
        json.dumps(await platform.client.request("GET", f"/api/v2/jobs/{job}/config")),
        json.dumps(await platform.client.request("GET", f"/api/v2/jobs/{job}/job-attempts")),
        json.dumps(await platform.client.request("GET", "/api/v2/jobs")),
        await platform.logs(job, taskRole="main", taskIndex=0, tailBytes=len(MARKER) + 20),
    ]
    assert all(SECRET not in answer for answer in answers)

    # Every event and every bucket: the JetStream store on disk. The scrubbed
    # output (task.exited's userLogTail) is there, the secret is not.
    nats_dir = data / "nats"
    assert await store_holds(nats_dir, f"printed ****** {MARKER}".encode())
    assert holding(nats_dir, SECRET.encode()) == []

    # Every file of the data dir but the task's own log.
    tasks = data / "launcher" / "tasks"
    records = [path for path in tasks.iterdir() if path.name.startswith(f"admin.{name}.") and is_record_name(path.name)]
    files = TaskFiles(str(records[0]))
    own_logs = {Path(files.beside(OUTPUT_LOG)), Path(files.beside(STDERR_LOG))}
    assert SECRET.encode() in Path(files.beside(OUTPUT_LOG)).read_bytes()  # the task's own output, as it printed it
    assert holding(data, SECRET.encode(), but=own_logs) == []
    # The task's record keeps the references.
    assert "<% $secrets.token %>" in records[0].read_text() and stat.S_IMODE(records[0].stat().st_mode) == 0o600


async def test_a_job_without_secrets_stores_none(platform: Api):
    name = f"plain-{uuid.uuid4().hex[:6]}"
    job = (await platform.submit(job_yaml(name, ["echo plain"], extra=f"secrets:\n  unused: {SECRET}\n")))["job"]
    assert (await platform.wait_state(job, {"SUCCEEDED", "FAILED"}))["jobStatus"]["state"] == "SUCCEEDED"
    # Secrets the commands never use are sealed nowhere and stored nowhere in plain text.
    assert holding(platform.platform.data / "nats", SECRET.encode()) == []
