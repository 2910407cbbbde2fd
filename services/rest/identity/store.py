"""Users, groups and tokens in the pai_users bucket (rest owns it).

Every read-modify-write is an update at the revision read (optimistic concurrency),
retried on a conflict, so two rest replicas changing the same user never lose one
change; creations are `create`, so a name is taken once.

Tokens: a bearer token is `<user>.<random>`; the bucket keeps only its SHA-256
(`token.<user>.<sha256>`), so a leaked dump of the bucket holds no credential, and
a user's tokens are listed by key prefix without reading anyone else's.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import argon2
import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from libs.common.bus import Bus, all_keys, get_json
from libs.common.errors import BadInput, ConflictGroup, ConflictUser, NoGroup, NoToken, NoUser
from libs.common.ids import NAME_PATTERN
from libs.common.protocol.limits import MAX_USERNAME_LENGTH
from libs.common.subjects import Bucket
from services.rest.identity import core
from services.rest.records import Group, TokenKind, TokenRecord, User

_hasher = argon2.PasswordHasher()  # argon2id with argon2-cffi's current defaults
UPDATE_ATTEMPTS = 10
TOKEN_ID_LENGTH = 16  # hex digits of the hash shown as a token's id


async def _kv(bus: Bus) -> KeyValue:
    return await bus.kv(Bucket.USERS)


# --- passwords ---------------------------------------------------------------------------------


async def hash_password(password: str) -> str:
    # argon2 is slow on purpose; off the event loop so other requests go on.
    return await asyncio.to_thread(_hasher.hash, password)


async def password_matches(password_hash: str, password: str) -> bool:
    if not password_hash:
        return False
    try:
        return await asyncio.to_thread(_hasher.verify, password_hash, password)
    except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
        return False


# A hash to verify against when the user does not exist, so a wrong name takes as
# long as a wrong password and the answer does not tell which was wrong. Made at the
# first such check, at the configured cost (at import it cost every process a quarter
# of a second, rest's start included, to make a hash configure_hashing then replaced).
_DUMMY_HASH: str | None = None


def configure_hashing(time_cost: int, memory_kib: int) -> None:
    """New hashes at this argon2id cost (config password_hash_time_cost and
    password_hash_memory_kib), the check of an unknown name too. Hashes already
    stored keep the cost they carry."""
    global _hasher, _DUMMY_HASH
    if (time_cost, memory_kib) == (_hasher.time_cost, _hasher.memory_cost):
        return
    floor = 8 * _hasher.parallelism  # argon2's least memory for its lanes
    if time_cost < 1 or memory_kib < floor:
        raise BadInput(f"configuration: password_hash_time_cost must be at least 1 (is {time_cost}) and "
                       f"password_hash_memory_kib at least {floor} (is {memory_kib})")
    _hasher = argon2.PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=_hasher.parallelism)
    _DUMMY_HASH = None


async def spend_password_check(password: str) -> None:
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = await hash_password(secrets.token_urlsafe(16))
    await password_matches(_DUMMY_HASH, password)


# --- users -----------------------------------------------------------------------------------


def user_key(name: str) -> str:
    return f"user.{name}"


def group_key(name: str) -> str:
    return f"group.{name}"


async def get_user(bus: Bus, name: str) -> tuple[User, int] | None:
    # No such user can exist: spare NATS the key (a long one would break its control line).
    if len(name) > MAX_USERNAME_LENGTH or not NAME_PATTERN.match(name):
        return None
    return await get_json(await _kv(bus), user_key(name), User)


async def require_user(bus: Bus, name: str) -> tuple[User, int]:
    got = await get_user(bus, name)
    if got is None:
        raise NoUser(f"user {name[:64]} not found")
    return got


async def _change_record(bus: Bus, key: str, read: Callable[[], Awaitable[tuple[Any, int]]],
                         change: Callable[[Any], Any], busy: Callable[[], Exception]) -> Any:
    """Compare-and-set: apply `change` to the record `read` gives at its revision;
    read and apply again when someone else wrote in between, `busy` past UPDATE_ATTEMPTS."""
    kv = await _kv(bus)
    for _ in range(UPDATE_ATTEMPTS):
        record, revision = await read()
        changed = change(record)
        try:
            await kv.update(key, msgspec.json.encode(changed), last=revision)
            return changed
        except nats.js.errors.KeyWrongLastSequenceError:
            continue
    raise busy()


def name_key(name: str) -> str:
    """The claim of a user name whatever its case: `Alice` and `alice` are one name."""
    return f"name.{name.lower()}"


class _Claim(msgspec.Struct, frozen=True):
    username: str
    at: float


# A claim whose user does not exist is a creation in flight this young, else one
# that failed (or a user since deleted) and is free to take.
CLAIM_IN_FLIGHT_SECONDS = 30.0


def _taken(existing: str, wanted: str) -> ConflictUser:
    if existing == wanted:
        return ConflictUser(f"user {wanted} already exists")
    return ConflictUser(f"user {existing} already exists; user names are unique whatever their case, "
                        f"so {wanted} cannot be created", details={"existing": existing})


async def _claim_name(kv: KeyValue, name: str) -> None:
    """Take `name` (any case) for a user about to be created, atomically: of two
    creations of `Alice` and `alice` at once, one gets a 409."""
    key, value = name_key(name), msgspec.json.encode(_Claim(username=name, at=time.time()))
    try:
        await kv.create(key, value)
        return
    except nats.js.errors.KeyWrongLastSequenceError:
        pass
    got = await get_json(kv, key, _Claim)
    if got is None:  # released meanwhile: take it as new
        try:
            await kv.create(key, value)
            return
        except nats.js.errors.KeyWrongLastSequenceError:
            raise ConflictUser(f"the user name {name} is being taken by another request; try again") from None
    claim, revision = got
    if claim.username != name and (await get_json(kv, user_key(claim.username), User) is not None
                                   or time.time() - claim.at < CLAIM_IN_FLIGHT_SECONDS):
        raise _taken(claim.username, name)
    try:
        await kv.update(key, value, last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        raise ConflictUser(f"the user name {name} is being taken by another request; try again") from None


async def _release_name(kv: KeyValue, name: str) -> None:
    got = await get_json(kv, name_key(name), _Claim)
    if got is not None and got[0].username == name:
        await kv.delete(name_key(name), last=got[1])


async def create_user(bus: Bus, user: User) -> None:
    """Store a new user. Names are unique whatever their case (a 409 names the user
    who has it); refused for want of room, nothing of the user is left that counts
    (a claim of its name may stay, taken by the next creation of that name)."""
    kv = await _kv(bus)
    name = user.username
    # Users stored before names were claimed have no claim: found by their keys (creating a user is rare).
    for key in await all_keys(kv, "user."):
        existing = key[len("user."):]
        if existing.lower() == name.lower():
            raise _taken(existing, name)
    await _claim_name(kv, name)
    try:
        await kv.create(user_key(name), msgspec.json.encode(user))
    except nats.js.errors.KeyWrongLastSequenceError:
        raise ConflictUser(f"user {name} already exists") from None
    except BaseException:
        try:
            await _release_name(kv, name)
        except Exception:  # noqa: BLE001 - a full store refuses this too; the claim is taken over later
            pass
        raise


async def find_user(bus: Bus, name: str) -> tuple[User, int] | None:
    """The user named `name` exactly, else the one whose name differs only in case."""
    got = await get_user(bus, name)
    if got is not None or len(name) > MAX_USERNAME_LENGTH or not NAME_PATTERN.match(name):
        return got
    claim = await get_json(await _kv(bus), name_key(name), _Claim)
    if claim is None or claim[0].username == name:
        return None
    return await get_user(bus, claim[0].username)


async def change_user(bus: Bus, name: str, change: Callable[[User], User]) -> User:
    """Apply `change` to the stored user at the revision read; again if someone else changed it."""
    return await _change_record(bus, user_key(name), lambda: require_user(bus, name), change,
                                lambda: ConflictUser(f"user {name} is being changed by someone else; try again"))


async def delete_user(bus: Bus, name: str) -> None:
    _, revision = await require_user(bus, name)
    await revoke_all_tokens(bus, name)
    try:
        await (await _kv(bus)).delete(user_key(name), last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        raise ConflictUser(f"user {name} was changed while being deleted; try again") from None
    await revoke_all_tokens(bus, name)  # one issued meanwhile by a login in flight
    await _release_name(await _kv(bus), name)


async def all_users(bus: Bus) -> list[User]:
    kv = await _kv(bus)
    keys = await all_keys(kv, "user.")
    got = await asyncio.gather(*(get_json(kv, key, User) for key in keys))
    return sorted((g[0] for g in got if g is not None), key=lambda u: u.username)


# --- groups ------------------------------------------------------------------------------------


async def get_group(bus: Bus, name: str) -> tuple[Group, int] | None:
    if len(name) > core.MAX_GROUP_NAME_LENGTH or not NAME_PATTERN.match(name):
        return None
    return await get_json(await _kv(bus), group_key(name), Group)


async def require_group(bus: Bus, name: str) -> tuple[Group, int]:
    got = await get_group(bus, name)
    if got is None:
        raise NoGroup(f"group {name[:64]} not found")
    return got


async def groups_named(bus: Bus, names: list[str] | tuple[str, ...]) -> dict[str, Group]:
    got = await asyncio.gather(*(get_group(bus, name) for name in names))
    return {name: g[0] for name, g in zip(names, got, strict=True) if g is not None}


async def all_groups(bus: Bus) -> list[Group]:
    kv = await _kv(bus)
    keys = await all_keys(kv, "group.")
    got = await asyncio.gather(*(get_json(kv, key, Group) for key in keys))
    return sorted((g[0] for g in got if g is not None), key=lambda g: g.groupname)


async def create_group(bus: Bus, group: Group) -> None:
    try:
        await (await _kv(bus)).create(group_key(group.groupname), msgspec.json.encode(group))
    except nats.js.errors.KeyWrongLastSequenceError:
        raise ConflictGroup(f"group {group.groupname} already exists") from None


async def change_group(bus: Bus, name: str, change: Callable[[Group], Group]) -> Group:
    return await _change_record(bus, group_key(name), lambda: require_group(bus, name), change,
                                lambda: ConflictGroup(f"group {name} is being changed by someone else; try again"))


async def delete_group(bus: Bus, name: str) -> None:
    _, revision = await require_group(bus, name)
    members = await members_of(bus, name)
    if members:
        shown = ", ".join(members[:10]) + (f" and {len(members) - 10} more" if len(members) > 10 else "")
        raise ConflictGroup(f"group {name} still has members ({shown}); take them out of it first")
    try:
        await (await _kv(bus)).delete(group_key(name), last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        raise ConflictGroup(f"group {name} was changed while being deleted; try again") from None


async def members_of(bus: Bus, name: str) -> list[str]:
    return [u.username for u in await all_users(bus) if name in u.grouplist]


async def ensure_builtin_groups(bus: Bus) -> None:
    for group in core.BUILTIN_GROUPS.values():
        try:
            await create_group(bus, group)
        except ConflictGroup:
            pass  # made at an earlier start (or by another replica), perhaps changed by an admin since


# --- tokens ------------------------------------------------------------------------------------


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_key(token: str) -> str | None:
    """Where `token` is kept, or None when it cannot be one of ours."""
    user, dot, _ = token.partition(".")
    if not dot:
        return f"token.{_sha256(token)}" if NAME_PATTERN.match(token) else None  # made before tokens named a user
    if len(user) > MAX_USERNAME_LENGTH or not NAME_PATTERN.match(user) or len(token) > 512:
        return None
    return f"token.{user}.{_sha256(token)}"


def token_id(key: str) -> str:
    """A token's public name (a prefix of its hash): listed and revoked by it, useless as a credential."""
    return key.rsplit(".", 1)[-1][:TOKEN_ID_LENGTH]


