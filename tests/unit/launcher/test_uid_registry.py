"""Job uids are allocated and recorded, never derived from the job id (issue 31)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from services.launcher.backends import local_uids
from services.launcher.backends.local_uids import JOB_UID_BASE, JOB_UID_COUNT, UidRegistry


def old_uid(job: str, count: int = JOB_UID_COUNT) -> int:
    """The rule PAI used before: a hash of the job id, modulo the range."""
    return JOB_UID_BASE + int.from_bytes(hashlib.sha256(job.encode()).digest()[:8], "big") % count


def colliding_pair() -> tuple[str, str]:
    """Two job ids of different users that the old rule put under one uid (a
    birthday search: about 2^14 hashes for a range of 2^28)."""
    seen: dict[int, str] = {}
    n = 0
    while True:
        for user in ("alice", "mallory"):
            job = f"{user}~train-{n}"
            uid = old_uid(job)
            if uid in seen and seen[uid].split("~")[0] != user:
                return seen[uid], job
            seen[uid] = job
        n += 1


def test_jobs_that_collide_under_the_old_rule_get_distinct_uids(tmp_path: Path):
    victim, attacker = colliding_pair()
    assert old_uid(victim) == old_uid(attacker)  # the attack that worked before
    registry = UidRegistry(tmp_path / "uids")
    assert registry.uid_of(victim) != registry.uid_of(attacker)


def test_a_name_aimed_at_a_uid_does_not_get_it(tmp_path: Path):
    """An attacker picks a name whose old uid is the victim's (found by trying
    names; a small range makes the search quick here): it gets a uid of its own."""
    count = 1 << 10
    victim = "alice~important"
    aimed = next(
        job for job in (f"mallory~x{n}" for n in range(100 * count)) if old_uid(job, count) == old_uid(victim, count)
    )
    registry = UidRegistry(tmp_path / "uids", count=count)
    victims = registry.uid_of(victim)
    assert registry.uid_of(aimed) != victims
    assert registry.uid_of(victim) == victims


def test_many_jobs_get_distinct_uids_in_the_range_and_each_keeps_its_own(tmp_path: Path):
    registry = UidRegistry(tmp_path / "uids")
    jobs = [f"user{n % 7}~job-{n}" for n in range(3000)]
    uids = [registry.uid_of(job) for job in jobs]
    assert len(set(uids)) == len(jobs)
    assert all(JOB_UID_BASE <= uid < JOB_UID_BASE + JOB_UID_COUNT for uid in uids)
    assert [registry.uid_of(job) for job in jobs] == uids  # a job's later attempts: the same uid


def test_a_restart_keeps_every_jobs_uid_and_never_hands_one_out_again(tmp_path: Path):
    first = UidRegistry(tmp_path / "uids")
    before = {job: first.uid_of(job) for job in (f"alice~j{n}" for n in range(50))}
    first.close()
    again = UidRegistry(tmp_path / "uids")
    assert {job: again.uid_of(job) for job in before} == before
    new = again.uid_of("bob~new")
    assert new not in before.values()
    assert stat.S_IMODE(os.stat(tmp_path / "uids").st_mode) == 0o700


def test_a_uid_handed_out_before_a_crash_is_not_handed_out_again_even_if_its_record_was_lost(tmp_path: Path):
    """The next uid is reserved ahead, durably: a link lost with the machine
    does not make its uid free for another job."""
    registry = UidRegistry(tmp_path / "uids")
    lost = registry.uid_of("alice~before-crash")
    registry.close()
    log = tmp_path / "uids" / local_uids.LOG_FILE
    # As if the machine crashed before the allocation's line reached the disk
    # (the fsynced reservation did), leaving half a line.
    kept = [line for line in log.read_bytes().splitlines(keepends=True) if not line.startswith(b"+")]
    log.write_bytes(b"".join(kept) + b'+12')
    again = UidRegistry(tmp_path / "uids")
    assert again.get("alice~before-crash") is None
    assert again.uid_of("mallory~after-crash") != lost
    again.close()
    assert UidRegistry(tmp_path / "uids").get("mallory~after-crash") == again.get("mallory~after-crash")


def test_the_log_is_rewritten_when_releases_pile_up_and_keeps_every_live_uid(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(local_uids, "COMPACT_AFTER_LINES", 20)
    registry = UidRegistry(tmp_path / "uids")
    live = {job: registry.uid_of(job) for job in ("alice~stays", "bob~stays")}
    for n in range(30):
        registry.uid_of(f"carol~gone-{n}")
        registry.release(f"carol~gone-{n}")
    log = tmp_path / "uids" / local_uids.LOG_FILE
    assert len(log.read_bytes().splitlines()) < 20
    registry.close()
    again = UidRegistry(tmp_path / "uids")
    assert {job: again.get(job) for job in live} == live
    assert again.uid_of("dave~new") not in live.values()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_launcher_killed_at_once_leaves_its_allocations_recorded(tmp_path: Path):
    program = (
        "import os, sys; from pathlib import Path\n"
        "from services.launcher.backends.local_uids import UidRegistry\n"
        f"r = UidRegistry(Path({str(tmp_path / 'uids')!r}))\n"
        "print(r.uid_of('alice~a'), r.uid_of('bob~b'), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3])
    a, b = map(int, done.stdout.split())
    registry = UidRegistry(tmp_path / "uids")
    assert (registry.get("alice~a"), registry.get("bob~b")) == (a, b)
    assert registry.uid_of("carol~c") not in (a, b)


def test_a_released_uid_may_go_to_another_job_only_after_release(tmp_path: Path):
    registry = UidRegistry(tmp_path / "uids", count=4)
    held = [registry.uid_of(f"alice~j{n}") for n in range(4)]
    with pytest.raises(local_uids.RangeExhausted):
        registry.uid_of("bob~one-too-many")
    assert registry.release("alice~j2") == held[2]
    assert registry.uid_of("bob~one-too-many") == held[2]
    registry.close()
    assert UidRegistry(tmp_path / "uids", count=4).get("bob~one-too-many") == held[2]


def test_uids_tasks_on_record_ran_under_are_adopted_when_the_registry_is_made(tmp_path: Path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    legacy = old_uid("alice~old")
    (tasks / "alice.old.1.worker.0.0").write_bytes(
        b'{"key":{"job":"alice~old","attempt":1,"role":"worker","index":0},"uid":%d,"slug":"alice.old.1.worker.0.0"}\n'
        % legacy
    )
    registry = local_uids.open_registry(tmp_path, tasks)
    assert registry.get("alice~old") == legacy and registry.job_of(legacy) == "alice~old"
    assert not (tmp_path / "uids.new").exists()


def test_a_second_launcher_cannot_open_a_registry_in_use(tmp_path: Path):
    first = UidRegistry(tmp_path / "uids")
    with pytest.raises(local_uids.RegistryInUse, match="in use by another PAI launcher"):
        UidRegistry(tmp_path / "uids")
    first.close()
    assert UidRegistry(tmp_path / "uids").get("anyone") is None


def test_processes_of_finds_a_uid_in_use(tmp_path: Path):
    mine = os.getuid()
    assert local_uids.processes_of({mine, JOB_UID_BASE + JOB_UID_COUNT - 1}) == {mine}
