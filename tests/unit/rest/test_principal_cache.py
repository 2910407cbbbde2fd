"""The principal cache alone: what it serves, and what makes it forget."""

from __future__ import annotations

import pytest

from services.rest.identity.cache import PrincipalCache
from services.rest.identity.core import Principal

ALICE_KEY = "token.alice.aaa"
BOB_KEY = "token.bob.bbb"


def principal(name: str) -> Principal:
    return Principal(username=name, admin=False, virtualClusters=("default",), grouplist=("default",))


def filled(*, expires_at: float | None = None) -> PrincipalCache:
    cache = PrincipalCache(max_age=5.0)
    cache.watching, cache.connection = True, 0
    cache.put(ALICE_KEY, principal("alice"), expires_at, epoch=cache.epoch, read_at=100.0)
    cache.put(BOB_KEY, principal("bob"), None, epoch=cache.epoch, read_at=100.0)
    return cache


def test_a_remembered_token_is_served_without_reading_the_bucket():
    assert filled().get(ALICE_KEY, 101.0, connection=0) == principal("alice")


@pytest.mark.parametrize(("change", "alice_kept", "bob_kept"), [
    ("token.alice.aaa", False, True),  # that token revoked or changed
    ("token.alice.other", True, True),  # another token of alice's
    ("user.alice", False, True),  # alice changed or deleted: all her tokens
    ("user.carol", True, True),
    ("group.default", False, False),  # what members of a group may do: everyone
    ("something.new", False, False),  # a key this version does not know: forget all, to be safe
], ids=lambda v: str(v))
def test_a_change_in_the_bucket_forgets_what_it_may_have_changed(change, alice_kept, bob_kept):
    cache = filled()
    cache.changed(change)
    assert (cache.get(ALICE_KEY, 101.0, connection=0) is not None) is alice_kept
    assert (cache.get(BOB_KEY, 101.0, connection=0) is not None) is bob_kept


@pytest.mark.parametrize(("now", "connection", "watching", "served"), [
    (104.9, 0, True, True),
    (105.1, 0, True, False),  # older than max_age: read again, whatever the watch said
    (101.0, 1, True, False),  # the connection came back since the watch started: it may be gone
    (101.0, 0, False, False),  # no watch running
], ids=["fresh", "too-old", "reconnected", "not-watching"])
def test_an_entry_is_served_only_while_it_can_be_trusted(now, connection, watching, served):
    cache = filled()
    cache.watching = watching
    assert (cache.get(ALICE_KEY, now, connection=connection) is not None) is served


def test_an_expired_token_is_not_served_even_when_fresh():
    cache = filled(expires_at=102.0)
    assert cache.get(ALICE_KEY, 101.9, connection=0) is not None
    assert cache.get(ALICE_KEY, 102.0, connection=0) is None


def test_a_lookup_begun_before_a_revocation_is_not_remembered():
    cache = filled()
    begun = cache.epoch
    cache.changed("token.carol.ccc")  # carol's token revoked while her lookup read the bucket
    cache.put("token.carol.ccc", principal("carol"), None, epoch=begun, read_at=101.0)
    assert cache.get("token.carol.ccc", 101.0, connection=0) is None


def test_nothing_is_remembered_without_a_watch():
    cache = PrincipalCache()
    cache.put(ALICE_KEY, principal("alice"), None, epoch=cache.epoch, read_at=100.0)
    cache.watching, cache.connection = True, 0
    assert len(cache) == 0 and cache.get(ALICE_KEY, 100.0, connection=0) is None


def test_the_cache_is_bounded():
    cache = PrincipalCache(max_entries=3)
    cache.watching, cache.connection = True, 0
    for n in range(10):
        cache.put(f"token.u{n}.x", principal(f"u{n}"), None, epoch=cache.epoch, read_at=100.0)
    assert len(cache) <= 3
    assert cache.get("token.u9.x", 100.0, connection=0) is not None
