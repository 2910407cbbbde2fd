"""The outermost middleware: whatever goes wrong, a client gets a JSON body.

Domain errors are turned into OpenPAI-shaped bodies by app.request_middleware;
this catches what is left: aiohttp's own answers (no such route, method not
allowed, a body over aiohttp's size cap) and bugs. A bug is logged with its
traceback and answered with a JSON 500 that says nothing about the inside.
"""

from __future__ import annotations

import logging

from aiohttp import web

from libs.common.errors import HTTP_STATUS_CODES

log = logging.getLogger("pai.rest")

# aiohttp's statuses -> OpenPAI-style codes (one table, libs/common/errors.py); others get a generic one.
HTTP_CODES = HTTP_STATUS_CODES


@web.middleware
async def middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return web.json_response(
            {"code": HTTP_CODES.get(exc.status, "HttpError"), "message": exc.reason}, status=exc.status, headers=headers
        )
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(
            {"code": "InternalError", "message": "PAI failed to answer this request; the error is in rest's log"},
            status=500,
        )
