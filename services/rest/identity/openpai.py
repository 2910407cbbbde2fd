"""OpenPAI v2's user, group and token edits in OpenPAI's own bodies, beside PAI's.

PAI's identity API (identity/routes.py) edits a user with `PUT /users/{user}` and a
group with `PUT /groups/{group}`, only the fields given. OpenPAI's clients send:

    PUT    /api/v2/users                      {"data": {"username", "email", "virtualCluster",
                                               "admin", "password", "extension"}, "patch": bool}
    PUT    /api/v2/users/me                   {"data": {"username", "email", "newPassword",
                                               "oldPassword", "extension"}, "patch": bool}
    PUT    /api/v2/users/{user}/group         {"groupname"}   join a group
    DELETE /api/v2/users/{user}/group         {"groupname"}   leave it
    PUT    /api/v2/users/{user}/grouplist     {"grouplist"}
    PUT    /api/v2/users/{user}/extension     {"extension"}   (self or admin)
    PUT    /api/v2/users/{user}/virtualcluster {"virtualCluster"}
    PUT    /api/v2/users/{user}/password      {"oldPassword"?, "newPassword"}
    PUT    /api/v2/users/{user}/email         {"email"}       (self or admin)
    PUT    /api/v2/users/{user}/admin         {"admin"}
    PUT    /api/v2/groups                     {"data": {"groupname", "description",
                                               "externalName", "extension"}, "patch": bool}
    PUT    /api/v2/groups/{group}/extension   {"extension"}
    PUT    /api/v2/groups/{group}/extension/{path...} {"data"}  one attribute of it
    PUT    /api/v2/groups/{group}/description {"description"}
    PUT    /api/v2/groups/{group}/externalname {"externalName"}
    POST   /api/v2/tokens/application         an application token: {"token", "application": true}
    GET    /api/v2/tokens/check               who the token is

Each answers OpenPAI's `{"message": ...}` with OpenPAI's status (201 for edits) and goes
through the same checks and store as PAI's own routes. A VC list (OpenPAI grants VCs per
user) is kept as PAI keeps it, in groups: the user joins the group named after each VC
listed, which must grant it.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from libs.common.errors import Forbidden, IncorrectPassword, NoGroup
from services.rest import quotas
from services.rest.identity import core, routes as identity_routes, store
from services.rest.identity.core import Action, Principal
from services.rest.records import Group, GroupExtension, TokenKind, User
from services.rest.request import USER, bad_field, ctx_of, read_json_object

MAX_DESCRIPTION = 1024
_BODY = web.RequestKey("openpai_body", dict)  # the request's JSON body, kept by _user_field
MAX_EXTERNAL_NAME = 256


def _message(text: str, status: int = 201) -> web.Response:
    return web.json_response({"message": text}, status=status)


def _str(body: dict[str, Any], field: str, path: str = "") -> str:
    value = body.get(field)
    if not isinstance(value, str):
        raise bad_field(path + field, "type", f"{path + field} must be a string")
    return value


def _data(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    data, patch = body.get("data"), body.get("patch", False)
    if not isinstance(data, dict):
        raise bad_field("data", "type", 'the body is {"data": {...}, "patch": true|false} (OpenPAI\'s shape)')
    if not isinstance(patch, bool):
        raise bad_field("patch", "type", "patch must be true or false")
    return data, patch


def _caller(request: web.Request) -> Principal:
    return request[USER]


def _self_or_admin(caller: Principal, name: str, what: str) -> None:
    if not (caller.admin or caller.username == name):
        raise Forbidden(f"only {name} or an admin may change the {what} of {name}")


async def _vc_groups(request: web.Request, vcs: Any, path: str) -> list[str]:
    """The groups named after each VC listed, which must grant it (PAI keeps VC grants in groups)."""
    if not isinstance(vcs, list) or not all(isinstance(v, str) for v in vcs):
        raise bad_field(path, "type", f"{path} must be a list of virtual cluster names")
    found = {**core.BUILTIN_GROUPS, **await store.groups_named(ctx_of(request).bus, vcs)}
    for i, vc in enumerate(vcs):
        group = found.get(vc)
        if group is None or vc not in group.extension.acls.virtualClusters:
            raise NoGroup(f"{path}[{i}]: no group {vc!r} grants virtual cluster {vc!r}; PAI grants VCs through "
                          f"groups: create one (POST /api/v2/groups with extension.acls.virtualClusters) or "
                          f"set the user's grouplist", details={"errors": [{"path": f"{path}[{i}]", "rule": "exists",
                                                                           "message": f"no group grants {vc!r}"}]})
    return list(dict.fromkeys(vcs))


def _with_vcs(user: User, vc_groups: list[str], groups: dict[str, Group]) -> list[str]:
    """The user's groups that grant no VC, then the VC groups (pure)."""
    known = {**core.BUILTIN_GROUPS, **groups}
    keep = [g for g in user.grouplist if g in known and not known[g].extension.acls.virtualClusters]
    return list(dict.fromkeys([*keep, *vc_groups]))


