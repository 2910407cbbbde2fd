"""Failure rules over HTTP: any user may read them, only admins change them.

The runtime owns the rules; these routes only check who asks and what was
sent, then forward the command over NATS (`libs.common.rules_rpc`). A rule is
sent as YAML or JSON in OpenPAI's exit-spec format: one entry of a rule file's
`spec:` list (a file holding a `spec:` list of exactly one rule works too).

Order matters, as the first matching rule wins: a new rule goes before the
catch-all rules unless `position` (0-based index) or `before` (a rule's code)
says otherwise, as query parameters or top-level keys of the body. Changes
take `If-Match: "<revision>"` (the `ETag` of a read) to refuse a change based
on rules someone else changed since.
"""

from __future__ import annotations

from typing import Any

import yaml
from aiohttp import web

from libs.common.errors import Forbidden
from libs.common.protocol.depth import NestingTooDeep, check_yaml_depth
from libs.common.protocol.encodable import MESSAGE as UNENCODABLE_MESSAGE, RULE as UNENCODABLE_RULE, unencodable_paths
from libs.common.protocol.limits import MAX_ADMIN_BODY_BYTES
from libs.common.protocol.paths import format_path
from libs.common.rules_rpc import (
    NoSuchRule,
    RuleAction,
    RulesReply,
    RulesRequest,
    request_rules,
)
from services.rest.request import USER, bad_field, ctx_of, if_match_revision, read_body

MAX_RULE_BODY_BYTES = MAX_ADMIN_BODY_BYTES
_PLACEMENT_KEYS = ("position", "before")


async def list_rules(request: web.Request) -> web.Response:
    reply = await _ask(request, RuleAction.LIST)
    return _json({**_rule_set(reply), "rules": reply.rules}, reply)


async def get_rule(request: web.Request) -> web.Response:
    reply = await _ask(request, RuleAction.GET, code=_code(request))
    return _json(_one_rule(reply), reply)


async def add_rule(request: web.Request) -> web.Response:
    _require_admin(request, "add")
    rule, placement = await _read_rule(request)
    reply = await _ask(request, RuleAction.ADD, rule=rule, **placement, revision=if_match_revision(request, "/api/v2/rules"))
    response = _json(_one_rule(reply), reply, status=201)
    response.headers["Location"] = f"/api/v2/rules/{reply.rules[0]['code']}"
    return response


async def change_rule(request: web.Request) -> web.Response:
    _require_admin(request, "change")
    code = _code(request)
    rule, placement = await _read_rule(request)
    reply = await _ask(request, RuleAction.CHANGE, code=code, rule=rule, **placement,
                       revision=if_match_revision(request, "/api/v2/rules"))
    return _json(_one_rule(reply), reply)


async def delete_rule(request: web.Request) -> web.Response:
    _require_admin(request, "delete")
    reply = await _ask(request, RuleAction.DELETE, code=_code(request), revision=if_match_revision(request, "/api/v2/rules"))
    return _json({"deleted": reply.rules[0], "position": reply.position, **_rule_set(reply)}, reply)


async def reset_rules(request: web.Request) -> web.Response:
    _require_admin(request, "reset")
    reply = await _ask(request, RuleAction.RESET, revision=if_match_revision(request, "/api/v2/rules"))
    return _json(_rule_set(reply), reply)


routes = [
    web.get("/api/v2/rules", list_rules),
    web.post("/api/v2/rules", add_rule),
    web.post("/api/v2/rules/reset", reset_rules),
    web.get("/api/v2/rules/{code}", get_rule),
    web.put("/api/v2/rules/{code}", change_rule),
    web.delete("/api/v2/rules/{code}", delete_rule),
]


# --- helpers ---------------------------------------------------------------------


async def _ask(request: web.Request, action: RuleAction, **fields: Any) -> RulesReply:
    rules_request = RulesRequest(action=action, by=request[USER].username, **fields)
    try:
        return await request_rules(ctx_of(request).bus, rules_request)
    except TypeError as error:  # YAML can hold values JSON cannot carry
        raise bad_field("", "json", f"the rule holds a value that is not plain data: {error}") from None


def _require_admin(request: web.Request, what: str) -> None:
    if not request[USER].admin:
        raise Forbidden(f"only an admin may {what} failure rules")


def _code(request: web.Request) -> int:
    text = request.match_info["code"]
    try:
        return int(text)
    except ValueError:
        raise NoSuchRule(f"no rule {text!r}: rules are named by their integer code, e.g. 137") from None


async def _read_rule(request: web.Request) -> tuple[dict, dict[str, int]]:
    """The rule in the body, and where it should go."""
    body = await read_body(request, limit=MAX_RULE_BODY_BYTES, what="a rule")
    try:
        text = body.decode("utf-8-sig")
        check_yaml_depth(text)  # before the loader recurses into it
        data = yaml.safe_load(text)  # JSON is YAML too
    except NestingTooDeep as error:
        raise bad_field("", "max_depth", str(error)) from None
    except yaml.YAMLError as error:
        raise bad_field("", "yaml", f"the body is not valid YAML or JSON: {error}") from None
    except (ValueError, RecursionError) as error:  # not UTF-8; an integer of thousands of digits
        raise bad_field("", "yaml", f"the body is not a rule PAI can read: {str(error).split(';')[0][:120]}") from None
    unencodable = unencodable_paths(data, most=1)
    if unencodable:  # "\ud800" in JSON or in YAML's double quotes: no text that can travel to the runtime
        raise bad_field(format_path(unencodable[0]), UNENCODABLE_RULE, UNENCODABLE_MESSAGE)
    if _is_rule_file(data):
        entries = data["spec"]
        if len(entries) != 1:
            raise bad_field("spec", "one_rule", f"send one rule at a time; this list has {len(entries)}")
        placement_keys = {key: data[key] for key in _PLACEMENT_KEYS if key in data}
        data = {**entries[0], **placement_keys} if isinstance(entries[0], dict) else entries[0]
    if not isinstance(data, dict):
        raise bad_field("", "mapping", f"the body must be one rule (a mapping), got {type(data).__name__}")
    rule = {str(key): value for key, value in data.items() if key not in _PLACEMENT_KEYS}
    placement: dict[str, int] = {}
    for key in _PLACEMENT_KEYS:
        value = request.query.get(key, data.get(key))
        if value is None:
            continue
        try:
            placement[key] = _as_int(value)
        except ValueError:
            raise bad_field(key, "integer", f"must be an integer, got {value!r}") from None
    return rule, placement


def _as_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):  # int(True) would be 1
        return value
    if isinstance(value, str):
        return int(value.strip())
    raise ValueError(value)


def _is_rule_file(data: object) -> bool:
    """A rule file's layout (`spec:` list) rather than a bare rule."""
    return isinstance(data, dict) and isinstance(data.get("spec"), list) and set(data) <= {"spec", *_PLACEMENT_KEYS}


def _rule_set(reply: RulesReply) -> dict[str, Any]:
    return {
        "revision": reply.revision,
        "source": reply.source.value,
        "changedBy": reply.changedBy or None,
        "changedTime": int(reply.changedAt * 1000) if reply.changedAt else None,  # ms, like OpenPAI's times
    }


def _one_rule(reply: RulesReply) -> dict[str, Any]:
    return {"rule": reply.rules[0], "position": reply.position, **_rule_set(reply)}


def _json(body: dict[str, Any], reply: RulesReply, *, status: int = 200) -> web.Response:
    response = web.json_response(body, status=status)
    response.headers["ETag"] = f'"{reply.revision}"'
    return response
