"""Jobs whose ids collided under the old uid rule run as distinct uids, keep
them across a launcher restart, and give them back only once pruned (issue 31;
the launcher runs as root here, as in CI)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import msgspec
import pytest

from services.launcher.backends import local as local_backend
from services.launcher.backends.local_layout import OUTPUT_LOG
from services.launcher.backends.local_uids import UidRegistry
from services.launcher.core.tasks import TaskKey
from tests.component.test_local_backend import launch, open_harness, task_file, wait_until
from tests.unit.launcher.test_uid_registry import colliding_pair, old_uid

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks run as other uids only when the launcher runs as root")


def of_job(job: str, *commands: str, attempt: int = 0):
    user, _, name = job.partition("~")
    task = launch(name, *commands)
    return msgspec.structs.replace(task, key=TaskKey(job=job, attempt=attempt, role="worker", index=0), user=user)


async def test_a_job_named_to_share_anothers_uid_cannot_read_its_files_and_uids_survive_a_restart(tmp_path: Path):
    tmp_path.chmod(0o711)
    victim_job, attacker_job = colliding_pair()
    assert old_uid(victim_job) == old_uid(attacker_job)
    harness = await open_harness(tmp_path / "launcher", task_user="")
    try:
        victim = of_job(victim_job, "echo private > secret.txt", "chmod 600 secret.txt", "id -u")
        assert (await harness.run(victim)).exitCode == 0
        theirs = harness.work_dir(victim.key)
        attacker = of_job(attacker_job, "id -u", f"cat {theirs}/secret.txt")
        stolen = await harness.run(attacker)
        victim_uid = harness.backend.uids.get(victim_job)
        attacker_uid = harness.backend.uids.get(attacker_job)
    finally:
        await harness.close()
    assert victim_uid is not None and attacker_uid is not None and victim_uid != attacker_uid
    log = task_file(harness.backend, attacker.key, OUTPUT_LOG).read_text()
    assert stolen.exitCode != 0 and "private" not in log and "Permission denied" in log
    assert log.splitlines()[0] == str(attacker_uid)

    # Restarted, the launcher runs the victim's next attempt under the same uid.
    again = await open_harness(tmp_path / "launcher", task_user="")
    try:
        retry = of_job(victim_job, "id -u", attempt=1)
        finished = await again.run(retry)
        newcomer = of_job("carol~newcomer", "id -u")
        assert (await again.run(newcomer)).exitCode == 0
    finally:
        await again.close()
    assert finished.exitCode == 0
    assert task_file(again.backend, retry.key, OUTPUT_LOG).read_text() == f"{victim_uid}\n"
    newcomer_uid = int(task_file(again.backend, newcomer.key, OUTPUT_LOG).read_text())
    assert newcomer_uid not in (victim_uid, attacker_uid)


async def test_a_jobs_uid_goes_back_only_once_its_files_are_pruned_and_its_processes_gone(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(local_backend, "UID_RELEASE_SECONDS", 0.0)
    tmp_path.chmod(0o711)
    harness = await open_harness(tmp_path / "launcher", task_user="")
    try:
        task = of_job("alice~done", "true")
        assert (await harness.run(task)).exitCode == 0
        uids = harness.backend.uids
        uid = uids.get("alice~done")
        # A process still runs under the job's uid (one that escaped its task, say).
        stray = subprocess.Popen(["sleep", "60"], user=uid, group=uid)
        await harness.backend.forget(task.key)
        assert await harness.backend.prune(task.key)
        harness.backend.release_job("alice~done")
        await harness.backend._release_uids()
        assert uids.get("alice~done") == uid  # kept: a process runs under it
        assert uids.uid_of("bob~next") != uid
        stray.kill()
        stray.wait()
        await wait_until(lambda: uids.get("alice~done") is None)  # the sweep gives it back
    finally:
        await harness.close()
    assert UidRegistry(tmp_path / "launcher" / "uids").get("alice~done") is None
