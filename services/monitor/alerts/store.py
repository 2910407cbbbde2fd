"""Where alerts live between restarts: two buckets the monitor owns. NATS plumbing only.

`pai_alert_rules`, key `rules`: the rule document an admin set at run time
(absent or empty: the shipped defaults, or `alert_rules_file`), an
admin-editable document (`libs.common.documents`). One value, so
a change is atomic; writers name the revision they read (`last=`), so of two
admins changing rules at once the second is refused as stale instead of
silently erasing the first. Every monitor replica watches the key.

`pai_alerts`: `alert.<sha1 of fingerprint>` (AlertRecord, what the API lists),
`group.<sha1 of group key>` (GroupState: what was last mailed about a group),
`sent.<sha1 of notification id>` (a job-state mail claimed before sending, so a
redelivered event or a restart never mails it twice), `report.<ISO week>`
(the weekly report was mailed).
"""

from __future__ import annotations

import hashlib

import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from libs.common import documents
from libs.common.alerts_messages import ALERT_KEY_PREFIX, AlertRecord
from libs.common.bus import all_keys
from services.monitor.alerts.core import GroupState, fingerprint_key

RULES_KEY = "rules"
GROUP_PREFIX = "group."
SENT_PREFIX = "sent."
REPORT_PREFIX = "report."


class RuleDocument(msgspec.Struct, frozen=True, kw_only=True):
    """The stored value: the YAML as the admin sent it ("" = back to the baseline)."""

    yaml: str
    by: str = ""
    at: float = 0.0


# The key's value at one revision (value None: nothing stored, or not readable).
Snapshot = documents.Snapshot[RuleDocument]
_alert_decoder = msgspec.json.Decoder(AlertRecord)
_group_decoder = msgspec.json.Decoder(GroupState)


class RulesKey(documents.DocumentStore[RuleDocument]):
    """Key `rules` of `pai_alert_rules`, an admin-editable document (`libs.common.documents`)."""

    def __init__(self, kv: KeyValue):
        super().__init__(kv, RULES_KEY, RuleDocument)


class AlertStore:
    def __init__(self, kv: KeyValue):
        self.kv = kv

    async def load(self) -> tuple[list[AlertRecord], list[GroupState]]:
        alerts: list[AlertRecord] = []
        groups: list[GroupState] = []
        for key in await all_keys(self.kv):
            if not key.startswith((ALERT_KEY_PREFIX, GROUP_PREFIX)):
                continue
            value = await self._get(key)
            if value is None:
                continue
            try:
                if key.startswith(ALERT_KEY_PREFIX):
                    alerts.append(_alert_decoder.decode(value))
                else:
                    groups.append(_group_decoder.decode(value))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # an older or damaged value: the next evaluation writes a good one
        return alerts, groups

    async def put_alert(self, alert: AlertRecord) -> None:
        await self.kv.put(ALERT_KEY_PREFIX + fingerprint_key(alert.fingerprint), msgspec.json.encode(alert))

    async def forget_alert(self, fingerprint: str) -> None:
        await self.kv.delete(ALERT_KEY_PREFIX + fingerprint_key(fingerprint))

    async def put_group(self, group: GroupState) -> None:
        await self.kv.put(GROUP_PREFIX + fingerprint_key(group.key), msgspec.json.encode(group))

    async def claim(self, prefix: str, name: str) -> bool:
        """True for the first caller ever to claim `name` (a mail, a week's report)."""
        try:
            # JSON like every value of the bucket, so readers may decode it whole.
            await self.kv.create(prefix + fingerprint_key(name), msgspec.json.encode(name))
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def _get(self, key: str) -> bytes | None:
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value or None


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()
