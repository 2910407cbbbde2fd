"""OpenPAI v2's identity API: sign in and out, tokens, users, groups.

Each handler reads and checks its body, asks the pure core who may do it, and
changes the pai_users bucket through identity.store.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from libs.common.errors import IncorrectPassword, NoGroup, NoToken, TooManyRequests
from libs.common.service import ServiceContext
from services.rest import quotas
from services.rest.identity import core, oidc, oidc_routes, store
from services.rest.identity.core import Action, Principal
from services.rest.records import (
    Group,
    GroupChange,
    Login,
    NewGroup,
    NewToken,
    NewUser,
    SelfChange,
    TokenKind,
    TokenRecord,
    User,
    UserChange,
)
from services.rest.request import USER, ctx_of, decode_fields, read_json_object

LOGIN_FAILED = "wrong username or password"
LOGIN_THROTTLE = core.LoginThrottle()  # this process's count of failed sign-ins per name


def _caller(request: web.Request) -> Principal:
    return request[USER]


def policy(ctx: ServiceContext) -> core.TokenPolicy:
    c = ctx.config
    return core.TokenPolicy(login_seconds=c.rest_login_token_seconds,
                            application_seconds=c.rest_application_token_seconds, max_seconds=c.rest_token_max_seconds)


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def user_view(user: User, groups: dict[str, Group]) -> dict[str, Any]:
    """OpenPAI's user object; never the password hash."""
    principal = core.resolve(user, groups)
    return {
        "username": user.username,
        "email": user.email,
        "grouplist": list(user.grouplist),
        "admin": principal.admin,
        "virtualCluster": list(principal.virtualClusters),
        "priorityClasses": list(principal.priorityClasses),  # PAI's: the job priority classes they may use
        "extension": user.extension,
        "hasPassword": bool(user.passwordHash),
        "createdTime": _ms(user.createdAt) if user.createdAt else None,
    }


def group_view(group: Group) -> dict[str, Any]:
    return msgspec.to_builtins(group)


def token_view(token_id: str, record: TokenRecord) -> dict[str, Any]:
    return {"id": token_id, "kind": record.kind.value, "description": record.description,
            "createdTime": _ms(record.createdAt), "expiresTime": _ms(record.expiresAt)}


async def _body(request: web.Request, type_: type, example: str, what: str):
    return decode_fields(await read_json_object(request, what=what, example=example), type_, what=what)


async def _check_groups_exist(ctx: ServiceContext, names: list[str]) -> None:
    core.check_grouplist(names)
    found = {**core.BUILTIN_GROUPS, **await store.groups_named(ctx.bus, names)}
    for i, name in enumerate(names):
        if name not in found:
            raise NoGroup(f"grouplist[{i}]: no group {name!r}; create it first (POST /api/v2/groups)",
                          details={"errors": [{"path": f"grouplist[{i}]", "rule": "exists",
                                               "message": f"no group {name!r}"}]})


# --- sign in, sign out, tokens -----------------------------------------------------------------


