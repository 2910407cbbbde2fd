"""Bearer-token authentication.

Tokens are random and stored only as SHA-256 hashes (`token.<hash>` -> user name in
the pai_users bucket), so a leaked KV dump does not leak credentials.
"""

from __future__ import annotations

import hashlib
import secrets

import msgspec
import nats.js.errors
from aiohttp import web

from libs.common.bus import Bus, get_json
from libs.common.errors import Conflict, Unauthorized
from libs.common.subjects import Bucket
from services.rest.records import User
from services.rest.request import USER, ctx_of

# Paths anyone may read: probes, metrics and the portal's static files.
PUBLIC_PREFIXES = ("/healthz", "/readyz", "/metrics", "/portal")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_user(bus: Bus, username: str, *, admin: bool = False, email: str = "") -> str:
    """Create a user with one fresh token; returns the token (shown once)."""
    kv = await bus.kv(Bucket.USERS)
    token = secrets.token_urlsafe(32)
    try:
        await kv.create(f"user.{username}", msgspec.json.encode(User(username=username, admin=admin, email=email)))
    except nats.js.errors.KeyWrongLastSequenceError:
        raise Conflict(f"user {username} already exists") from None
    await kv.put(f"token.{_hash(token)}", username.encode())
    return token


async def ensure_admin(bus: Bus, username: str) -> str | None:
    """Create the admin at first start; returns its token then, None if it existed."""
    try:
        return await create_user(bus, username, admin=True)
    except Conflict:
        return None


async def user_for_token(bus: Bus, token: str) -> User | None:
    kv = await bus.kv(Bucket.USERS)
    try:
        entry = await kv.get(f"token.{_hash(token)}")
    except nats.js.errors.KeyNotFoundError:
        return None
    if not entry.value:
        return None
    got = await get_json(kv, f"user.{entry.value.decode()}", User)
    return got[0] if got else None


@web.middleware
async def middleware(request: web.Request, handler):
    if request.path.startswith(PUBLIC_PREFIXES) or request.path == "/":
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    user = await user_for_token(ctx_of(request).bus, token.strip())
    if user is None:
        raise Unauthorized("the bearer token is not valid")
    request[USER] = user
    return await handler(request)
