"""What Alertmanager and the webhook are sent (services/monitor/alerts/outbound.py)."""

from __future__ import annotations

from libs.common.alerts_messages import AlertRecord, AlertState
from services.monitor.alerts.outbound import (
    RESOLVED_RESEND_SECONDS,
    alertmanager_alerts,
    rfc3339,
    webhook_body,
)

NOW = 1_800_000_000.0


def alert(fp: str, state: AlertState, starts: float, ends: float | None = None, **labels: str) -> AlertRecord:
    return AlertRecord(fingerprint=fp, rule="NodeDisk", severity="warning", state=state, summary=f"about {fp}",
                       labels={"alertname": "NodeDisk", "severity": "warning", **labels}, startsAt=starts, endsAt=ends,
                       job=labels.get("job", ""), reason="why", solution=["do this", "then that"])


def test_firing_alerts_are_valid_for_four_resends_and_resolved_ones_keep_their_end():
    sent = alertmanager_alerts([
        alert("a", AlertState.FIRING, NOW - 60, node="n1"),
        alert("b", AlertState.RESOLVED, NOW - 600, NOW - 30, node="n2"),
        alert("old", AlertState.RESOLVED, NOW - 9000, NOW - RESOLVED_RESEND_SECONDS - 1, node="n3"),
    ], now=NOW, resend_seconds=60, portal_url="http://pai/")
    assert [(s["labels"]["node"], s["endsAt"]) for s in sent] == [("n1", rfc3339(NOW + 240)), ("n2", rfc3339(NOW - 30))]
    assert sent[0]["annotations"] == {"summary": "about a", "description": "why", "solution": "do this\nthen that",
                                      "pai_fingerprint": "a"}
    assert sent[0]["generatorURL"] == "http://pai"


def test_a_resolve_is_not_sent_beside_the_same_alert_firing_again():
    sent = alertmanager_alerts([
        alert("n1@1", AlertState.RESOLVED, NOW - 600, NOW - 300, node="n1"),
        alert("n1@2", AlertState.FIRING, NOW - 10, node="n1"),
    ], now=NOW, resend_seconds=60)
    assert [s["startsAt"] for s in sent] == [rfc3339(NOW - 10)]


def test_a_one_off_alert_shows_as_firing_for_an_hour_and_labels_are_alertmanagers():
    [sent] = alertmanager_alerts([alert("dl", AlertState.RESOLVED, NOW - 5, NOW - 5, job="alice~j", empty="")],
                                 now=NOW, resend_seconds=60, portal_url="http://pai")
    assert sent["endsAt"] == rfc3339(NOW - 5 + 3600)
    assert "empty" not in sent["labels"], "empty labels are left out, as Prometheus does"
    assert sent["generatorURL"] == "http://pai/api/v2/jobs/alice~j"


def test_the_webhook_body_is_alertmanagers_webhook_format():
    body = webhook_body(notification_id="g@1", group_key="NodeDisk/n", rule="NodeDisk",
                        firing=[alert("a", AlertState.FIRING, NOW, node="n1")],
                        resolved=[alert("b", AlertState.RESOLVED, NOW - 60, NOW, node="n2")], reminder=False)
    assert body["version"] == "4" and body["status"] == "firing" and body["id"] == "g@1"
    assert body["commonLabels"] == {"alertname": "NodeDisk", "severity": "warning"}
    assert [(a["status"], a["labels"]["node"]) for a in body["alerts"]] == [("firing", "n1"), ("resolved", "n2")]
    assert body["alerts"][1]["endsAt"] == rfc3339(NOW)
