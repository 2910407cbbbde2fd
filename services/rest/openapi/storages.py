"""OpenAPI fragment: OpenPAI's storages and admins' declarations (services/rest/storages.py)."""

from __future__ import annotations

from typing import Any

from libs.common.storages import Storage
from services.rest.openapi.common import json_content, operation, path_param, query_param, ref, schemas_of

_TAGS = ["storages"]
_NAME = path_param("name", "the storage's name", {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"})
_SUMMARY = {"type": "object", "description": "OpenPAI's storage summary and PAI's type, mount path and read-only flag",
            "properties": {"name": {"type": "string"}, "share": {"type": "boolean"}, "volumeName": {"type": "string"},
                           "default": {"type": "boolean"}, "type": {"enum": ["hostPath", "nfs", "pvc"]},
                           "mountPath": {"type": "string"}, "readOnly": {"type": "boolean"}}}
_DETAIL = {"allOf": [_SUMMARY, {"type": "object", "properties": {
    "data": {"type": "object"}, "mountOptions": {"type": "array", "items": {"type": "string"}},
    "description": {"type": "string"}}}]}

_LEGACY_CONFIG = {"type": "object", "description": "OpenPAI's deprecated storage config: one server, named after the storage",
                  "properties": {"name": {"type": "string"}, "default": {"type": "boolean"},
                                 "servers": {"type": "array", "items": {"type": "string"}},
                                 "mountInfos": {"type": "array", "items": {"type": "object", "properties": {
                                     "mountPoint": {"type": "string"}, "path": {"type": "string"},
                                     "server": {"type": "string"}, "permission": {"enum": ["rw", "ro"]}}}}}}
_LEGACY_SERVER = {"type": "object", "description": "OpenPAI's deprecated storage server (nfs data: address, rootPath)",
                  "properties": {"spn": {"type": "string"}, "type": {"enum": ["hostpath", "nfs", "pvc"]},
                                 "data": {"type": "object"}, "extension": {"type": "object"}}}
_NAMES = query_param("names", "only these storages (repeat it)", {"type": "array", "items": {"type": "string"}})


def _legacy(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        f"/api/v2/storage/{kind}": {
            "get": operation(f"OpenPAI's deprecated storage {kind}s the caller's groups grant (admins: all); "
                             "use /api/v2/storages", tags=_TAGS, params=[_NAMES],
                             ok={"200": {"description": f"storage {kind}s", "content": json_content(
                                 {"type": "array", "items": schema})}}),
        },
        f"/api/v2/storage/{kind}/{{name}}": {
            "get": operation(f"OpenPAI's deprecated storage {kind} of one storage", tags=_TAGS, fails=(403, 404),
                             params=[_NAME], ok={"200": {"description": f"the storage {kind}",
                                                         "content": json_content(schema)}}),
        },
    }


SCHEMAS: dict[str, Any] = dict(schemas_of(Storage)[1])

PATHS: dict[str, Any] = {
    "/api/v2/storages": {
        "get": operation("The storages the caller's groups grant (admins: all)", tags=_TAGS,
                         ok={"200": {"description": "storages", "content": json_content(
                             {"type": "object", "properties": {"storages": {"type": "array", "items": _SUMMARY}}})}}),
    },
    "/api/v2/storages/{name}": {
        "get": operation("One storage, with where its data is", tags=_TAGS, fails=(403, 404), params=[_NAME],
                         ok={"200": {"description": "the storage", "content": json_content(_DETAIL)}}),
        "put": operation("Declare or change a storage (admins)", tags=_TAGS, fails=(400, 403, 409, 413), params=[_NAME],
                         body={"required": True, "content": json_content(ref("Storage"))},
                         ok={"200": {"description": "changed", "content": json_content(_DETAIL)},
                             "201": {"description": "declared", "content": json_content(_DETAIL)}}),
        "delete": operation("Take a storage away (admins); jobs accepted keep it", tags=_TAGS, fails=(403, 404, 409),
                            params=[_NAME], ok={"200": {"description": "deleted", "content": json_content(
                                {"type": "object"})}}),
    },
    **_legacy("config", _LEGACY_CONFIG),
    **_legacy("server", _LEGACY_SERVER),
}