async def issue_token(bus: Bus, user: str, kind: TokenKind, *, expires_at: float | None, description: str = "",
                      now: float | None = None, token: str | None = None) -> str:
    """A new token for `user`; `token`: this one (the admin's, from the chart's Secret)."""
    token = token or f"{user}.{secrets.token_urlsafe(32)}"
    record = TokenRecord(user=user, kind=kind, createdAt=time.time() if now is None else now,
                         expiresAt=expires_at, description=description)
    await (await _kv(bus)).create(token_key(token), msgspec.json.encode(record))
    return token


async def room_for_one_more_token(bus: Bus, user: str, limit: int, now: float, *, end_sign_ins: bool) -> int:
    """Before `user` gets a token: when they hold `limit` or more, drop their expired
    ones and, with `end_sign_ins`, end their oldest sign-ins (login tokens) to make
    room. Returns how many live tokens they hold then (the quota's `used`)."""
    if not limit:
        return 0
    kv = await _kv(bus)
    keys = await all_keys(kv, f"token.{user}.")
    if len(keys) < limit:
        return len(keys)
    got = await asyncio.gather(*(get_json(kv, key, TokenRecord) for key in keys))
    live = [(key, g[0]) for key, g in zip(keys, got, strict=True) if g is not None and core.is_live(g[0], now)]
    expired = [key for key, g in zip(keys, got, strict=True) if g is not None and not core.is_live(g[0], now)]
    await asyncio.gather(*(kv.delete(key) for key in expired))
    excess = len(live) - limit + 1
    if excess <= 0 or not end_sign_ins:
        return len(live)
    sign_ins = sorted((record.createdAt, key) for key, record in live if record.kind == TokenKind.LOGIN)
    ended = [key for _, key in sign_ins[:excess]]
    await asyncio.gather(*(kv.delete(key) for key in ended))
    return len(live) - len(ended)


