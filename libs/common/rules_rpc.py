"""Failure rules on request: rest asks, the runtime (which owns the rules) answers.

Listing and changing rules are commands, not events, so this is NATS
request/reply on one subject served by every runtime replica as one queue
group: exactly one replica answers each request. The replica that answers
writes the rule set to the `pai_rules` bucket; every replica watches that
bucket, so the next task exit is classified with the new rules everywhere.

The rule set is an admin-editable document (`libs.common.documents`: the
store, the serving and the asking). The messages and outcomes are in
`libs.common.rules_messages` (no nats, so the
runtime core can use them); they are re-exported here for the callers of the RPC.
"""

from __future__ import annotations

from libs.common import documents
from libs.common.bus.connection import Connection
from libs.common.rules_messages import (
    REQUEST_TIMEOUT_SECONDS,
    RULES_QUEUE,
    RULES_SUBJECT,
    NoSuchRule,
    Outcome,
    RuleAction,
    RuleProblem,
    RulesBusy,
    RuleSource,
    RulesReply,
    RulesRequest,
    StaleRules,
    raise_for_outcome,
)

__all__ = [
    "REQUEST_TIMEOUT_SECONDS",
    "RULES_QUEUE",
    "RULES_SUBJECT",
    "NoSuchRule",
    "Outcome",
    "RuleAction",
    "RuleProblem",
    "RuleSource",
    "RulesBusy",
    "RulesReply",
    "RulesRequest",
    "StaleRules",
    "raise_for_outcome",
    "request_rules",
]



async def request_rules(bus: Connection, req: RulesRequest, *,
                        timeout: float = REQUEST_TIMEOUT_SECONDS) -> RulesReply:
    """Ask the runtime; a refused request raises the matching PAI error."""
    reply = await documents.ask(bus, RULES_SUBJECT, req, RulesReply, who="runtime", timeout=timeout)
    raise_for_outcome(reply)
    return reply
