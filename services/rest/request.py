"""What every rest handler reads off a request: the service context, the
authenticated user, and a body no bigger than the route allows."""

from __future__ import annotations

from aiohttp import web

from libs.common.errors import TooLarge
from libs.common.service import ServiceContext

CTX = web.AppKey("ctx", ServiceContext)
USER = "pai_user"  # request key holding the authenticated `records.User`


def ctx_of(request: web.Request) -> ServiceContext:
    return request.app[CTX]


async def read_body(request: web.Request, *, limit: int, what: str) -> bytes:
    """The body, refused with 413 naming the limit when it is larger than `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(f"{what} is {request.content_length} bytes; the limit is {limit} bytes")
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        raise TooLarge(f"{what} exceeds the limit of {limit} bytes")
    return body
