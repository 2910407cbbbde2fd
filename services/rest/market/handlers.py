"""The marketplace over HTTP: `/api/v2/marketplace/...` (registered in services/rest/routes/market.py,
described in services/rest/openapi/market.py and docs/api.md).

Every answer follows core.py's rules: an item the caller may not see is a 404, one they
may see but not change a 403, a review by someone not an admin a 403.
"""

from __future__ import annotations

import json
import time
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from libs.common.errors import Forbidden
from libs.common.protocol import limits as L
from libs.common.protocol.depth import NestingTooDeep, check_json_depth
from services.rest.identity.core import Principal
from services.rest.jobs_api import json_response
from services.rest.market import core, store
from services.rest.market.core import Caller, Decision, ItemFields, MarketItem, Query, Visibility
from services.rest.request import USER, ctx_of, decode_fields, if_match_revision, read_body

ITEMS = "/api/v2/marketplace/items"
T = TypeVar("T")
FIELDS_EXAMPLE = ('{"name": "My template", "kind": "template", "protocol": "protocolVersion: 2\\n...", '
                  '"tags": ["pytorch"], "visibility": "private"}')


def caller_of(request: web.Request) -> Caller:
    return caller_of_principal(request[USER])


def caller_of_principal(user: Principal) -> Caller:
    return Caller(username=user.username, admin=user.admin, grouplist=tuple(user.grouplist))


async def _json_body(request: web.Request, what: str) -> dict[str, Any]:
    body = await read_body(request, limit=L.MAX_MARKET_BODY_BYTES,
                           what=f"{what} ({L.MAX_MARKET_BODY_BYTES // 1024} KiB at most)")
    try:
        text = body.decode("utf-8")
        check_json_depth(text)
        data = json.loads(text)
    except NestingTooDeep as exc:
        raise core.bad("$", "max_depth", str(exc)) from None
    except (ValueError, RecursionError):
        raise core.bad("$", "json", f"{what} must be JSON like {FIELDS_EXAMPLE}") from None
    if not isinstance(data, dict):
        raise core.bad("$", "type", f"{what} must be a JSON object like {FIELDS_EXAMPLE}")
    return data


def _decode(raw: dict[str, Any], type_: type[T], what: str) -> T:
    """`raw` as `type_`; a key it does not have is refused by its name."""
    known = type_.__struct_fields__  # type: ignore[attr-defined]
    for key in raw:
        if key not in known:
            raise core.bad(str(key)[:64], "unknown_key", f"{what} has no field {str(key)[:64]!r}; it has: "
                           + ", ".join(known))
    return decode_fields(raw, type_, what=what)


def _item_id(request: web.Request) -> str:
    item_id = request.match_info["item"]
    core.check_item_id(item_id, "item")
    return item_id


async def _detail(request: web.Request, item: MarketItem, revision: int, status: int = 200) -> web.Response:
    caller = caller_of(request)
    starred = (await store.stars(ctx_of(request).bus)).get(item.id, set())
    body = core.detail_of(item, stars=len(starred), starred=caller.username in starred, caller=caller,
                          revision=revision)
    return json_response(body, status=status, headers={"ETag": f'"{revision}"'})


async def list_items(request: web.Request) -> web.Response:
    caller = caller_of(request)
    q = request.query
    query = Query(text=q.get("q", "")[:256], tags=tuple(t for t in q.getall("tag", []) if t)[:L.MAX_MARKET_TAGS],
                  category=q.get("category", "")[:64], kind=q.get("kind", "")[:16], owner=q.get("owner", "")[:64],
                  approval=q.get("approval", "")[:16], starred_by=caller.username if q.get("starred") == "true" else "",
                  mine=q.get("mine") == "true")
    bus = ctx_of(request).bus
    items = [i for i in (await store.all_items(bus)).values() if core.may_read(caller, i)]
    starred = await store.stars(bus)
    mine = {item_id for item_id, users in starred.items() if caller.username in users}
    shown = [i for i in items if core.matches(i, query, caller=caller, stars_of_caller=mine)]
    order = q.get("sort", "stars")
    if order == "recent":
        shown.sort(key=lambda i: -i.updatedAt)
    elif order == "name":
        shown.sort(key=lambda i: i.name.lower())
    elif order == "submits":
        shown.sort(key=lambda i: (-i.submits, i.name.lower()))
    else:
        shown.sort(key=lambda i: (-len(starred.get(i.id, ())), -i.submits, i.name.lower()))
    tags: dict[str, int] = {}
    categories: dict[str, int] = {}
    for i in items:  # the filters the caller can pick from: over everything they see
        for t in i.tags:
            tags[t] = tags.get(t, 0) + 1
        categories[i.category] = categories.get(i.category, 0) + 1
    return json_response({
        "items": [core.summary_of(i, stars=len(starred.get(i.id, ())), starred=i.id in mine) for i in shown],
        "total": len(shown), "tags": dict(sorted(tags.items())), "categories": dict(sorted(categories.items())),
    })


async def create_item(request: web.Request) -> web.Response:
    fields = _decode(await _json_body(request, "the item"), ItemFields, "the item")
    item, revision = await store.create(ctx_of(request).bus, caller_of(request), fields)
    return await _detail(request, item, revision, status=201)


async def get_item(request: web.Request) -> web.Response:
    item_id = _item_id(request)
    got = await store.get_item(ctx_of(request).bus, item_id)
    item = core.readable(caller_of(request), got[0] if got else None, item_id)
    return await _detail(request, item, got[1] if got else 0)


