"""The rules commands' messages and outcomes, without the transport (no nats).

What rest sends and the runtime answers over `pai.rpc.v1.rules` (see
`libs.common.rules_rpc` for the request itself). The runtime core builds replies
from these types, so they live apart from the NATS client: importing them pulls in
no asyncio, nats or aiohttp.

Rules travel as plain mappings in OpenPAI's exit-spec format (the entries of
its `spec:` list), exactly as an admin writes them in a rule file.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from libs.common.document_messages import Outcome, Problem, raise_for_outcome as _raise_for_outcome
from libs.common.errors import Conflict, NotFound, PaiError

# Outside the event stream (pai.v1.>): JetStream would store a request and
# answer it with a publish ack before the runtime could.
RULES_SUBJECT = "pai.rpc.v1.rules"
RULES_QUEUE = "runtime"
# Validating and storing a rule set takes milliseconds; retries on a busy
# bucket add a little. Past this the runtime is down or stuck.
REQUEST_TIMEOUT_SECONDS = 10.0  # libs.common.documents.REQUEST_TIMEOUT_SECONDS


class RuleAction(StrEnum):
    LIST = "list"
    GET = "get"
    ADD = "add"
    CHANGE = "change"
    DELETE = "delete"
    RESET = "reset"  # back to the rule set PAI starts with


class RulesRequest(msgspec.Struct, frozen=True, kw_only=True):
    action: RuleAction
    code: int | None = None  # get, change, delete: the rule concerned
    rule: dict[str, Any] | None = None  # add, change: the rule as the admin wrote it
    # add, change: where the rule goes (the first matching rule wins, so order
    # matters). At most one of them; neither: a new rule goes before the
    # catch-all rules, a changed rule keeps its place.
    position: int | None = None  # 0-based index in the ordered list
    before: int | None = None  # code of the rule it goes before
    # Optimistic concurrency: apply the change only if the rule set is still
    # at this revision (what the admin last saw). None: apply it to the latest.
    revision: int | None = None
    by: str = ""  # who asked; recorded with the rule set


# The rule set is an admin-editable document (libs.common.documents): its
# outcomes are the documents' own. A problem's path is a field path inside the
# submitted rule, e.g. "pattern.runtimeContainerPatterns[0].userLogRegex".
RuleProblem = Problem


class RuleSource(StrEnum):
    DEFAULTS = "defaults"  # the rules PAI ships
    FILE = "file"  # the runtime's configured rules file
    ADMIN = "admin"  # changed at run time through the API


class RulesReply(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    message: str = ""
    problems: list[RuleProblem] = []
    # list: every rule in order; get, add, change: the one rule concerned.
    rules: list[dict[str, Any]] = []
    position: int | None = None  # get, add, change: the rule's index in the ordered list
    revision: int = 0  # of the rule set in the bucket; 0: never changed at run time
    source: RuleSource = RuleSource.DEFAULTS
    changedBy: str = ""
    changedAt: float = 0.0


class NoSuchRule(NotFound):
    code = "NoRuleError"


class StaleRules(PaiError):
    """The admin's change was based on a rule set that has changed since."""

    status = 412
    code = "PreconditionFailed"


class RulesBusy(Conflict):
    code = "ConflictRuleError"


def raise_for_outcome(reply: RulesReply) -> None:
    _raise_for_outcome(reply.outcome, reply.message, reply.problems, invalid_rule="invalid_rule",
                       not_found=NoSuchRule, stale=StaleRules, busy=RulesBusy)