async def lookup_token(bus: Bus, token: str, now: float) -> tuple[TokenRecord, str] | None:
    """The live token record and its key; None when unknown, revoked or expired."""
    key = token_key(token)
    if key is None:
        return None
    kv = await _kv(bus)
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    if not entry.value:
        return None
    if not entry.value.startswith(b"{"):  # a token made before records: the value is the user's name
        record = TokenRecord(user=entry.value.decode(), kind=TokenKind.PLATFORM, createdAt=0.0)
    else:
        record = msgspec.json.decode(entry.value, type=TokenRecord)
    if not core.is_live(record, now):
        try:
            await kv.delete(key, last=entry.revision)  # tidy: an expired token is never live again
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        return None
    return record, key


async def tokens_of(bus: Bus, user: str, now: float) -> list[tuple[str, TokenRecord]]:
    """(id, record) of each live token of `user`, newest first."""
    kv = await _kv(bus)
    keys = await all_keys(kv, f"token.{user}.")
    got = await asyncio.gather(*(get_json(kv, key, TokenRecord) for key in keys))
    live = [(token_id(key), g[0]) for key, g in zip(keys, got, strict=True) if g is not None and core.is_live(g[0], now)]
    return sorted(live, key=lambda item: item[1].createdAt, reverse=True)