async def _change_user(request: web.Request, name: str, *, email: str | None = None, admin: bool | None = None,
                       password: str | None = None, grouplist: list[str] | None = None,
                       extension: dict[str, Any] | None = None, vcs: list[str] | None = None,
                       patch: bool = True) -> User:
    """One user's change through PAI's checks: an admin's (admin, groups, VCs) or the user's own."""
    ctx = ctx_of(request)
    caller = _caller(request)
    if admin is not None or grouplist is not None or vcs is not None:
        core.require(caller, Action.MANAGE_USERS)
        core.check_user_change(caller, name, new_admin=admin)
    if email is not None:
        core.check_email(email)
    if password is not None:
        core.check_password(password, name)
    if grouplist is not None:
        await identity_routes._check_groups_exist(ctx, grouplist)
    vc_groups = await _vc_groups(request, vcs, "data.virtualCluster") if vcs is not None else None
    groups = {g.groupname: g for g in await store.all_groups(ctx.bus)} if vc_groups is not None else {}
    password_hash = await store.hash_password(password) if password is not None else None

    def apply(user: User) -> User:
        listed = grouplist if grouplist is not None else user.grouplist
        if vc_groups is not None:
            listed = _with_vcs(msgspec.structs.replace(user, grouplist=listed), vc_groups, groups)
        is_admin = admin if admin is not None else (core.ADMIN_GROUP in listed or user.admin)
        new_extension = user.extension
        if extension is not None:
            new_extension = {**user.extension, **extension} if patch else extension
        return msgspec.structs.replace(
            user, email=user.email if email is None else email,
            grouplist=core.grouplist_with_admin(listed, is_admin),
            admin=False if admin is False else user.admin, extension=new_extension,
            passwordHash=user.passwordHash if password_hash is None else password_hash)

    user = await store.change_user(ctx.bus, name, apply)
    if password_hash is not None:
        await store.revoke_login_tokens(ctx.bus, name, keep=caller.tokenKey if caller.username == name else "")
    return user


def _optional(data: dict[str, Any], field: str, kind: type, path: str) -> Any:
    value = data.get(field)
    if value is not None and not isinstance(value, kind):
        raise bad_field(path + field, "type", f"{path + field} must be a {kind.__name__}")
    return value


# --- users -----------------------------------------------------------------------------------


async def put_users(request: web.Request) -> web.Response:
    """PUT /api/v2/users (admin): OpenPAI's `{data, patch}` change of one user."""
    core.require(_caller(request), Action.MANAGE_USERS)
    body = await read_json_object(request, what="the change", example='{"data": {"username": "alice"}, "patch": true}')
    data, patch = _data(body)
    name = _str(data, "username", "data.")
    await store.require_user(ctx_of(request).bus, name)
    await _change_user(request, name, email=_optional(data, "email", str, "data."),
                       admin=_optional(data, "admin", bool, "data."),
                       password=_optional(data, "password", str, "data."),
                       extension=_optional(data, "extension", dict, "data."),
                       vcs=_optional(data, "virtualCluster", list, "data."), patch=patch)
    return _message(f"update user {name} successfully")


