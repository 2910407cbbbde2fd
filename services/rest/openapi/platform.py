"""OpenAPI fragment: probes, metrics, and the failure rules (services/rest/rules.py)."""

from __future__ import annotations

from typing import Any

from services.rest import nodes
from services.rest.openapi.common import json_content, operation, path_param, query_param, ref, schemas_of

_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_RULES = ["rules"]
_OPS = ["operations"]
_RULE = {"type": "object", "description": "one exit-spec rule: code, phrase, reaction, pattern, ...",
         "properties": {"code": {"type": "integer"}, "phrase": {"type": "string"}}}
_RULE_SET = {"type": "object", "properties": {"revision": {"type": "integer"}}}
_CODE = path_param("code", "the rule's exit-spec code", {"type": "integer"})
_IF_MATCH = {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "the ETag of a read: refuse the change if the rules changed since"}
_PLACE = [query_param("position", "0-based place in the rule list", {"type": "integer", "minimum": 0}),
          query_param("before", "the code of the rule to go before", {"type": "integer"})]
_RULE_BODY = {"required": True, "content": {"text/yaml": {"schema": {"type": "string"}},
                                              "application/json": {"schema": _RULE}}}


def _probe(summary: str) -> dict[str, Any]:
    return {"get": operation(summary, tags=_OPS, public=True,
                             ok={"200": {"description": "ok", "content": {**json_content({"type": "object"}), **_TEXT}}})}


SCHEMAS: dict[str, Any] = dict(schemas_of(nodes.NodeView)[1])  # generated from the Structs

PATHS: dict[str, Any] = {
    "/healthz": _probe("Alive (503 once the NATS connection is closed for good)"),
    "/readyz": _probe("Ready to serve"),
    "/metrics": _probe("Prometheus metrics"),
    "/api/v2/rules": {
        "get": operation("The failure rules, in matching order", tags=_RULES,
                         ok={"200": {"description": "rules", "content": json_content(_RULE_SET)}}),
        "post": operation("Add a rule (admins)", tags=_RULES, fails=(400, 403, 409, 412, 413), params=[_IF_MATCH, *_PLACE],
                          body=_RULE_BODY, ok={"201": {"description": "added", "content": json_content(_RULE_SET)}}),
    },
    "/api/v2/rules/reset": {
        "post": operation("Back to the shipped rules (admins)", tags=_RULES, fails=(403, 412), params=[_IF_MATCH],
                          ok={"200": {"description": "reset", "content": json_content(_RULE_SET)}}),
    },
    "/api/v2/rules/{code}": {
        "get": operation("One rule", tags=_RULES, fails=(400, 404), params=[_CODE],
                         ok={"200": {"description": "the rule", "content": json_content(_RULE_SET)}}),
        "put": operation("Change a rule (admins)", tags=_RULES, fails=(400, 403, 404, 412, 413),
                         params=[_CODE, _IF_MATCH, *_PLACE], body=_RULE_BODY,
                         ok={"200": {"description": "changed", "content": json_content(_RULE_SET)}}),
        "delete": operation("Delete a rule (admins)", tags=_RULES, fails=(400, 403, 404, 412), params=[_CODE, _IF_MATCH],
                            ok={"200": {"description": "deleted", "content": json_content(_RULE_SET)}}),
    },
}

# Nodes (services/rest/nodes.py), alerts and reports (services/rest/alerts.py),
# job state changes as Server-Sent Events (services/rest/events.py).
_NODE = path_param("node", "node name", {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"})
_REASON_BODY = {"required": False, "content": json_content(
    {"type": "object", "properties": {"reason": {"type": "string"}}})}
_OBJECT = json_content({"type": "object"})

PATHS.update({
    "/api/v2/cluster/nodes": {
        "get": operation("Every node, shaped like a Kubernetes Node: health (a Ready condition and PAI's "
                         "conditions), cordon (unschedulable, taints), capacity and its cells", tags=["cluster"],
                         ok={"200": {"description": "nodes, by name", "content": json_content(
                             {"type": "array", "items": ref("NodeView")})}}),
    },
    "/api/v2/cluster/nodes/{node}/cordon": {
        "put": operation("Cordon a node (admins): no new work goes there", tags=["cluster"], fails=(400, 403, 404),
                         params=[_NODE], body=_REASON_BODY, ok={"202": {"description": "accepted", "content": _OBJECT}}),
        "delete": operation("Uncordon a node (admins)", tags=["cluster"], fails=(400, 403, 404), params=[_NODE],
                            body=_REASON_BODY, ok={"202": {"description": "accepted", "content": _OBJECT}}),
    },
    "/api/v2/alerts": {
        "get": operation("Alerts, firing and resolved", tags=["alerts"], fails=(400,),
                         params=[query_param("state", "firing or resolved"), query_param("job", "a job id")],
                         ok={"200": {"description": "alerts", "content": _OBJECT}}),
    },
    "/api/v2/alerts/rules": {
        "get": operation("The alert rules", tags=["alerts"], ok={"200": {"description": "rules", "content": _OBJECT}}),
        "put": operation("Replace the alert rules (admins)", tags=["alerts"], fails=(400, 403, 412, 413), params=[_IF_MATCH],
                         body={"required": True, "content": {"text/yaml": {"schema": {"type": "string"}},
                                                              "application/json": {"schema": {"type": "object"}}}},
                         ok={"200": {"description": "replaced", "content": _OBJECT}}),
    },
    "/api/v2/alerts/rules/reset": {
        "post": operation("Back to the shipped alert rules (admins)", tags=["alerts"], fails=(403, 412), params=[_IF_MATCH],
                          ok={"200": {"description": "reset", "content": _OBJECT}}),
    },
    "/api/v2/report": {
        "get": operation("Usage report", tags=["alerts"], fails=(400, 403),
                         params=[query_param("days", "days back (default 7)", {"type": "integer", "minimum": 1})],
                         ok={"200": {"description": "report", "content": _OBJECT}}),
        "post": operation("Mail the usage report (admins)", tags=["alerts"], fails=(400, 403),
                          params=[query_param("days", "days back (default 7)", {"type": "integer", "minimum": 1})],
                          ok={"200": {"description": "report, mailed", "content": _OBJECT}}),
    },
    "/api/v2/events": {
        "get": operation("Job state changes as Server-Sent Events (own jobs; admins all)", tags=["events"],
                         params=[query_param("job", "only this job")],
                         ok={"200": {"description": "an event stream (Last-Event-ID resumes)",
                                     "content": {"text/event-stream": {"schema": {"type": "string"}}}}}),
    },
})