async def revoke_token(bus: Bus, user: str, token_or_id: str) -> None:
    """Revoke one of `user`'s tokens, named by the token itself or by its id."""
    kv = await _kv(bus)
    key = token_key(token_or_id) if "." in token_or_id else None
    if key is None or not key.startswith(f"token.{user}."):
        matches = [k for k in await all_keys(kv, f"token.{user}.") if token_id(k) == token_or_id[:TOKEN_ID_LENGTH]
                   and len(token_or_id) >= 8]
        if len(matches) != 1:
            raise NoToken(f"{user} has no token {token_or_id[:TOKEN_ID_LENGTH]!r}")
        key = matches[0]
    if await get_json(kv, key, TokenRecord) is None:
        raise NoToken(f"{user} has no such token (revoked already?)")
    await kv.delete(key)


async def revoke_key(bus: Bus, key: str) -> None:
    await (await _kv(bus)).delete(key)


async def revoke_login_tokens(bus: Bus, user: str, *, keep: str = "") -> int:
    """End `user`'s sign-ins (after a password change), but the one with key `keep`."""
    kv = await _kv(bus)
    keys = [key for key in await all_keys(kv, f"token.{user}.") if key != keep]
    got = await asyncio.gather(*(get_json(kv, key, TokenRecord) for key in keys))
    logins = [key for key, g in zip(keys, got, strict=True) if g is not None and g[0].kind == TokenKind.LOGIN]
    await asyncio.gather(*(kv.delete(key) for key in logins))
    return len(logins)


async def revoke_all_tokens(bus: Bus, user: str) -> int:
    kv = await _kv(bus)
    keys = await all_keys(kv, f"token.{user}.")
    await asyncio.gather(*(kv.delete(key) for key in keys))
    return len(keys)
