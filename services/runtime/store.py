"""Where the rule set admins change at run time is kept: key `rules` of the
`pai_rules` bucket, an admin-editable document (`libs.common.documents`). What
the value means, and every edit, is the core's (`services.runtime.core.rulebook`),
so the store hands the stored bytes as they are: the core says what is wrong
with an unreadable value.

One value keeps every change atomic: a writer names the revision it read
(`last=`), so of two admins changing rules at once, the second write fails and
is redone on top of the first instead of erasing it. An absent key means "the
rule set PAI starts with".
"""

from __future__ import annotations

from nats.js.kv import KeyValue

from libs.common.documents import DocumentStore, Snapshot

RULES_KEY = "rules"

# The bucket's `rules` value at one revision, as stored (value None: nothing stored).
RuleSnapshot = Snapshot[bytes]


class RuleStore(DocumentStore[bytes]):
    """The `rules` key of the `pai_rules` bucket."""

    def __init__(self, kv: KeyValue):
        super().__init__(kv, RULES_KEY, bytes)
