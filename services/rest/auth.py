"""Bearer-token authentication: who is calling, as a `Principal` on the request.

A token names its user and is kept only as a SHA-256 hash (services/rest/identity/
store.py); it works until it expires or is revoked. The caller's admin rights and
virtual clusters come from their groups. What a token resolves to is remembered
(services/rest/identity/cache.py) and forgotten at every change of tokens, users or
groups: at once on the replica that made it, within milliseconds on the others (a
KV watch), after `cache.MAX_AGE_SECONDS` at the latest.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import time

import msgspec
import nats.js.errors
from aiohttp import web

from libs.common.bus import Bus
from libs.common.errors import ConflictUser, Unauthorized
from libs.common.protocol.encodable import encodable
from services.rest.identity import cache, core, store
from services.rest.records import TokenKind, User
from services.rest.request import USER, ctx_of

# Every path anyone may call without a token, in one place.
# Read by anyone: probes, metrics and the portal's static files.
PUBLIC_PREFIXES = ("/healthz", "/readyz", "/metrics", "/portal")
PUBLIC_PATHS = frozenset({
    "/",
    "/api/v2/authn/basic/login",  # signing in (rate-limited per peer like any anonymous call)
    "/api/v2/authn/info",  # which sign-ins there are, asked before signing in
    "/api/v2/authn/oidc/login",  # the browser's way to the identity provider and back
    "/api/v2/authn/oidc/return",
    "/api/v2/authn/oidc/logout",
    "/api/v2/info",  # public in OpenPAI too
    "/api/v1", "/api/v1/", "/api/v2", "/api/v2/",  # OpenPAI's banners (services/rest/routes/cluster.py)
    "/api/v2/openapi.json",  # the API's own document and its reference page
    "/api/v2/docs",
})
# Requests under these that are not reads may change who a token is: the cache forgets.
IDENTITY_PREFIXES = ("/api/v2/users", "/api/v2/groups", "/api/v2/tokens", "/api/v2/authn")
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

PRINCIPALS = web.AppKey("principal_cache", cache.PrincipalCache)


def is_public(path: str) -> bool:
    return path.startswith(PUBLIC_PREFIXES) or path in PUBLIC_PATHS


async def create_user(bus: Bus, username: str, *, admin: bool = False, email: str = "",
                      grouplist: list[str] | None = None) -> str:
    """Create a user with one application token that does not expire; returns the token (shown once)."""
    groups = grouplist if grouplist is not None else [core.DEFAULT_GROUP]
    user = User(username=username, email=email, grouplist=core.grouplist_with_admin(groups, admin),
                createdAt=time.time())
    await store.create_user(bus, user)
    return await store.issue_token(bus, username, TokenKind.APPLICATION, expires_at=None,
                                   description="made with the user")


async def ensure_admin(bus: Bus, username: str, *, given_token: str | None = None) -> str | None:
    """At start: the built-in groups, and the admin user with a platform token the first
    time (returned then, None afterwards). An admin kept from before groups joins the admin group.

    `given_token`: the admin's token as the operator keeps it (the Helm chart's Secret,
    made by its pre-install hook): registered whenever it is not yet, by whichever
    replica starts first, and never returned (it is already where it belongs)."""
    await store.ensure_builtin_groups(bus)
    user = User(username=username, grouplist=[core.DEFAULT_GROUP, core.ADMIN_GROUP], createdAt=time.time())
    created = True
    try:
        await store.create_user(bus, user)
    except ConflictUser:
        created = False
        await store.change_user(bus, username, lambda u: msgspec.structs.replace(
            u, grouplist=core.grouplist_with_admin(u.grouplist, True)))
    if given_token is not None:
        key = store.token_key(given_token)
        if key is None or not given_token.startswith(f"{username}."):
            raise ValueError(f"the admin token given (admin_token_file) is not a token of user {username!r}")
        if await store.lookup_token(bus, given_token, time.time()) is None:
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):  # another replica registered it
                await store.issue_token(bus, username, TokenKind.PLATFORM, expires_at=None,
                                        description="the chart's admin token", token=given_token)
        return None
    if not created:
        return None
    return await store.issue_token(bus, username, TokenKind.PLATFORM, expires_at=None, description="pai up")


async def principal_for_token(bus: Bus, token: str, *, now: float | None = None,
                              remembered: cache.PrincipalCache | None = None) -> core.Principal | None:
    now = time.time() if now is None else now
    connection = bus.nc.stats.get("reconnects", 0)
    epoch = remembered.epoch if remembered is not None else 0
    key = store.token_key(token) if remembered is not None else None
    if key is not None:
        known = remembered.get(key, now, connection=connection)
        if known is not None:
            return known
    found = await store.lookup_token(bus, token, now)
    if found is None:
        return None
    record, key = found
    got = await store.get_user(bus, record.user)
    if got is None:
        return None  # the user was deleted; their tokens go with them
    user = got[0]
    groups = await store.groups_named(bus, user.grouplist)
    principal = core.resolve(user, groups, token_key=key)
    if remembered is not None and remembered.connection == connection:
        remembered.put(key, principal, record.expiresAt, epoch=epoch, read_at=now)
    return principal


async def call_as_caller(request: web.Request, handler):
    """`handler(request)` with the caller's `Principal` on the request (a public path:
    without one); Unauthorized without a valid bearer token. Called by rest's request
    middleware (services/rest/app.py) after the rate limit."""
    if is_public(request.path):
        return await handler(request)
    header = request.headers.get("Authorization", "") or _websocket_bearer(request) or _tensorboard_cookie(request)
    if not encodable(header):  # aiohttp keeps bytes that are not UTF-8 as surrogates
        raise Unauthorized("the Authorization header is not valid UTF-8: send 'Authorization: Bearer <token>' "
                           "with the token as PAI gave it")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if not token or scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>' "
                           "(get one with POST /api/v2/authn/basic/login or `pai login`)")
    remembered = request.app.get(PRINCIPALS)
    principal = await principal_for_token(ctx_of(request).bus, token, remembered=remembered)
    if principal is None:
        raise Unauthorized("the bearer token is not valid: unknown, expired or revoked; sign in again")
    request[USER] = principal
    if remembered is None or request.method in READ_METHODS or not request.path.startswith(IDENTITY_PREFIXES):
        return await handler(request)
    try:
        return await handler(request)
    finally:
        remembered.clear()  # a revocation or change made here holds for this replica's next request


# A browser's WebSocket carries no Authorization header: its token comes as a
# subprotocol, as Kubernetes' API server takes one (services/rest/terminal.py).
WEBSOCKET_BEARER_PREFIX = "base64url.bearer.pai."


def _websocket_bearer(request: web.Request) -> str:
    """`Bearer <token>` from a WebSocket's `base64url.bearer.pai.<token>` subprotocol, or ""."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return ""
    for offered in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(WEBSOCKET_BEARER_PREFIX):
            encoded = offered[len(WEBSOCKET_BEARER_PREFIX):]
            try:
                return "Bearer " + base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (ValueError, UnicodeDecodeError):
                return "Bearer -"  # refused below as any token that is not valid
    return ""


# A job's TensorBoard opened in a browser tab carries no Authorization header: the portal
# sets its owner's token as this cookie, scoped to that job's TensorBoard path and
# SameSite=Strict, and it counts there alone (services/rest/job_tensorboard.py).
TENSORBOARD_COOKIE = "pai_tensorboard"
_TENSORBOARD_PATH = re.compile(r"^/api/v2/jobs/[^/]+/tensorboard(/|$)")


def _tensorboard_cookie(request: web.Request) -> str:
    """`Bearer <token>` from the TensorBoard cookie on a job's TensorBoard path, or ""."""
    token = request.cookies.get(TENSORBOARD_COOKIE, "") if _TENSORBOARD_PATH.match(request.path) else ""
    return f"Bearer {token}" if token else ""


def setup(app: web.Application, bus_of) -> None:
    """The principal cache and its watch, started and stopped with the app."""
    remembered = cache.PrincipalCache()
    app[PRINCIPALS] = remembered

    async def run_watch(app: web.Application):
        stopping = asyncio.Event()
        task = asyncio.ensure_future(cache.watch(remembered, bus_of(app), stopping))
        yield
        stopping.set()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    app.cleanup_ctx.append(run_watch)