async def put_item(request: web.Request) -> web.Response:
    item_id = _item_id(request)
    caller = caller_of(request)
    if_match = if_match_revision(request, f"{ITEMS}/{item_id}")
    raw = await _json_body(request, "the item")

    def plan(current: MarketItem) -> MarketItem:
        core.changeable(caller, current, item_id)
        # A partial body changes the fields it names; the rest stay as they are.
        merged = {**msgspec.to_builtins(current.fields()), **raw}
        fields = _decode(merged, ItemFields, "the item")
        return core.saved(current, fields, caller, item_id=item_id, now=time.time())

    item, revision = await store.change(ctx_of(request).bus, item_id, caller, plan, if_match=if_match)
    return await _detail(request, item, revision)


async def delete_item(request: web.Request) -> web.Response:
    item_id = _item_id(request)
    await store.delete(ctx_of(request).bus, item_id, caller_of(request))
    return json_response({"message": f"marketplace item {item_id} deleted"})


async def put_star(request: web.Request) -> web.Response:
    return await _star(request, True)


async def delete_star(request: web.Request) -> web.Response:
    return await _star(request, False)


async def _star(request: web.Request, on: bool) -> web.Response:
    item_id = _item_id(request)
    caller = caller_of(request)
    bus = ctx_of(request).bus
    await store.star(bus, item_id, caller, on)
    starred = (await store.stars(bus)).get(item_id, set())
    return json_response({"id": item_id, "starred": caller.username in starred, "stars": len(starred)})


class ReviewBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    decision: Decision
    note: str = ""


async def review_item(request: web.Request) -> web.Response:
    item_id = _item_id(request)
    caller = caller_of(request)
    if not caller.admin:  # before the item is read: a pending item is hidden from others, the rule is not
        raise Forbidden(f"only admins review marketplace items; {caller.username} is not one")
    body = _decode(await _json_body(request, "the review"), ReviewBody, "the review")

    def plan(current: MarketItem) -> MarketItem:
        return core.reviewed(current, body.decision, caller, body.note, time.time())

    item, revision = await store.change(ctx_of(request).bus, item_id, caller, plan)
    return await _detail(request, item, revision)


class RenderBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    parameters: dict[str, str | int | float | bool] = {}
    sweep: dict[str, list[str | int | float]] = {}
    data: dict[str, str] = {}  # a data prerequisite's name -> the data item whose uri it takes
    name: str = ""


async def render_jobs(request: web.Request) -> web.Response:
    """The job document(s) the template makes with these parameters (nothing is submitted:
    the portal's submit page and `pai market use` send them to POST /api/v2/jobs)."""
    item_id = _item_id(request)
    body = _decode(await _json_body(request, "the parameters"), RenderBody, "the parameters")
    if len(body.parameters) + len(body.sweep) > 256:
        raise core.bad("parameters", "maxProperties", "at most 256 parameters")
    if len(body.data) > 64:
        raise core.bad("data", "maxProperties", "at most 64 data prerequisites")
    bus, caller = ctx_of(request).bus, caller_of(request)
    got = await store.get_item(bus, item_id)
    item = core.readable(caller, got[0] if got else None, item_id)
    data_items = {}
    for slot, data_id in body.data.items():  # each one the caller may see, or 404 naming it
        core.check_item_id(data_id, f"data.{slot}")
        found = await store.get_item(bus, data_id)
        data_items[slot] = core.readable(caller, found[0] if found else None, data_id)
    stamp = f"{int(time.time() * 1000) % 10**8:08d}"
    docs = core.job_documents(item, parameters={k: str(v) for k, v in body.parameters.items()},
                              sweep={k: [str(x) for x in v] for k, v in body.sweep.items()}, name=body.name,
                              stamp=stamp, data_items=data_items)
    return json_response({"item": item.id, "jobs": [{"name": d["name"], "config": core.dump_yaml(d)} for d in docs]})


async def export_item(request: web.Request) -> web.Response:
    item_id = _item_id(request)
    got = await store.get_item(ctx_of(request).bus, item_id)
    item = core.readable(caller_of(request), got[0] if got else None, item_id)
    return web.Response(text=core.to_v2(item), content_type="text/yaml",
                        headers={"Content-Disposition": f'attachment; filename="{item.id}.yaml"'})


async def import_item(request: web.Request) -> web.Response:
    """One OpenPAI marketplace v2 file (text/yaml); `?kind=`, `?category=`, `?tag=`,
    `?visibility=`, `?group=` set what the file does not say."""
    body = await read_body(request, limit=L.MAX_MARKET_BODY_BYTES,
                           what=f"the item file ({L.MAX_MARKET_BODY_BYTES // 1024} KiB at most)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise core.bad("file", "encoding", "an item file is UTF-8 text") from None
    q = request.query
    try:
        visibility = Visibility(q.get("visibility", "private"))
    except ValueError:
        raise core.bad("visibility", "enum", "visibility is private, groups or public") from None
    tags = [t for t in q.getall("tag", []) if t] or None
    fields = core.from_v2(text, kind=q.get("kind", "")[:16], category=q.get("category", "")[:64], tags=tags,
                          visibility=visibility, groups=[g for g in q.getall("group", []) if g])
    item, revision = await store.create(ctx_of(request).bus, caller_of(request), fields)
    return await _detail(request, item, revision, status=201)
