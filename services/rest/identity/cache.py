"""Who a bearer token is, remembered: token key -> `Principal`, so a signed-in request
costs no NATS round trip (reading the token, the user and each of their groups took
four or more per request).

A revoked token, a deleted or changed user, a changed group must stop counting at
once, so the cache forgets:
- on this replica, right after any request that changed identities (the auth
  middleware clears it; a revocation answered 200 is in force for the next request);
- on every replica, when the KV watch on pai_users delivers the change (about a
  millisecond after it is stored): a token key forgets that token, a user key that
  user's tokens, a group key everything;
- at the latest `MAX_AGE_SECONDS` after an entry was read from the bucket, as a
  backstop should a watch ever miss a change without its connection breaking.
While the watch is not running (rest starting, NATS away or just back) nothing is
remembered and every request reads the bucket, as without the cache.

A token's expiry is checked against the clock at every request, cached or not.

The cache is pure (times are passed in); `watch` is its thin async shell.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from libs.common.bus import Bus, watch_key
from libs.common.subjects import Bucket
from services.rest.identity.core import Principal

log = logging.getLogger("pai.rest.identity")

MAX_AGE_SECONDS = 5.0
MAX_ENTRIES = 50_000  # past this, the cache starts over (made-up tokens never get in: only live ones do)


class _Entry(msgspec.Struct, frozen=True):
    principal: Principal
    expires_at: float | None
    read_at: float


class PrincipalCache:
    def __init__(self, *, max_age: float = MAX_AGE_SECONDS, max_entries: int = MAX_ENTRIES) -> None:
        self.max_age = max_age
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}  # by token key (token.<user>.<sha256>)
        # Bumped by every forgetting: a lookup that began before one may have read
        # what was just revoked, so what it read is not remembered.
        self.epoch = 0
        # Whether changes are being watched; nothing is remembered while not.
        self.watching = False
        # The connection the watch runs on (its count of reconnects): after a
        # reconnect the watch may be gone, so nothing is served until it restarts.
        self.connection = -1

    def get(self, token_key: str, now: float, *, connection: int) -> Principal | None:
        entry = self._entries.get(token_key)
        if entry is None:
            return None
        if not self.watching or connection != self.connection or now - entry.read_at > self.max_age or (
                entry.expires_at is not None and now >= entry.expires_at):
            del self._entries[token_key]
            return None
        return entry.principal

    def put(self, token_key: str, principal: Principal, expires_at: float | None, *, epoch: int, read_at: float) -> None:
        """Remember what a lookup that began at `epoch` read at `read_at` (dropped if something was forgotten since)."""
        if not self.watching or epoch != self.epoch:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[token_key] = _Entry(principal, expires_at, read_at)

    def clear(self) -> None:
        self._entries.clear()
        self.epoch += 1

    def changed(self, bucket_key: str) -> None:
        """A key of pai_users was written or deleted: forget what it may have changed."""
        self.epoch += 1
        kind, _, rest = bucket_key.partition(".")
        if kind == "token":
            self._entries.pop(bucket_key, None)
        elif kind == "name":
            pass  # the claim of a user name (store.name_key) changes nobody's rights
        elif kind == "user":
            for key in [k for k, e in self._entries.items() if e.principal.username == rest]:
                del self._entries[key]
        else:  # a group (what its members may do), or a key this version does not know
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


async def watch(cache: PrincipalCache, bus: Bus, stopping: asyncio.Event,
                on_ready: Callable[[], None] | None = None) -> None:
    """Feed `cache` the changes of pai_users until `stopping`; start again after every reconnect."""

    def began(connection: int, stored: int) -> None:
        # Every change after this point is delivered (the stored values first: each
        # only makes the cache forget, harmless on a cache that starts empty).
        cache.clear()
        cache.connection = connection
        cache.watching = True
        if on_ready is not None:
            on_ready()

    def ended() -> None:
        cache.watching = False
        cache.clear()

    await watch_key(bus, Bucket.USERS, stopping, lambda entry: cache.changed(entry.key), meta_only=True,
                    on_start=began, on_end=ended)
