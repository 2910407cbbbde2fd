"""PAI's HTTP API as one OpenAPI 3 document, served at GET /api/v2/openapi.json
(public), with a self-contained reference page at GET /api/v2/docs.

Each area of the API keeps its own fragment module with `PATHS` (OpenAPI path
items) and `SCHEMAS` (components): `jobs` (jobs, VCs, the cluster, info),
`platform` (probes, metrics, failure rules) and `identity` (users, groups,
tokens, login). A fragment that is not there is skipped. Schemas of PAI's own
response types are generated from their msgspec Structs (msgspec.json.schema),
so a field is declared once.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from aiohttp import web

log = logging.getLogger("pai.rest.openapi")

FRAGMENTS = ("jobs", "platform", "identity", "portal", "openpai", "storages", "market")
OPENAPI_VERSION = "3.1.0"  # JSON Schema 2020-12, what msgspec generates


def fragments() -> list[Any]:
    """The fragment modules present, in order."""
    found = []
    for name in FRAGMENTS:
        try:
            found.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # a fragment that is there but broken is a bug
    return found


def document(version: str = "") -> dict[str, Any]:
    """The whole OpenAPI document."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for fragment in fragments():
        for path, item in fragment.PATHS.items():
            paths.setdefault(path, {}).update(item)
        schemas.update(getattr(fragment, "SCHEMAS", {}))
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "PAI REST API",
            "version": version or "0",
            "description": "OpenPAI's v2 paths and shapes. Every call but the public ones takes "
                           "`Authorization: Bearer <token>`. Errors are JSON `{code, message}` with "
                           "OpenPAI's codes; a rejected field is named in `details.errors[].path`.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
        "security": [{"bearerAuth": []}],
        "paths": dict(sorted(paths.items())),
    }


_cached: dict[str, Any] | None = None


async def get_openapi(request: web.Request) -> web.Response:
    global _cached
    if _cached is None:
        from services.rest.jobs_api import _version

        _cached = document(_version())
    return web.json_response(_cached)


async def get_docs(request: web.Request) -> web.Response:
    from services.rest.docs_page import PAGE

    return web.Response(text=PAGE, content_type="text/html")


routes = [
    web.get("/api/v2/openapi.json", get_openapi),
    web.get("/api/v2/docs", get_docs),
]
