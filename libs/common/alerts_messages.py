"""Alerts as stored and served, and the alert commands, without the transport (no nats).

The monitor owns alerts: it evaluates the rules, writes every active and
recently resolved alert to the `pai_alerts` bucket (key `alert.<hash>`, value
an `AlertRecord`), and answers commands on `pai.rpc.v1.alerts` (read or
replace the rule document, build the usage report). rest reads the bucket to
list alerts and forwards commands; neither imports the other.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from libs.common.document_messages import Outcome, Problem, raise_for_outcome as _raise_for_outcome
from libs.common.errors import PaiError

# Outside the event stream (pai.v1.>), like the rules RPC: JetStream would
# store a request and answer it with a publish ack before the monitor could.
ALERTS_SUBJECT = "pai.rpc.v1.alerts"
ALERTS_QUEUE = "monitor"
REQUEST_TIMEOUT_SECONDS = 10.0
# Keys of the `pai_alerts` bucket.
ALERT_KEY_PREFIX = "alert."
# Resolved alerts stay listed this long.
RECENT_SECONDS = 24 * 3600.0


class AlertState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class AlertRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One alert: a rule's condition holding for one node, job or service."""

    fingerprint: str  # rule/subject, stable while the condition holds
    rule: str
    severity: str
    state: AlertState
    summary: str
    labels: dict[str, str] = {}
    startsAt: float = 0.0
    endsAt: float | None = None
    # What it is about (empty where it does not apply).
    node: str = ""
    job: str = ""
    user: str = ""
    vc: str = ""
    service: str = ""
    nodes: list[str] = []  # a job alert: the nodes the job's tasks run on
    reason: str = ""
    solution: list[str] = []
    # The firing alert that keeps this one from notifying anybody (inhibition).
    inhibitedBy: str = ""


class AlertAction(StrEnum):
    GET_RULES = "get_rules"
    SET_RULES = "set_rules"
    RESET_RULES = "reset_rules"
    REPORT = "report"


class AlertsRequest(msgspec.Struct, frozen=True, kw_only=True):
    action: AlertAction
    rules: str = ""  # set_rules: the whole rule document, YAML
    # set/reset: apply only if the rule document is still at this revision.
    revision: int | None = None
    by: str = ""
    # report: the period (days back from now) and whether to mail it to the admins.
    days: float = 7.0
    send: bool = False


# The rule document is an admin-editable document (libs.common.documents):
# `Outcome` and `Problem` are the documents' own, re-exported for the callers.


class AlertsReply(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    message: str = ""
    problems: list[Problem] = []
    rules: str = ""  # get/set: the rule document in effect, YAML
    revision: int = 0  # 0: the shipped defaults, never changed at run time
    source: str = "defaults"  # defaults, file, admin
    changedBy: str = ""
    changedAt: float = 0.0
    report: dict = {}  # report: the usage report
    mailed: bool = False  # report: handed to the mail sender (mail is configured and there are admins)


class StaleAlertRules(PaiError):
    status = 412
    code = "PreconditionFailed"


def raise_for_outcome(reply: AlertsReply) -> None:
    _raise_for_outcome(reply.outcome, reply.message, reply.problems, invalid_rule="invalid_alert_rule",
                       stale=StaleAlertRules)
