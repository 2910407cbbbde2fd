"""Where the rule set admins change at run time is kept: key `rules` of the
`pai_rules` bucket. NATS plumbing only; what the value means, and every edit,
is the core's (`services.runtime.core.rulebook`).

One value keeps every change atomic: a writer names the revision it read
(`last=`), so of two admins changing rules at once, the second write fails and
is redone on top of the first instead of erasing it. An absent key means "the
rule set PAI starts with".
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

RULES_KEY = "rules"


class RuleSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The bucket's `rules` value at one revision, as stored."""

    value: bytes | None  # None: nothing stored (never written, or deleted)
    revision: int  # 0: the key was never written (or its history is gone)


class RuleStore:
    """The `rules` key of the `pai_rules` bucket."""

    def __init__(self, kv: KeyValue):
        self.kv = kv

    async def read(self) -> RuleSnapshot:
        try:
            entry = await self.kv.get(RULES_KEY)
        except nats.js.errors.KeyNotFoundError:  # also a deleted key
            return RuleSnapshot(value=None, revision=0)
        return RuleSnapshot(value=entry.value, revision=entry.revision or 0)

    async def write(self, value: bytes, *, last: int) -> int:
        """Store `value` if the key is still at revision `last`; its new revision.

        Raises nats.js.errors.KeyWrongLastSequenceError when someone wrote first."""
        if last == 0:
            return await self.kv.create(RULES_KEY, value)
        return await self.kv.update(RULES_KEY, value, last=last)

    async def watch(self) -> AsyncIterator[RuleSnapshot]:
        """The current rule set, then every change to it, as they happen."""
        watcher = await self.kv.watch(RULES_KEY)
        try:
            async for entry in watcher:
                if entry is None:  # "nothing stored yet" marker
                    continue
                deleted = entry.operation in (KV_DEL, KV_PURGE)
                yield RuleSnapshot(value=None if deleted else entry.value, revision=entry.revision or 0)
        finally:
            await watcher.stop()
