"""OpenAPI fragment: sign-in, tokens, users and groups (services/rest/identity/routes.py).

Request bodies are generated from the msgspec Structs rest decodes them with
(services/rest/records.py), so a field is declared once.
"""

from __future__ import annotations

from typing import Any

from services.rest.openapi.common import json_content, operation, path_param, ref, schemas_of
from services.rest.records import Group, GroupChange, Login, NewGroup, NewToken, NewUser, SelfChange, UserChange

_AUTHN, _TOKENS, _USERS, _GROUPS = ["authn"], ["tokens"], ["users"], ["groups"]

_refs, _components = schemas_of(Login, NewToken, NewUser, UserChange, SelfChange, NewGroup, GroupChange, Group)
_LOGIN, _NEW_TOKEN, _NEW_USER, _USER_CHANGE, _SELF_CHANGE, _NEW_GROUP, _GROUP_CHANGE, _GROUP = _refs

_MS = {"type": ["integer", "null"], "description": "milliseconds since the epoch"}
USER_VIEW = {
    "type": "object",
    "description": "OpenPAI's user: admin rights and virtual clusters come from the groups",
    "properties": {
        "username": {"type": "string"},
        "email": {"type": "string"},
        "grouplist": {"type": "array", "items": {"type": "string"}},
        "admin": {"type": "boolean"},
        "virtualCluster": {"type": "array", "items": {"type": "string"}},
        "extension": {"type": "object"},
        "hasPassword": {"type": "boolean"},
        "createdTime": _MS,
    },
    "required": ["username", "email", "grouplist", "admin", "virtualCluster"],
}
TOKEN_VIEW = {
    "type": "object",
    "description": "one of the caller's tokens, by id (the token itself is shown once, when made)",
    "properties": {"id": {"type": "string"}, "kind": {"type": "string", "enum": ["login", "application", "platform"]},
                   "description": {"type": "string"}, "createdTime": _MS, "expiresTime": _MS},
    "required": ["id", "kind", "createdTime", "expiresTime"],
}
MESSAGE = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}

SCHEMAS: dict[str, Any] = {**_components, "UserView": USER_VIEW, "TokenView": TOKEN_VIEW}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": json_content(schema)}


def _ok(status: int, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {str(status): {"description": description, "content": json_content(schema)}}


_USER = path_param("user", "user name", {"type": "string", "pattern": "^[a-zA-Z0-9_-]+$"})
_GROUPNAME = path_param("group", "group name", {"type": "string", "pattern": "^[a-zA-Z0-9_-]+$"})
_TOKEN = path_param("token", "a token's id (from GET /api/v2/tokens) or the token itself")
_USERS_LIST = {"type": "array", "items": ref("UserView")}
_CREATED_USER = {"allOf": [ref("UserView"), {"type": "object", "properties": {"token": {"type": "string"}},
                                              "required": ["token"]}]}

PATHS: dict[str, Any] = {
    "/api/v2/authn/basic/login": {
        "post": operation(
            "Sign in with user name and password", tags=_AUTHN, public=True, fails=(400, 401, 413),
            description="401 IncorrectPasswordError for a wrong password or an unknown user alike. "
                        "The token lives `expiration` seconds (default: rest_login_token_seconds, 7 days).",
            body=_body(_LOGIN),
            ok=_ok(200, "signed in", {"type": "object", "required": ["token", "user", "admin"], "properties": {
                "token": {"type": "string"}, "user": {"type": "string"}, "admin": {"type": "boolean"},
                "expiresTime": _MS}}),
        ),
    },
    "/api/v2/authn/basic/logout": {
        "delete": operation("Sign out: the token used stops working", tags=_AUTHN, ok=_ok(200, "signed out", MESSAGE)),
    },
    "/api/v2/tokens": {
        "get": operation("The caller's live tokens, by id", tags=_TOKENS, ok=_ok(200, "tokens", {
            "type": "object", "properties": {"tokens": {"type": "array", "items": ref("TokenView")}},
            "required": ["tokens"]})),
        "post": operation("Make an application token (for scripts); shown once", tags=_TOKENS, fails=(400, 413),
                          body=_body(_NEW_TOKEN), ok=_ok(201, "made", {"type": "object", "properties": {
                              "token": {"type": "string"}, "id": {"type": "string"}, "expiresTime": _MS},
                              "required": ["token", "id"]})),
    },
    "/api/v2/tokens/{token}": {
        "delete": operation("Revoke one of the caller's tokens", tags=_TOKENS, fails=(404,), params=[_TOKEN],
                            ok=_ok(200, "revoked", MESSAGE)),
    },
    "/api/v2/users/me": {
        "get": operation("The caller", tags=_USERS, ok=_ok(200, "the caller", ref("UserView"))),
        "put": operation("Change one's own email or password (the old password required if one is set)",
                         tags=_USERS, fails=(400, 413), body=_body(_SELF_CHANGE),
                         ok=_ok(200, "changed; other sign-ins end on a password change", ref("UserView"))),
    },
    "/api/v2/users": {
        "get": operation("Every user (admins)", tags=_USERS, fails=(403,), ok=_ok(200, "users", _USERS_LIST)),
        "post": operation("Create a user (admins); answers their first token", tags=_USERS, fails=(400, 403, 404, 409, 413),
                          body=_body(_NEW_USER), ok=_ok(201, "created", _CREATED_USER)),
    },
    "/api/v2/users/{user}": {
        "get": operation("One user (themselves or admins)", tags=_USERS, fails=(403, 404), params=[_USER],
                         ok=_ok(200, "the user", ref("UserView"))),
        "put": operation("Change a user's email, admin rights, groups or password (admins)", tags=_USERS,
                         fails=(400, 403, 404, 409, 413), params=[_USER], body=_body(_USER_CHANGE),
                         ok=_ok(200, "changed", ref("UserView"))),
        "delete": operation("Delete a user and their tokens (admins; not oneself)", tags=_USERS, fails=(403, 404, 409),
                            params=[_USER], ok=_ok(200, "deleted", MESSAGE)),
    },
    "/api/v2/groups": {
        "get": operation("Every group", tags=_GROUPS, ok=_ok(200, "groups", {"type": "array", "items": _GROUP})),
        "post": operation("Create a group (admins)", tags=_GROUPS, fails=(400, 403, 409, 413), body=_body(_NEW_GROUP),
                          ok=_ok(201, "created", _GROUP)),
    },
    "/api/v2/groups/{group}": {
        "get": operation("One group", tags=_GROUPS, fails=(404,), params=[_GROUPNAME], ok=_ok(200, "the group", _GROUP)),
        "put": operation("Change a group (admins)", tags=_GROUPS, fails=(400, 403, 404, 409, 413), params=[_GROUPNAME],
                         body=_body(_GROUP_CHANGE), ok=_ok(200, "changed", _GROUP)),
        "delete": operation("Delete a group with no members (admins; not a built-in one)", tags=_GROUPS,
                            fails=(403, 404, 409), params=[_GROUPNAME], ok=_ok(200, "deleted", MESSAGE)),
    },
    "/api/v2/groups/{group}/userlist": {
        "get": operation("The members of a group (admins)", tags=_GROUPS, fails=(403, 404), params=[_GROUPNAME],
                         ok=_ok(200, "user names", {"type": "array", "items": {"type": "string"}})),
    },
}
