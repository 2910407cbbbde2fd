"""Pieces every fragment of the OpenAPI document uses: the error body and helpers."""

from __future__ import annotations

from typing import Any

import msgspec

REF = "#/components/schemas/{name}"

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error: OpenPAI's code, a message saying what was wrong and where; "
                   "`details.errors[]` names each rejected field (path, rule, message, line).",
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "details": {},
        "errors": {"type": "array"},
    },
    "required": ["code", "message"],
}

ERROR_TEXT = {
    400: "bad input: the body names the field, the rule and the limit",
    401: "no valid bearer token",
    403: "signed in, but not allowed this",
    404: "no such job, attempt, task, VC or route",
    405: "method not allowed",
    409: "already exists, or not in a state that allows it (the message says which)",
    412: "changed since the revision given in If-Match",
    413: "body over its limit",
    415: "unsupported media type",
    429: "over the per-token rate limit (see Retry-After), or the user's submissions in flight (details.limit)",
    507: "the store is full, or a per-user quota is reached: details name the limit, its value and what to do",
    503: "the message bus (NATS) is away; retry after Retry-After seconds",
}


def schemas_of(*types: type) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """msgspec's JSON Schema of `types` (refs into components) and the components they use."""
    return msgspec.json.schema_components(types, ref_template=REF)


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def errors(*statuses: int) -> dict[str, Any]:
    """Response objects for these error statuses (and 401, 429, 503, which any call may get)."""
    wanted = sorted({*statuses, 401, 429, 503})
    return {str(s): {"description": ERROR_TEXT[s], "content": json_content(ref("Error"))} for s in wanted}


def operation(summary: str, *, tags: list[str], ok: dict[str, Any], fails: tuple[int, ...] = (),
              params: list[dict[str, Any]] | None = None, body: dict[str, Any] | None = None,
              public: bool = False, description: str = "") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": tags, "responses": {**ok, **errors(*fails)}}
    if description:
        op["description"] = description
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = body
    if public:
        op["security"] = []
        op["responses"].pop("401", None)
    return op


def path_param(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": schema or {"type": "string"}}


def query_param(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or {"type": "string"}}