async def login(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    if not ctx.config.basic_auth:  # an admin turned passwords off: sign-in through the identity provider only
        provider = request.app.get(oidc_routes.OIDC)
        raise oidc.basic_auth_off(provider.settings if provider else None)
    body: Login = await _login_body(request)
    expires = core.token_expiry(TokenKind.LOGIN, time.time(), policy(ctx), body.expiration)
    name = body.username[: core.MAX_GROUP_NAME_LENGTH]
    wait = LOGIN_THROTTLE.retry_after(name, time.monotonic())
    if wait > 0:
        raise TooManyRequests(f"too many failed sign-ins as {name}; try again in {wait:.0f} s")
    got = await store.find_user(ctx.bus, body.username)  # `Alice` signs in as alice too
    password = body.password[: core.MAX_PASSWORD_LENGTH + 1]
    if got is None:
        await store.spend_password_check(password)  # as slow as a wrong password: names are not probed
    if got is None or not await store.password_matches(got[0].passwordHash, password):
        LOGIN_THROTTLE.failed(name, time.monotonic())
        raise IncorrectPassword(LOGIN_FAILED)
    user = got[0]
    LOGIN_THROTTLE.succeeded(name)
    # Past the token quota a sign-in ends the user's oldest one (it is never locked out by its own sign-ins).
    held = await store.room_for_one_more_token(ctx.bus, user.username, ctx.config.rest_user_max_tokens, time.time(),
                                               end_sign_ins=True)
    quotas.check_tokens(ctx.config, user.username, held)
    token = await store.issue_token(ctx.bus, user.username, TokenKind.LOGIN, expires_at=expires, description="login")
    groups = await store.groups_named(ctx.bus, user.grouplist)
    return web.json_response({"token": token, "user": user.username, "admin": core.resolve(user, groups).admin,
                              "expiresTime": _ms(expires)})


async def _login_body(request: web.Request) -> Login:
    """The sign-in as JSON (PAI's) or as a form (OpenPAI's SDK posts one)."""
    if request.content_type != "application/x-www-form-urlencoded":
        return await _body(request, Login, '{"username": "alice", "password": "..."}', "the login")
    form = await request.post()
    fields: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
    if "expiration" in fields:
        try:
            fields["expiration"] = int(fields["expiration"])
        except ValueError:
            raise core.bad_field("expiration", "type", "expiration is a number of seconds") from None
    return decode_fields(fields, Login, what="the login")


async def logout(request: web.Request) -> web.Response:
    caller = _caller(request)
    await store.revoke_key(ctx_of(request).bus, caller.tokenKey)
    return web.json_response({"message": f"{caller.username} signed out; this token no longer works"})


async def list_tokens(request: web.Request) -> web.Response:
    caller = _caller(request)
    tokens = await store.tokens_of(ctx_of(request).bus, caller.username, time.time())
    return web.json_response({"tokens": [token_view(tid, record) for tid, record in tokens]})


async def create_token(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    caller = _caller(request)
    body: NewToken = await _body(request, NewToken, '{"expiration": 86400, "description": "ci"}', "the new token")
    if len(body.description) > 256:
        raise core.bad_field("description", "maxLength", "a token's description is at most 256 characters")
    now = time.time()
    expires = core.token_expiry(TokenKind.APPLICATION, now, policy(ctx), body.expiration)
    held = await store.room_for_one_more_token(ctx.bus, caller.username, ctx.config.rest_user_max_tokens, now,
                                               end_sign_ins=False)
    quotas.check_tokens(ctx.config, caller.username, held)
    token = await store.issue_token(ctx.bus, caller.username, TokenKind.APPLICATION, expires_at=expires,
                                    description=body.description, now=now)
    return web.json_response({"token": token, "id": store.token_id(store.token_key(token) or ""),
                              "expiresTime": _ms(expires)}, status=201)


async def revoke_token(request: web.Request) -> web.Response:
    caller = _caller(request)
    given = request.match_info["token"]
    owner = given.partition(".")[0] if "." in given else caller.username
    if not owner:  # `.x` names nobody (and an empty name would make a KV filter NATS never answers)
        raise NoToken(f"{caller.username} has no such token")
    if not core.may(caller, Action.MANAGE_OWN_TOKENS, owner):
        raise NoToken(f"{caller.username} has no such token")  # another's token: not even its existence is told
    await store.revoke_token(ctx_of(request).bus, owner, given)
    return web.json_response({"message": "token revoked"})


# --- users ---------------------------------------------------------------------------------------


async def _user_view(ctx: ServiceContext, user: User) -> dict[str, Any]:
    return user_view(user, await store.groups_named(ctx.bus, user.grouplist))


async def whoami(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    user, _ = await store.require_user(ctx.bus, _caller(request).username)
    return web.json_response(await _user_view(ctx, user))


async def list_users(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    ctx = ctx_of(request)
    users, groups = await store.all_users(ctx.bus), {g.groupname: g for g in await store.all_groups(ctx.bus)}
    return web.json_response([user_view(user, groups) for user in users])


async def get_user(request: web.Request) -> web.Response:
    name = request.match_info["user"]
    core.require(_caller(request), Action.READ_USER, name)
    ctx = ctx_of(request)
    user, _ = await store.require_user(ctx.bus, name)
    return web.json_response(await _user_view(ctx, user))


async def create_user(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    ctx = ctx_of(request)
    example = '{"username": "alice", "password": "...", "admin": false, "email": "alice@example.com"}'
    new: NewUser = await _body(request, NewUser, example, "the new user")
    core.check_username(new.username)
    core.check_email(new.email)
    if new.password is not None:
        core.check_password(new.password, new.username)
    grouplist = core.grouplist_with_admin(new.grouplist if new.grouplist is not None else [core.DEFAULT_GROUP],
                                          new.admin)
    await _check_groups_exist(ctx, grouplist)
    user = User(username=new.username, email=new.email, grouplist=grouplist, extension=new.extension,
                passwordHash=await store.hash_password(new.password) if new.password else "", createdAt=time.time())
    await store.create_user(ctx.bus, user)
    try:
        token = await store.issue_token(ctx.bus, new.username, TokenKind.APPLICATION,
                                        expires_at=core.token_expiry(TokenKind.APPLICATION, time.time(), policy(ctx)),
                                        description="made with the user")
    except Exception as exc:
        # The user is stored, its token is not: take the user back so that a 507 (or
        # 503) says the truth, "nothing was stored"; where that fails too, say what is.
        if await _taken_back(ctx, new.username):
            raise
        return web.json_response({"username": new.username, "token": None, **await _user_view(ctx, user),
                                  "warnings": [f"the user {new.username} was created, but its first token could "
                                               f"not be stored ({type(exc).__name__}): sign in with its password, "
                                               "or create a token (POST /api/v2/tokens) once the store has room"]},
                                 status=201)
    return web.json_response({"username": new.username, "token": token, **await _user_view(ctx, user),
                              "message": f"user {new.username} created"}, status=201)  # OpenPAI's answer is the message


async def _taken_back(ctx: ServiceContext, name: str) -> bool:
    """Delete the user `name` just created; whether it is gone."""
    try:
        await store.delete_user(ctx.bus, name)
        return True
    except Exception:  # noqa: BLE001 - a full store may refuse the delete as well
        return await store.get_user(ctx.bus, name) is None


async def change_user(request: web.Request) -> web.Response:
    caller = _caller(request)
    core.require(caller, Action.MANAGE_USERS)
    ctx = ctx_of(request)
    name = request.match_info["user"]
    change: UserChange = await _body(request, UserChange, '{"email": "...", "admin": true, "grouplist": ["default"]}',
                                     "the change")
    core.check_user_change(caller, name, new_admin=change.admin)
    if change.email is not None:
        core.check_email(change.email)
    if change.password is not None:
        core.check_password(change.password, name)
    if change.grouplist is not None:
        await _check_groups_exist(ctx, change.grouplist)
    password_hash = await store.hash_password(change.password) if change.password is not None else None

    def apply(user: User) -> User:
        grouplist = change.grouplist if change.grouplist is not None else user.grouplist
        admin = change.admin if change.admin is not None else (core.ADMIN_GROUP in grouplist or user.admin)
        return msgspec.structs.replace(
            user,
            email=user.email if change.email is None else change.email,
            grouplist=core.grouplist_with_admin(grouplist, admin),
            admin=False if change.admin is False else user.admin,  # an old record's flag goes with the group
            extension=user.extension if change.extension is None else change.extension,
            passwordHash=user.passwordHash if password_hash is None else password_hash,
        )

    user = await store.change_user(ctx.bus, name, apply)
    if password_hash is not None:
        await store.revoke_login_tokens(ctx.bus, name)
    return web.json_response(await _user_view(ctx, user))


async def change_me(request: web.Request) -> web.Response:
    caller = _caller(request)
    ctx = ctx_of(request)
    raw = await read_json_object(request, what="the change", example='{"password": "new", "oldPassword": "old"}')
    if "data" in raw:
        from services.rest.identity import openpai  # OpenPAI's {data, patch} (late: it imports this module)

        return await openpai.put_me(request, raw)
    change: SelfChange = decode_fields(raw, SelfChange, what="the change")
    if change.email is not None:
        core.check_email(change.email)
    password_hash = None
    if change.password is not None:
        core.check_password(change.password, caller.username)
        current, _ = await store.require_user(ctx.bus, caller.username)
        # The token alone does not change a password (a stolen one would keep the account).
        if current.passwordHash and not await store.password_matches(current.passwordHash, change.oldPassword or ""):
            raise IncorrectPassword("oldPassword is not the current password")
        password_hash = await store.hash_password(change.password)

    def apply(user: User) -> User:
        return msgspec.structs.replace(
            user,
            email=user.email if change.email is None else change.email,
            passwordHash=user.passwordHash if password_hash is None else password_hash,
        )

    user = await store.change_user(ctx.bus, caller.username, apply)
    if password_hash is not None:
        await store.revoke_login_tokens(ctx.bus, caller.username, keep=caller.tokenKey)
    return web.json_response(await _user_view(ctx, user))


async def delete_user(request: web.Request) -> web.Response:
    caller = _caller(request)
    core.require(caller, Action.MANAGE_USERS)
    name = request.match_info["user"]
    core.check_user_change(caller, name, new_admin=None, deleting=True)
    await store.delete_user(ctx_of(request).bus, name)
    return web.json_response({"message": f"user {name} deleted; their tokens no longer work"})


# --- groups --------------------------------------------------------------------------------------


async def list_groups(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.READ_GROUPS)
    return web.json_response([group_view(g) for g in await store.all_groups(ctx_of(request).bus)])


async def get_group(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.READ_GROUPS)
    group, _ = await store.require_group(ctx_of(request).bus, request.match_info["group"])
    return web.json_response(group_view(group))


async def group_members(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_GROUPS)
    ctx = ctx_of(request)
    name = request.match_info["group"]
    await store.require_group(ctx.bus, name)
    # OpenPAI's shape: each member with whether their groups make them an admin.
    groups = {group.groupname: group for group in await store.all_groups(ctx.bus)}
    members = [{"username": user.username, "clusterAdmin": core.resolve(user, groups).admin}
               for user in await store.all_users(ctx.bus) if name in user.grouplist]
    return web.json_response(members)


async def create_group(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_GROUPS)
    example = '{"groupname": "vision", "extension": {"acls": {"virtualClusters": ["vc1"]}}}'
    new: NewGroup = await _body(request, NewGroup, example, "the new group")
    core.check_groupname(new.groupname)
    core.check_group_acls(new.extension.acls)
    group = Group(groupname=new.groupname, description=new.description[:1024], externalName=new.externalName[:256],
                  extension=new.extension)
    await store.create_group(ctx_of(request).bus, group)
    return web.json_response({**group_view(group), "message": f"group {group.groupname} created"},
                             status=201)  # OpenPAI's answer is the message


async def change_group(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_GROUPS)
    name = request.match_info["group"]
    change: GroupChange = await _body(request, GroupChange, '{"extension": {"acls": {"virtualClusters": ["vc1"]}}}',
                                      "the change")
    core.check_group_change(name, acls=change.extension.acls if change.extension else None)
    if change.extension is not None:
        core.check_group_acls(change.extension.acls)

    def apply(group: Group) -> Group:
        return msgspec.structs.replace(
            group,
            description=group.description if change.description is None else change.description[:1024],
            externalName=group.externalName if change.externalName is None else change.externalName[:256],
            extension=group.extension if change.extension is None else change.extension,
        )

    return web.json_response(group_view(await store.change_group(ctx_of(request).bus, name, apply)))


async def delete_group(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_GROUPS)
    name = request.match_info["group"]
    core.check_group_change(name, deleting=True)
    await store.delete_group(ctx_of(request).bus, name)
    return web.json_response({"message": f"group {name} deleted"})


# `/users/me` before `/users/{user}`: aiohttp matches in the order routes are added.
routes = [
    web.post("/api/v2/authn/basic/login", login),
    web.delete("/api/v2/authn/basic/logout", logout),
    web.get("/api/v2/tokens", list_tokens),
    web.post("/api/v2/tokens", create_token),
    web.delete("/api/v2/tokens/{token}", revoke_token),
    web.get("/api/v2/users/me", whoami),
    web.put("/api/v2/users/me", change_me),
    web.get("/api/v2/users", list_users),
    web.post("/api/v2/users", create_user),
    web.get("/api/v2/users/{user}", get_user),
    web.put("/api/v2/users/{user}", change_user),
    web.delete("/api/v2/users/{user}", delete_user),
    web.get("/api/v2/groups", list_groups),
    web.post("/api/v2/groups", create_group),
    web.get("/api/v2/groups/{group}", get_group),
    web.put("/api/v2/groups/{group}", change_group),
    web.delete("/api/v2/groups/{group}", delete_group),
    web.get("/api/v2/groups/{group}/userlist", group_members),
]
