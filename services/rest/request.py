"""What every rest handler reads off a request: the service context, the
authenticated user, and a body no bigger and no deeper than the route allows."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from libs.common.errors import BadInput, RequestTimeout, TooLarge
from libs.common.protocol.depth import NestingTooDeep, check_json_depth
from libs.common.protocol.encodable import MESSAGE as UNENCODABLE_MESSAGE, RULE as UNENCODABLE_RULE, unencodable_paths
from libs.common.protocol.limits import MAX_ADMIN_BODY_BYTES
from libs.common.protocol.paths import format_path
from libs.common.service import ServiceContext
from services.rest.identity.core import Principal

T = TypeVar("T")

CTX = web.AppKey("ctx", ServiceContext)
# The caller of a request, as the auth middleware resolved their token.
USER = web.RequestKey("pai_user", Principal)


def ctx_of(request: web.Request) -> ServiceContext:
    return request.app[CTX]


async def read_body(request: web.Request, *, limit: int, what: str) -> bytes:
    """The whole body, or 413 naming the limit once more than `limit` bytes arrived.

    Read until the end of the body: one `content.read(n)` returns only what has
    arrived so far, which cut short a chunked body sent in pieces.
    """
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(f"{what} is {request.content_length} bytes; the limit is {limit} bytes",
                       details={"limit": limit})
    chunks: list[bytes] = []
    size = 0
    # A body trickled in (or never sent after its header) must not hold the
    # request, its connection and its memory for ever.
    seconds = ctx_of(request).config.http_body_timeout_seconds
    try:
        async with asyncio.timeout(seconds if seconds > 0 else None):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"{what} exceeds the limit of {limit} bytes", details={"limit": limit})
                chunks.append(chunk)
    except TimeoutError:
        # The rest of the body may still come: the connection cannot carry another
        # request, and aiohttp would otherwise linger up to 10 s reading it.
        close_after_response = getattr(request.protocol, "close_after_response", None)
        if close_after_response is not None:
            close_after_response()
        raise RequestTimeout(f"{what} did not arrive within {seconds:g} seconds ({size} bytes came); "
                             "send it whole (http_body_timeout_seconds)", details={"limit": seconds}) from None
    return b"".join(chunks)


async def read_json_object(request: web.Request, *, what: str, example: str) -> dict[str, Any]:
    """A small JSON object body (admin and control requests), or a 4xx naming what is wrong."""
    body = await read_body(request, limit=MAX_ADMIN_BODY_BYTES, what=what)
    try:
        text = body.decode("utf-8")
        check_json_depth(text)  # before json recurses into it
        data = json.loads(text)
    except NestingTooDeep as exc:
        raise bad_field("$", "max_depth", str(exc)) from None
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad_field("$", "json", f"{what} must be JSON like {example}") from None
    if not isinstance(data, dict):
        raise bad_field("$", "type", f"{what} must be a JSON object like {example}")
    unencodable = unencodable_paths(data, most=1)
    if unencodable:  # "\ud800" is valid JSON, but no text that can be stored or sent on
        raise bad_field(format_path(unencodable[0]), UNENCODABLE_RULE, UNENCODABLE_MESSAGE)
    return data


def decode_fields(data: dict[str, Any], type_: type[T], *, what: str) -> T:
    """`data` as the Struct `type_`, strictly: `"false"` is not a boolean, unknown keys are refused."""
    try:
        return msgspec.convert(data, type_, strict=True)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `")
        path = where.rstrip("`").removeprefix("$").removeprefix(".") or "$"
        raise bad_field(path, "type", f"{what}: {message}") from None


def bad_field(path: str, rule: str, message: str) -> BadInput:
    """A 400 whose body names the field path and the rule, like a rejected job's
    ("" or "$": the body as a whole)."""
    return BadInput(
        f"{path}: {message}" if path not in ("", "$") else message,
        details={"errors": [{"path": path, "rule": rule, "message": message}]},
    )


def if_match_revision(request: web.Request, etag_of: str) -> int | None:
    """The revision an `If-Match` header names (optimistic concurrency on a
    document whose ETag `GET etag_of` gives); None without the header."""
    header = request.headers.get("If-Match")
    if header is None:
        return None
    text = header.strip().removeprefix("W/").strip('"')
    try:
        return int(text)
    except ValueError:
        raise bad_field("If-Match", "header",
                        f'must be a revision like "3" (the ETag of GET {etag_of}), got {header!r}') from None
