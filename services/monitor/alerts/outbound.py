"""What the monitor sends besides mail, built without I/O: alerts as Alertmanager's
v2 API takes them, and a notification as the generic webhook's JSON body.

Alertmanager (`POST /api/v2/alerts`) gets the alerts' state, as Prometheus sends it:
every firing alert again each `alertmanager_resend_seconds`, with an `endsAt` a few
resends ahead (so Alertmanager resolves an alert by itself should the monitor stop
for good), and every alert resolved in the last RESOLVED_RESEND_SECONDS with its
real `endsAt`. Posting the same alert again changes nothing in Alertmanager (it
keys alerts by their labels), so a restarted monitor simply sends its stored state:
nothing lost, nothing doubled.

The webhook gets the notifications mail gets (a rule's group: firing, reminder,
resolved), once each, in Alertmanager's own webhook format (version "4"), so a
receiver written for Alertmanager takes it unchanged; `id` (also the
`Idempotency-Key` header) names the notification.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from libs.common.alerts_messages import AlertRecord, AlertState

# Prometheus resends resolved alerts for 15 minutes: a resolve the receiver missed
# (a failed POST, a monitor restart) still reaches it.
RESOLVED_RESEND_SECONDS = 15 * 60.0
# A firing alert's endsAt is this many resends ahead (Prometheus: 4 x max(resend
# delay, evaluation interval)).
VALID_FOR_RESENDS = 4
# A one-off alert (a dead-lettered event: it starts and ends at once) shows in
# Alertmanager as firing for this long, so that it reaches its receivers at all.
ONE_OFF_SHOWN_SECONDS = 3600.0
WEBHOOK_VERSION = "4"
RECEIVER = "pai"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def labels_of(alert: AlertRecord) -> dict[str, str]:
    """The alert's labels as Alertmanager keys it: empty values left out (as
    Prometheus does), only valid label names."""
    return {k: v for k, v in alert.labels.items() if v and _LABEL_NAME.match(k)}


def annotations_of(alert: AlertRecord) -> dict[str, str]:
    notes = {"summary": alert.summary, "description": alert.reason, "solution": "\n".join(alert.solution),
             "inhibited_by": alert.inhibitedBy, "pai_fingerprint": alert.fingerprint}
    return {k: v for k, v in notes.items() if v}


def link_of(alert: AlertRecord, portal_url: str) -> str:
    base = portal_url.rstrip("/")
    return f"{base}/api/v2/jobs/{alert.job}" if alert.job and base else base


def _one_off(alert: AlertRecord) -> bool:
    return alert.state is AlertState.RESOLVED and alert.endsAt is not None and alert.endsAt <= alert.startsAt


def alertmanager_alerts(alerts: Iterable[AlertRecord], *, now: float, resend_seconds: float,
                        portal_url: str = "") -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts` for the monitor's alerts now."""
    firing: list[AlertRecord] = []
    resolved: list[AlertRecord] = []
    for alert in alerts:
        if alert.state is AlertState.FIRING:
            firing.append(alert)
        elif _one_off(alert) and now - alert.startsAt < ONE_OFF_SHOWN_SECONDS + RESOLVED_RESEND_SECONDS:
            resolved.append(alert)
        elif alert.endsAt is not None and now - alert.endsAt < RESOLVED_RESEND_SECONDS:
            resolved.append(alert)
    # An alert that resolved and fires again has the same labels: Alertmanager must
    # not be told both, or the older resolve could end the new one.
    firing_keys = {tuple(sorted(labels_of(a).items())) for a in firing}
    body = []
    valid_until = now + VALID_FOR_RESENDS * resend_seconds
    for alert in firing:
        body.append(_postable(alert, ends=valid_until, portal_url=portal_url))
    for alert in resolved:
        if tuple(sorted(labels_of(alert).items())) in firing_keys:
            continue
        ends = alert.startsAt + ONE_OFF_SHOWN_SECONDS if _one_off(alert) else (alert.endsAt or now)
        body.append(_postable(alert, ends=ends, portal_url=portal_url))
    return body


def _postable(alert: AlertRecord, *, ends: float, portal_url: str) -> dict[str, Any]:
    posted = {"labels": labels_of(alert), "annotations": annotations_of(alert), "startsAt": rfc3339(alert.startsAt),
              "endsAt": rfc3339(ends)}
    link = link_of(alert, portal_url)
    if link:
        posted["generatorURL"] = link
    return posted


def webhook_body(*, notification_id: str, group_key: str, rule: str, firing: Iterable[AlertRecord],
                 resolved: Iterable[AlertRecord], reminder: bool, portal_url: str = "") -> dict[str, Any]:
    """A notification about one rule's group, in Alertmanager's webhook format."""
    alerts = [*(_webhook_alert(a, "firing", portal_url) for a in firing),
              *(_webhook_alert(a, "resolved", portal_url) for a in resolved)]
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    label_sets = [a["labels"] for a in alerts]
    common = dict(set.intersection(*(set(ls.items()) for ls in label_sets))) if label_sets else {}
    notes = [a["annotations"] for a in alerts]
    common_notes = dict(set.intersection(*(set(n.items()) for n in notes))) if notes else {}
    return {
        "version": WEBHOOK_VERSION, "id": notification_id, "groupKey": group_key, "truncatedAlerts": 0,
        "status": status, "receiver": RECEIVER, "groupLabels": {"alertname": rule}, "commonLabels": common,
        "commonAnnotations": common_notes, "externalURL": portal_url.rstrip("/"), "reminder": reminder,
        "alerts": alerts,
    }


def _webhook_alert(alert: AlertRecord, status: str, portal_url: str) -> dict[str, Any]:
    return {
        "status": status, "labels": labels_of(alert), "annotations": annotations_of(alert),
        "startsAt": rfc3339(alert.startsAt),
        "endsAt": rfc3339(alert.endsAt) if status == "resolved" and alert.endsAt else "0001-01-01T00:00:00Z",
        "generatorURL": link_of(alert, portal_url), "fingerprint": alert.fingerprint,
    }
