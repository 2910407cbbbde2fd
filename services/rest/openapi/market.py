"""OpenAPI fragment: the marketplace (services/rest/market, routes in services/rest/routes/market.py)."""

from __future__ import annotations

from typing import Any

from services.rest.market.core import ItemFields
from services.rest.market.handlers import RenderBody, ReviewBody
from services.rest.openapi.common import json_content, operation, path_param, query_param, ref, schemas_of

_TAGS = ["marketplace"]
_ITEM = path_param("item", "the item's id", {"type": "string", "pattern": "^[a-zA-Z0-9_-]+$", "maxLength": 64})
_SUMMARY = {"type": "object", "description": "an item as listed (stars: how many users starred it; starred: the caller did)",
            "properties": {
                "id": {"type": "string"}, "name": {"type": "string"}, "kind": {"enum": ["template", "data"]},
                "owner": {"type": "string"}, "author": {"type": "string", "description": "the owner, as OpenPAI names it"},
                "summary": {"type": "string"}, "category": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": {"enum": ["private", "groups", "public"]},
                "groups": {"type": "array", "items": {"type": "string"}},
                "approval": {"enum": ["none", "pending", "approved", "rejected"]}, "builtin": {"type": "boolean"},
                "submits": {"type": "integer"}, "stars": {"type": "integer"}, "starred": {"type": "boolean"},
                "createdAt": {"type": "number"}, "updatedAt": {"type": "number"}}}
_DETAIL = {"allOf": [_SUMMARY, {"type": "object", "properties": {
    "description": {"type": "string", "description": "Markdown"},
    "descriptionHtml": {"type": "string", "description": "the description rendered, raw HTML left out"},
    "protocol": {"type": "string", "description": "a template's OpenPAI v2 job document"},
    "uri": {"type": "string", "description": "a data item's storage path or URI"},
    "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
    "data": {"type": "object", "description": "a template's data prerequisites (name -> uris), which "
                                              "render's `data` may point at data items",
             "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    "reviewedBy": {"type": "string"}, "reviewNote": {"type": "string"},
    "mayChange": {"type": "boolean"}, "revision": {"type": "integer"}}}]}
_ITEM_OK = {"200": {"description": "the item (ETag: its revision)", "content": json_content(_DETAIL)}}
_LIST = {"type": "object", "properties": {
    "items": {"type": "array", "items": _SUMMARY}, "total": {"type": "integer"},
    "tags": {"type": "object", "additionalProperties": {"type": "integer"}},
    "categories": {"type": "object", "additionalProperties": {"type": "integer"}}}}
_STAR = {"type": "object", "properties": {"id": {"type": "string"}, "starred": {"type": "boolean"},
                                          "stars": {"type": "integer"}}}
_RENDERED = {"type": "object", "properties": {"item": {"type": "string"}, "jobs": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "config": {"type": "string"}}}}}}
_YAML = {"text/yaml": {"schema": {"type": "string"}}}

SCHEMAS: dict[str, Any] = dict(schemas_of(ItemFields, ReviewBody, RenderBody)[1])

PATHS: dict[str, Any] = {
    "/api/v2/marketplace/items": {
        "get": operation(
            "The items the caller may see, searched and filtered", tags=_TAGS,
            params=[query_param("q", "words, all in the name, summary, description, tags or category"),
                    query_param("tag", "only items with this tag (repeat it: all of them)"),
                    query_param("category", "only this category"), query_param("kind", "template or data"),
                    query_param("owner", "only this owner's"), query_param("approval", "e.g. pending (admins' queue)"),
                    query_param("starred", "true: only those the caller starred"),
                    query_param("mine", "true: only the caller's own"),
                    query_param("sort", "stars (default), submits, recent or name")],
            ok={"200": {"description": "items, and the tags and categories to filter by", "content": json_content(_LIST)}}),
        "post": operation(
            "Publish an item (a template or a data item); public ones wait for an admin's approval", tags=_TAGS,
            fails=(400, 413, 507), body={"required": True, "content": json_content(ref("ItemFields"))},
            ok={"201": {"description": "created", "content": json_content(_DETAIL)}}),
    },
    "/api/v2/marketplace/import": {
        "post": operation(
            "Publish an item from an OpenPAI marketplace v2 file", tags=_TAGS, fails=(400, 413, 507),
            params=[query_param("kind", "template or data (else read from the file)"),
                    query_param("visibility", "private (default), groups or public"),
                    query_param("group", "a group to share with (repeat it)"), query_param("category", "its category"),
                    query_param("tag", "a tag (repeat it)")],
            body={"required": True, "content": _YAML},
            ok={"201": {"description": "created", "content": json_content(_DETAIL)}}),
    },
    "/api/v2/marketplace/items/{item}": {
        "get": operation("One item, its description rendered and its template's parameters", tags=_TAGS,
                         fails=(400, 404), params=[_ITEM], ok=_ITEM_OK),
        "put": operation("Change an item (its owner or an admin; the fields given)", tags=_TAGS,
                         fails=(400, 403, 404, 409, 412, 413), params=[_ITEM],
                         description="`If-Match: \"<revision>\"` refuses a change based on an older read (412).",
                         body={"required": True, "content": json_content({"type": "object"})}, ok=_ITEM_OK),
        "delete": operation("Delete an item (its owner or an admin)", tags=_TAGS, fails=(400, 403, 404, 409),
                            params=[_ITEM], ok={"200": {"description": "deleted", "content": json_content({"type": "object"})}}),
    },
    "/api/v2/marketplace/items/{item}/star": {
        "put": operation("Star an item", tags=_TAGS, fails=(400, 404), params=[_ITEM],
                         ok={"200": {"description": "starred", "content": json_content(_STAR)}}),
        "delete": operation("Take one's star back", tags=_TAGS, fails=(400, 404), params=[_ITEM],
                            ok={"200": {"description": "not starred", "content": json_content(_STAR)}}),
    },
    "/api/v2/marketplace/items/{item}/review": {
        "post": operation("Approve or reject a public item (admins)", tags=_TAGS, fails=(400, 403, 404, 409),
                          params=[_ITEM], body={"required": True, "content": json_content(ref("ReviewBody"))},
                          ok=_ITEM_OK),
    },
    "/api/v2/marketplace/items/{item}/render": {
        "post": operation(
            "The job document(s) a template makes with these parameters (a sweep: one per combination); "
            "nothing is submitted", tags=_TAGS, fails=(400, 404, 413), params=[_ITEM],
            body={"required": True, "content": json_content(ref("RenderBody"))},
            ok={"200": {"description": "job documents, each naming the item in extras.marketplaceItem",
                        "content": json_content(_RENDERED)}}),
    },
    "/api/v2/marketplace/items/{item}/export": {
        "get": operation("The item as an OpenPAI marketplace v2 file", tags=_TAGS, fails=(400, 404), params=[_ITEM],
                         ok={"200": {"description": "the v2 file", "content": _YAML}}),
    },
}
