"""Mail text for people: what fired or changed, where, why, what to do, and a link.

Pure: a `Notification` (or a usage report) in, an `email.message.EmailMessage`
with a plain-text and an HTML body out. The shell chooses the recipients and
sends it.
"""

from __future__ import annotations

import html
import time
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from libs.common.alerts_messages import AlertRecord
from libs.common.ids import split_job_id
from services.monitor.alerts.core import Notification

STATE_WORDS = {
    "WAITING": "is waiting",
    "RUNNING": "is running",
    "STOPPING": "is stopping",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "was stopped",
}


def _state_words(notification: Notification) -> str:
    if notification.state == "WAITING" and notification.attempt > 1:
        return f"is retried (attempt {notification.attempt})"
    return STATE_WORDS.get(notification.state, notification.state)


def job_link(portal_url: str, job: str) -> str:
    """Where a person sees the job (its API detail: state, attempts, why it failed)."""
    return f"{portal_url.rstrip('/')}/api/v2/jobs/{job}"


def subject_of(notification: Notification) -> str:
    if notification.kind == "job_state":
        line = f"[PAI] job {notification.job} {_state_words(notification)}"
        if notification.state == "FAILED" and notification.exitSpec is not None:
            line += f": {notification.exitSpec.phrase}"
        return line
    if notification.firing:
        what = f"[FIRING:{len(notification.firing)}]"
        tail = " (reminder)" if notification.reminder else ""
    else:
        what, tail = "[RESOLVED]", ""
    about = _about(notification.firing or notification.resolved)
    return f"[PAI] {what} {notification.rule} ({notification.severity}){about}{tail}"


def _about(alerts: tuple[AlertRecord, ...]) -> str:
    subjects = sorted({a.node or a.job or a.service for a in alerts} - {""})
    if not subjects:
        return ""
    return " " + ", ".join(subjects[:3]) + (f" and {len(subjects) - 3} more" if len(subjects) > 3 else "")


def compose(notification: Notification, *, sender: str, to: list[str], portal_url: str, now: float | None = None) -> EmailMessage:
    if notification.kind == "job_state":
        text, body = _job_state(notification, portal_url)
    else:
        text, body = _alerts(notification, portal_url)
    return _message(subject_of(notification), text, body, sender=sender, to=to, now=now,
                    headers={"X-PAI-Notification": notification.id})


def _alerts(notification: Notification, portal_url: str) -> tuple[str, str]:
    lines: list[str] = []
    parts: list[str] = []
    for title, alerts in (("Firing", notification.firing), ("Resolved", notification.resolved)):
        if not alerts:
            continue
        lines.append(f"{title}:")
        parts.append(f"<h3>{title}</h3><ul>")
        for alert in alerts:
            facts = _facts(alert, portal_url)
            lines.append(f"- {alert.summary}")
            lines += [f"    {k}: {v}" for k, v in facts]
            parts.append(f"<li><b>{html.escape(alert.summary)}</b><table>"
                         + "".join(f"<tr><td>{html.escape(k)}</td><td>{_html_value(k, v)}</td></tr>" for k, v in facts)
                         + "</table></li>")
        parts.append("</ul>")
    intro = f"PAI alert {notification.rule} ({notification.severity})."
    return "\n".join([intro, "", *lines, ""]), f"<html><body><p>{html.escape(intro)}</p>{''.join(parts)}</body></html>"


def _facts(alert: AlertRecord, portal_url: str) -> list[tuple[str, str]]:
    facts: list[tuple[str, str]] = []
    if alert.job:
        facts += [("job", alert.job), ("user", alert.user), ("virtual cluster", alert.vc)]
    if alert.node or alert.nodes:
        facts.append(("node", alert.node or ", ".join(alert.nodes)))
    if alert.service:
        facts.append(("service", alert.service))
    if alert.reason:
        facts.append(("cause", alert.reason))
    if alert.solution:
        facts.append(("solution", "; ".join(alert.solution)))
    facts.append(("since", _when(alert.startsAt)))
    if alert.endsAt is not None and alert.endsAt != alert.startsAt:  # a one-off alert has no end of its own
        facts.append(("resolved", _when(alert.endsAt)))
    if alert.inhibitedBy:
        facts.append(("silenced by", alert.inhibitedBy))
    if alert.job:
        facts.append(("link", job_link(portal_url, alert.job)))
    return facts


def _job_state(notification: Notification, portal_url: str) -> tuple[str, str]:
    _, name = split_job_id(notification.job)
    facts = [("job", notification.job), ("virtual cluster", notification.vc), ("state", notification.state),
             ("attempt", str(notification.attempt))]
    spec = notification.exitSpec
    if notification.exitCode is not None:
        facts.append(("exit code", str(notification.exitCode)))
    if spec is not None:
        facts.append(("cause", f"{spec.phrase}: {spec.reason}" if spec.reason else spec.phrase))
        if spec.solution:
            facts.append(("solution", "; ".join(spec.solution)))
    link = job_link(portal_url, notification.job)
    facts.append(("link", link))
    intro = f"Your job {name} {_state_words(notification)}."
    text = "\n".join([intro, "", *(f"{k}: {v}" for k, v in facts), "",
                      "You get this mail because the job sets extras.jobStatusChangeNotification."])
    body = (f"<html><body><p>{html.escape(intro)}</p><table>"
            + "".join(f"<tr><td>{html.escape(k)}</td><td>{_html_value(k, v)}</td></tr>" for k, v in facts)
            + "</table><p><small>You get this mail because the job sets extras.jobStatusChangeNotification."
              "</small></p></body></html>")
    return text, body


def compose_report(report: dict, *, sender: str, to: list[str], now: float | None = None) -> EmailMessage:
    from services.monitor.alerts.report import report_html, report_text

    subject = f"[PAI] usage report {report['from'][:10]} to {report['to'][:10]}"
    return _message(subject, report_text(report), report_html(report), sender=sender, to=to, now=now)


def _message(subject: str, text: str, body: str, *, sender: str, to: list[str], now: float | None,
             headers: dict[str, str] | None = None) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = sender
    message["To"] = ", ".join(to)
    message["Date"] = format_datetime(datetime.fromtimestamp(now or time.time(), tz=UTC))
    message["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or "pai")
    for key, value in (headers or {}).items():
        message[key] = value
    message.set_content(text)
    message.add_alternative(body, subtype="html")
    return message


def _html_value(key: str, value: str) -> str:
    if key == "link":
        return f'<a href="{html.escape(value, quote=True)}">{html.escape(value)}</a>'
    return html.escape(value)


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