async def put_me(request: web.Request, body: dict[str, Any]) -> web.Response:
    """PUT /api/v2/users/me in OpenPAI's `{data, patch}` (identity/routes.change_me read the body):
    email, extension, password (with the old one)."""
    ctx = ctx_of(request)
    caller = _caller(request)
    data, patch = _data(body)
    named = data.get("username", caller.username)
    if named != caller.username:
        raise Forbidden(f"PUT /api/v2/users/me changes {caller.username} only (data.username is {str(named)[:64]!r})")
    new_password = _optional(data, "newPassword", str, "data.")
    if new_password is not None:
        current, _ = await store.require_user(ctx.bus, caller.username)
        old = _optional(data, "oldPassword", str, "data.") or ""
        if current.passwordHash and not await store.password_matches(current.passwordHash, old):
            raise IncorrectPassword("data.oldPassword is not the current password")
    await _change_user(request, caller.username, email=_optional(data, "email", str, "data."),
                       password=new_password, extension=_optional(data, "extension", dict, "data."), patch=patch)
    return _message(f"update user {caller.username} successfully")


async def _user_field(request: web.Request, field: str, example: str) -> tuple[str, Any]:
    name = request.match_info["user"]
    await store.require_user(ctx_of(request).bus, name)
    body = await read_json_object(request, what="the body", example=example)
    if field not in body:
        raise bad_field(field, "required", f"the body must name {field}: {example}")
    request[_BODY] = body  # (a body is read once)
    return name, body[field]


