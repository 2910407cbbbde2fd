"""Which pooled task cgroups a shim tries, in what order (local_limits._pool_candidates):
its own with the task's bounds, then the pool's with the same bounds, then the rest;
never a running task's cgroup. The listing is a plain directory here."""

from __future__ import annotations

import pytest

from services.launcher.backends import local_limits
from services.launcher.backends.local_limits import POOL_PREFIX


@pytest.fixture
def own_pool(monkeypatch):
    pooled: list[str] = []
    monkeypatch.setattr(local_limits, "_pooled_here", pooled)
    monkeypatch.setattr(local_limits, "_listed", {})
    return pooled


def test_own_then_same_bounds_then_others_and_never_a_running_task(tmp_path, own_pool, monkeypatch):
    same, other = f"{POOL_PREFIX}512m-1c-64p-o0-", f"{POOL_PREFIX}256m-2c-64p-o0-"
    names = [f"{same}9.{i}" for i in range(4)] + [f"{other}9.{i}" for i in range(3)]
    for name in [*names, "alice.job.worker.0.0", "bob.x.w.1.0"]:  # two running tasks' cgroups
        (tmp_path / name).mkdir()
    own_pool.extend([f"{other}1.0", f"{same}1.7"])
    monkeypatch.setattr(local_limits.os, "getpid", lambda: 3)  # where this shim starts in each group
    got = list(local_limits._pool_candidates(str(tmp_path), "512m-1c-64p"))
    assert got[0] == f"{same}1.7"  # its own, with the bounds: nothing to rewrite
    assert own_pool == [f"{other}1.0"]  # taken from its own list; the other-bounds one stays
    listed = got[1:]
    assert sorted(listed[:4]) == sorted(names[:4]) and sorted(listed[4:]) == sorted(names[4:])
    assert not any(name.startswith(("alice", "bob")) for name in got)


def test_shims_start_at_different_places_in_the_pool(tmp_path, own_pool, monkeypatch):
    same = f"{POOL_PREFIX}512m-1c-64p-o0-"
    for i in range(5):
        (tmp_path / f"{same}9.{i}").mkdir()
    firsts = set()
    for pid in range(5):
        monkeypatch.setattr(local_limits.os, "getpid", lambda pid=pid: pid)
        got = list(local_limits._pool_candidates(str(tmp_path), "512m-1c-64p"))
        assert sorted(got) == sorted(f"{same}9.{i}" for i in range(5))  # each tries every one
        firsts.add(got[0])
    assert len(firsts) == 5


def test_a_parent_that_is_gone_offers_only_its_own(tmp_path, own_pool):
    mine = f"{POOL_PREFIX}512m-1c-64p-o0-1.0"
    own_pool.append(mine)
    assert list(local_limits._pool_candidates(str(tmp_path / "gone"), "512m-1c-64p")) == [mine]


def test_a_claim_tries_what_the_last_listing_left_before_listing_again(tmp_path, own_pool, monkeypatch):
    same = f"{POOL_PREFIX}512m-1c-64p-o0-"
    for i in range(3):
        (tmp_path / f"{same}9.{i}").mkdir()
    listings = []
    real_listdir = local_limits.os.listdir
    monkeypatch.setattr(local_limits.os, "listdir", lambda path: listings.append(path) or real_listdir(path))
    first = next(local_limits._pool_candidates(str(tmp_path), "512m-1c-64p"))  # claimed: the claim stops there
    (tmp_path / first).rmdir()
    (tmp_path / f"{same}9.7").mkdir()  # pooled since by another shim: not seen until the next listing
    second = local_limits._pool_candidates(str(tmp_path), "512m-1c-64p")
    cached = [next(second), next(second)]
    assert sorted([first, *cached]) == sorted(f"{same}9.{i}" for i in range(3))  # the listing's, untried
    assert len(listings) == 1
    for name in cached:  # taken by other shims meanwhile
        (tmp_path / name).rmdir()
    assert list(second) == [f"{same}9.7"]  # then a new listing
    assert len(listings) == 2
