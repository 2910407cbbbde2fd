"""Alerts over HTTP: the list, the rule document, the usage report.

The monitor owns alerts and their rules. rest lists alerts straight from the
`pai_alerts` bucket (so the list answers while the monitor restarts) and
forwards rule and report commands over NATS (`pai.rpc.v1.alerts`).

- `GET /api/v2/alerts[?state=firing|resolved&job=ID]`: admins see every
  alert, a user the alerts about their own jobs.
- `GET /api/v2/alerts/rules`: the rule document in effect (YAML in `rules`),
  its `revision` also as the `ETag`.
- `PUT /api/v2/alerts/rules` (admins): replace it with the YAML body; with
  `If-Match: "<revision>"` only if nobody changed it since. Invalid rules are
  a 400 naming each rule and field.
- `POST /api/v2/alerts/rules/reset` (admins): back to the shipped rules.
- `GET /api/v2/report?days=7` (admins): the usage report; `POST` mails it too.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from libs.common import documents
from libs.common.alerts_messages import (
    ALERT_KEY_PREFIX,
    ALERTS_SUBJECT,
    REQUEST_TIMEOUT_SECONDS,
    AlertAction,
    AlertRecord,
    AlertsReply,
    AlertsRequest,
    AlertState,
    raise_for_outcome,
)
from libs.common.bus import load_all
from libs.common.errors import Forbidden
from libs.common.protocol.limits import MAX_ADMIN_BODY_BYTES
from libs.common.subjects import Bucket
from services.rest.request import USER, bad_field, ctx_of, if_match_revision, read_body

MAX_REPORT_DAYS = 366
_alert_decoder = msgspec.json.Decoder(AlertRecord)


async def list_alerts(request: web.Request) -> web.Response:
    user = request[USER]
    state = request.query.get("state")
    if state is not None and state not in {s.value for s in AlertState}:
        raise bad_field("state", "enum", f"must be firing or resolved, got {state!r}")
    job = request.query.get("job")
    kv = await ctx_of(request).bus.kv(Bucket.ALERTS)
    alerts: list[AlertRecord] = []
    for key, raw in (await load_all(kv, msgspec.Raw)).items():  # one pass over the bucket
        if not key.startswith(ALERT_KEY_PREFIX):
            continue
        try:
            alert = _alert_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # the monitor's; one it wrote in a newer shape is left out, not an error
        if not user.admin and alert.user != user.username:
            continue
        if (state and alert.state.value != state) or (job and alert.job != job):
            continue
        alerts.append(alert)
    alerts.sort(key=lambda a: (a.state is not AlertState.FIRING, -a.startsAt))
    return web.json_response({"alerts": msgspec.to_builtins(alerts)})


async def get_rules(request: web.Request) -> web.Response:
    reply = await _ask(request, AlertsRequest(action=AlertAction.GET_RULES))
    return _rules_response(reply)


async def put_rules(request: web.Request) -> web.Response:
    _require_admin(request, "change the alert rules")
    body = await read_body(request, limit=MAX_ADMIN_BODY_BYTES, what="alert rules")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise bad_field("", "utf8", "the body must be the rule document as UTF-8 YAML") from None
    if not text.strip():
        raise bad_field("", "required", "the body is empty; send the whole rule document (YAML), or POST .../reset")
    reply = await _ask(request, AlertsRequest(action=AlertAction.SET_RULES, rules=text,
                                              revision=if_match_revision(request, "/api/v2/alerts/rules"),
                                              by=request[USER].username))
    return _rules_response(reply)


async def reset_rules(request: web.Request) -> web.Response:
    _require_admin(request, "reset the alert rules")
    reply = await _ask(request, AlertsRequest(action=AlertAction.RESET_RULES,
                                              revision=if_match_revision(request, "/api/v2/alerts/rules"),
                                              by=request[USER].username))
    return _rules_response(reply)


async def get_report(request: web.Request) -> web.Response:
    return await _report(request, send=False)


async def send_report(request: web.Request) -> web.Response:
    return await _report(request, send=True)


async def _report(request: web.Request, *, send: bool) -> web.Response:
    _require_admin(request, "read the usage report")
    text = request.query.get("days", "7")
    try:
        days = float(text)
    except ValueError:
        raise bad_field("days", "number", f"must be a number of days, got {text!r}") from None
    if not 0 < days <= MAX_REPORT_DAYS:
        raise bad_field("days", "range", f"must be more than 0 and at most {MAX_REPORT_DAYS}, got {days:g}")
    reply = await _ask(request, AlertsRequest(action=AlertAction.REPORT, days=days, send=send,
                                              by=request[USER].username))
    return web.json_response({**reply.report, "mailed": reply.mailed})


routes = [
    web.get("/api/v2/alerts", list_alerts),
    web.get("/api/v2/alerts/rules", get_rules),
    web.put("/api/v2/alerts/rules", put_rules),
    web.post("/api/v2/alerts/rules/reset", reset_rules),
    web.get("/api/v2/report", get_report),
    web.post("/api/v2/report", send_report),
]


async def request_alerts(bus, req: AlertsRequest, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> AlertsReply:
    """Ask the monitor; a refused request raises the matching PAI error."""
    reply = await documents.ask(bus, ALERTS_SUBJECT, req, AlertsReply, who="monitor", timeout=timeout)
    raise_for_outcome(reply)
    return reply


async def _ask(request: web.Request, req: AlertsRequest) -> AlertsReply:
    return await request_alerts(ctx_of(request).bus, req)


def _rules_response(reply: AlertsReply) -> web.Response:
    response = web.json_response({
        "rules": reply.rules,
        "revision": reply.revision,
        "source": reply.source,
        "changedBy": reply.changedBy or None,
        "changedTime": int(reply.changedAt * 1000) if reply.changedAt else None,
    })
    response.headers["ETag"] = f'"{reply.revision}"'
    return response


def _require_admin(request: web.Request, what: str) -> None:
    if not request[USER].admin:
        raise Forbidden(f"only an admin may {what}")