async def join_group(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    name, group = await _user_field(request, "groupname", '{"groupname": "vision"}')
    if not isinstance(group, str):
        raise bad_field("groupname", "type", "groupname must be a string")
    current, _ = await store.require_user(ctx_of(request).bus, name)
    await _change_user(request, name, grouplist=list(dict.fromkeys([*current.grouplist, group])))
    return _message(f"user {name} is added into group {group}")


async def leave_group(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    name, group = await _user_field(request, "groupname", '{"groupname": "vision"}')
    if not isinstance(group, str):
        raise bad_field("groupname", "type", "groupname must be a string")
    current, _ = await store.require_user(ctx_of(request).bus, name)
    if group not in current.grouplist:
        raise NoGroup(f"user {name} is not in group {group[:64]!r} (their groups: {', '.join(current.grouplist)})")
    await _change_user(request, name, grouplist=[g for g in current.grouplist if g != group],
                       admin=False if group == core.ADMIN_GROUP else None)
    return _message(f"user {name} is removed from group {group}")


async def put_grouplist(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    name, grouplist = await _user_field(request, "grouplist", '{"grouplist": ["default"]}')
    if not isinstance(grouplist, list) or not all(isinstance(g, str) for g in grouplist):
        raise bad_field("grouplist", "type", "grouplist must be a list of group names")
    await _change_user(request, name, grouplist=grouplist, admin=core.ADMIN_GROUP in grouplist)
    return _message(f"update user {name} grouplist successfully")


async def put_user_extension(request: web.Request) -> web.Response:
    name, extension = await _user_field(request, "extension", '{"extension": {"key": "value"}}')
    _self_or_admin(_caller(request), name, "extension")
    if not isinstance(extension, dict):
        raise bad_field("extension", "type", "extension must be an object")
    await _change_user(request, name, extension=extension, patch=True)
    return _message(f"update user {name} extension data successfully")


async def put_user_vcs(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    name, vcs = await _user_field(request, "virtualCluster", '{"virtualCluster": ["default"]}')
    await _change_user(request, name, vcs=vcs)
    return _message(f"update user {name} virtual clusters successfully")


async def put_user_password(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    caller = _caller(request)
    name, new = await _user_field(request, "newPassword", '{"oldPassword": "...", "newPassword": "..."}')
    _self_or_admin(caller, name, "password")
    if not isinstance(new, str):
        raise bad_field("newPassword", "type", "newPassword must be a string")
    if not caller.admin:  # a user's own change needs the old password, as PUT /users/me
        current, _ = await store.require_user(ctx.bus, name)
        body = request[_BODY]
        old = body.get("oldPassword") if isinstance(body.get("oldPassword"), str) else ""
        if current.passwordHash and not await store.password_matches(current.passwordHash, old):
            raise IncorrectPassword("oldPassword is not the current password")
    await _change_user(request, name, password=new)
    return _message(f"update user {name} password successfully")


async def put_user_email(request: web.Request) -> web.Response:
    name, email = await _user_field(request, "email", '{"email": "alice@example.com"}')
    _self_or_admin(_caller(request), name, "email")
    if not isinstance(email, str):
        raise bad_field("email", "type", "email must be a string")
    await _change_user(request, name, email=email)
    return _message(f"update user {name} email successfully")


async def put_user_admin(request: web.Request) -> web.Response:
    core.require(_caller(request), Action.MANAGE_USERS)
    name, admin = await _user_field(request, "admin", '{"admin": true}')
    if not isinstance(admin, bool):
        raise bad_field("admin", "type", "admin must be true or false")
    await _change_user(request, name, admin=admin)
    return _message(f"update user {name} admin permission successfully")


# --- groups ----------------------------------------------------------------------------------


def _extension(value: Any, path: str) -> GroupExtension:
    try:
        extension = msgspec.convert(value, GroupExtension)
    except msgspec.ValidationError as exc:
        raise bad_field(path, "type", f"{path}: {exc}") from None
    core.check_group_acls(extension.acls, f"{path}.acls")
    return extension


async def _change_group(request: web.Request, name: str, *, description: Any = None, external: Any = None,
                        extension: GroupExtension | None = None) -> Group:
    core.require(_caller(request), Action.MANAGE_GROUPS)
    core.check_group_change(name, acls=extension.acls if extension else None)
    for field, value in (("description", description), ("externalName", external)):
        if value is not None and not isinstance(value, str):
            raise bad_field(field, "type", f"{field} must be a string")

    def apply(group: Group) -> Group:
        return msgspec.structs.replace(
            group, description=group.description if description is None else description[:MAX_DESCRIPTION],
            externalName=group.externalName if external is None else external[:MAX_EXTERNAL_NAME],
            extension=group.extension if extension is None else extension)

    return await store.change_group(ctx_of(request).bus, name, apply)


async def put_groups(request: web.Request) -> web.Response:
    """PUT /api/v2/groups: OpenPAI's `{data, patch}` change of one group."""
    core.require(_caller(request), Action.MANAGE_GROUPS)
    body = await read_json_object(request, what="the change", example='{"data": {"groupname": "vision"}}')
    data, patch = _data(body)
    name = _str(data, "groupname", "data.")
    current, _ = await store.require_group(ctx_of(request).bus, name)
    extension = None
    if "extension" in data:
        raw = data["extension"]
        if patch and isinstance(raw, dict):
            raw = {**msgspec.to_builtins(current.extension), **raw}
        extension = _extension(raw, "data.extension")
    await _change_group(request, name, description=data.get("description"), external=data.get("externalName"),
                        extension=extension)
    return _message(f"update group {name} successfully")


async def _group_field(request: web.Request, field: str, example: str) -> tuple[str, Any]:
    core.require(_caller(request), Action.MANAGE_GROUPS)
    name = request.match_info["group"]
    await store.require_group(ctx_of(request).bus, name)
    body = await read_json_object(request, what="the body", example=example)
    if field not in body:
        raise bad_field(field, "required", f"the body must name {field}: {example}")
    return name, body[field]


async def put_group_extension(request: web.Request) -> web.Response:
    name, value = await _group_field(request, "extension", '{"extension": {"acls": {"virtualClusters": ["vc1"]}}}')
    await _change_group(request, name, extension=_extension(value, "extension"))
    return _message(f"update group {name} extension data successfully")


async def put_group_extension_attribute(request: web.Request) -> web.Response:
    """PUT /api/v2/groups/{group}/extension/{a/b/...} {"data": value}: one attribute of the extension."""
    name, value = await _group_field(request, "data", '{"data": ["vc1"]}')
    current, _ = await store.require_group(ctx_of(request).bus, name)
    steps = [s for s in request.match_info["path"].split("/") if s]
    if not steps:
        raise bad_field("path", "required", "name the attribute: /extension/acls/virtualClusters")
    extension = msgspec.to_builtins(current.extension)
    node = extension
    for step in steps[:-1]:
        node = node.setdefault(step, {})
        if not isinstance(node, dict):
            raise bad_field("path", "type", f"extension.{'.'.join(steps)}: {step} is not an object")
    node[steps[-1]] = value
    await _change_group(request, name, extension=_extension(extension, "extension"))
    return _message(f"update group {name} extension attribute {'.'.join(steps)} successfully")


async def put_group_description(request: web.Request) -> web.Response:
    name, value = await _group_field(request, "description", '{"description": "..."}')
    await _change_group(request, name, description=value)
    return _message(f"update group {name} description data successfully")


async def put_group_external_name(request: web.Request) -> web.Response:
    name, value = await _group_field(request, "externalName", '{"externalName": "..."}')
    await _change_group(request, name, external=value)
    return _message(f"update group {name} externalname data successfully")


# --- tokens ----------------------------------------------------------------------------------


async def create_application_token(request: web.Request) -> web.Response:
    """POST /api/v2/tokens/application: an application token with the configured lifetime."""
    ctx = ctx_of(request)
    caller = _caller(request)
    now = time.time()
    expires = core.token_expiry(TokenKind.APPLICATION, now, identity_routes.policy(ctx))
    held = await store.room_for_one_more_token(ctx.bus, caller.username, ctx.config.rest_user_max_tokens, now,
                                               end_sign_ins=False)
    quotas.check_tokens(ctx.config, caller.username, held)
    token = await store.issue_token(ctx.bus, caller.username, TokenKind.APPLICATION, expires_at=expires,
                                    description="application", now=now)
    return web.json_response({"token": token, "application": True})


async def check_token(request: web.Request) -> web.Response:
    """GET /api/v2/tokens/check: who the token is (OpenPAI: the token's claims)."""
    caller = _caller(request)
    token = request.headers.get("Authorization", "").partition(" ")[2]
    found = await store.lookup_token(ctx_of(request).bus, token, time.time()) if token else None
    record = found[0] if found else None
    return web.json_response({
        "username": caller.username, "admin": caller.admin,
        "application": record is not None and record.kind == TokenKind.APPLICATION,
        "iat": int(record.createdAt) if record else None,
        "exp": int(record.expiresAt) if record and record.expiresAt else None,
    })


# `/users/me` comes before these in identity/routes.py; none of these paths overlaps another.
routes = [
    web.put("/api/v2/users", put_users),
    web.put("/api/v2/users/{user}/group", join_group),
    web.delete("/api/v2/users/{user}/group", leave_group),
    web.put("/api/v2/users/{user}/grouplist", put_grouplist),
    web.put("/api/v2/users/{user}/extension", put_user_extension),
    web.put("/api/v2/users/{user}/virtualcluster", put_user_vcs),
    web.put("/api/v2/users/{user}/password", put_user_password),
    web.put("/api/v2/users/{user}/email", put_user_email),
    web.put("/api/v2/users/{user}/admin", put_user_admin),
    web.put("/api/v2/groups", put_groups),
    web.put("/api/v2/groups/{group}/extension", put_group_extension),
    web.put("/api/v2/groups/{group}/extension/{path:.+}", put_group_extension_attribute),
    web.put("/api/v2/groups/{group}/description", put_group_description),
    web.put("/api/v2/groups/{group}/externalname", put_group_external_name),
    web.post("/api/v2/tokens/application", create_application_token),
    web.get("/api/v2/tokens/check", check_token),
]
