"""Bearer-token authentication: who is calling, as a `Principal` on the request.

A token names its user and is kept only as a SHA-256 hash (services/rest/identity/
store.py); it works until it expires or is revoked. The caller's admin rights and
virtual clusters come from their groups, read at each request, so a change by an
admin applies at once.
"""

from __future__ import annotations

import functools
import time

import msgspec
from aiohttp import web

from libs.common.bus import Bus
from libs.common.errors import ConflictUser, Unauthorized
from services.rest.identity import core, store
from services.rest.records import TokenKind, User
from services.rest.request import USER, ctx_of

# Paths anyone may read: probes, metrics and the portal's static files.
PUBLIC_PREFIXES = ("/healthz", "/readyz", "/metrics", "/portal")
# Paths anyone may call: signing in (rate-limited per peer like any anonymous call).
PUBLIC_PATHS = frozenset({"/", "/api/v2/authn/basic/login"})


@functools.cache
def _other_public_paths() -> frozenset[str]:
    """The job API's public paths (info, the OpenAPI document), declared in its module."""
    try:
        from services.rest.jobs_api import PUBLIC_PATHS as job_api_public
    except ImportError:
        return frozenset()
    return frozenset(job_api_public)


def is_public(path: str) -> bool:
    return path.startswith(PUBLIC_PREFIXES) or path in PUBLIC_PATHS or path in _other_public_paths()


async def create_user(bus: Bus, username: str, *, admin: bool = False, email: str = "",
                      grouplist: list[str] | None = None) -> str:
    """Create a user with one application token that does not expire; returns the token (shown once)."""
    groups = grouplist if grouplist is not None else [core.DEFAULT_GROUP]
    user = User(username=username, email=email, grouplist=core.grouplist_with_admin(groups, admin),
                createdAt=time.time())
    await store.create_user(bus, user)
    return await store.issue_token(bus, username, TokenKind.APPLICATION, expires_at=None,
                                   description="made with the user")


async def ensure_admin(bus: Bus, username: str) -> str | None:
    """At start: the built-in groups, and the admin user with a platform token the first
    time (returned then, None afterwards). An admin kept from before groups joins the admin group."""
    await store.ensure_builtin_groups(bus)
    user = User(username=username, grouplist=[core.DEFAULT_GROUP, core.ADMIN_GROUP], createdAt=time.time())
    try:
        await store.create_user(bus, user)
    except ConflictUser:
        await store.change_user(bus, username, lambda u: msgspec.structs.replace(
            u, grouplist=core.grouplist_with_admin(u.grouplist, True)))
        return None
    return await store.issue_token(bus, username, TokenKind.PLATFORM, expires_at=None, description="pai up")


async def principal_for_token(bus: Bus, token: str, *, now: float | None = None) -> core.Principal | None:
    found = await store.lookup_token(bus, token, time.time() if now is None else now)
    if found is None:
        return None
    record, key = found
    got = await store.get_user(bus, record.user)
    if got is None:
        return None  # the user was deleted; their tokens go with them
    user = got[0]
    groups = await store.groups_named(bus, user.grouplist)
    return core.resolve(user, groups, token_key=key)


@web.middleware
async def middleware(request: web.Request, handler):
    if is_public(request.path):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>' "
                           "(get one with POST /api/v2/authn/basic/login or `pai login`)")
    principal = await principal_for_token(ctx_of(request).bus, token.strip())
    if principal is None:
        raise Unauthorized("the bearer token is not valid: unknown, expired or revoked; sign in again")
    request[USER] = principal
    return await handler(request)
