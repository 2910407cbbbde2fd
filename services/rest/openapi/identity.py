"""OpenAPI fragment: sign-in, tokens, users and groups (services/rest/identity/routes.py).

Request bodies are generated from the msgspec Structs rest decodes them with
(services/rest/records.py), so a field is declared once.
"""

from __future__ import annotations

from typing import Any

from libs.common.protocol import ssh
from services.rest.openapi.common import errors, json_content, operation, path_param, query_param, ref, schemas_of
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
_KEY_TITLE = path_param("title", "the key's title", {"type": "string", "pattern": ssh.KEY_TITLE.pattern})
_SSH_KEY_IN = {"type": "object", "required": ["title", "value"], "additionalProperties": False, "properties": {
    "title": {"type": "string", "pattern": ssh.KEY_TITLE.pattern},
    "value": {"type": "string", "maxLength": ssh.MAX_PUBLIC_KEY_CHARS, "description": "one OpenSSH public key line"}}}
_SSH_KEY = {"type": "object", "required": ["title", "value"], "properties": {
    "title": {"type": "string"}, "value": {"type": "string"}, "time": _MS}}
_SSH_KEYS = {"type": "object", "required": ["sshKeys"], "properties": {"sshKeys": {"type": "array", "items": _SSH_KEY}}}
_REDIRECT = {"302": {"description": "to the Location header's URL"}}
_AUTHN_INFO = {"type": "object", "required": ["authn_type", "loginURI", "loginURIMethod"], "properties": {
    "authn_type": {"type": "string", "enum": ["basic", "OIDC"]}, "loginURI": {"type": "string"},
    "loginURIMethod": {"type": "string", "enum": ["get", "post"]},
    "basicAuth": {"type": "boolean", "description": "PAI's: whether password sign-in is on (config basic_auth)"},
    "oidc": {"type": ["object", "null"], "description": "PAI's: the identity provider, when configured",
             "properties": {"provider": {"type": "string"}, "issuer": {"type": "string"},
                            "loginURI": {"type": "string"}, "logoutURI": {"type": "string"}}}}}


def _browser_redirect(summary: str, description: str, fails: tuple[int, ...], **more: Any) -> dict[str, Any]:
    op = operation(summary, tags=_AUTHN, public=True, fails=fails, ok=_REDIRECT, description=description, **more)
    if 401 in fails:  # public, yet refused with 401 when the provider's answer does not check out
        op["responses"]["401"] = errors(401)["401"]
    return op


_OIDC_RETURN = _browser_redirect(
    "Back from the identity provider: signs the user in and lands on the portal with PAI's token",
    "OpenPAI's: the provider's callback (register it there as oidc_redirect_url). The user is made at their "
    "first sign-in; their groups follow the directory's (a group's externalName). Lands on the portal with "
    "`?user=&token=&admin=&from=`; a refusal is JSON, or for a browser (Accept: text/html) the portal's "
    "sign-in page with `#/login?error=`.", (400, 401, 403, 404),
    params=[query_param("code", "the authorization code"), query_param("state", "the sign-in's state"),
            query_param("error", "the provider's refusal")])
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
    "/api/v2/authn/info": {
        "get": operation("Which sign-ins this PAI offers (OpenPAI's shape)", tags=_AUTHN, public=True,
                         ok=_ok(200, "the sign-ins", _AUTHN_INFO)),
    },
    "/api/v2/authn/oidc/login": {
        "get": _browser_redirect(
            "Sign in through the organisation's identity provider (OIDC): to its sign-in page",
            "Authorization code flow with PKCE; 404 where no provider is configured (oidc_issuer).",
            (400, 404), params=[query_param("redirect_uri", "where to land afterwards: a path or a URL of PAI's "
                                            "portal (default: the portal)"),
                                query_param("from", "OpenPAI's: the page to show after landing")]),
    },
    "/api/v2/authn/oidc/return": {"get": _OIDC_RETURN, "post": _OIDC_RETURN},
    "/api/v2/authn/oidc/logout": {
        "get": _browser_redirect("Sign out at the identity provider, then back to the portal",
                                 "OpenPAI's: to the provider's end_session_endpoint.", (400, 404),
                                 params=[query_param("redirect_uri", "where to land afterwards")]),
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
    "/api/v2/users/me/ssh-keys": {
        "get": operation("The caller's SSH public keys (extension.sshKeys, which the ssh plugin trusts)", tags=_USERS,
                         ok=_ok(200, "the keys", _SSH_KEYS)),
        "post": operation("Add an SSH public key to one's profile", tags=_USERS, fails=(400, 409, 413),
                          description="One OpenSSH public key line (ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256/384/521, "
                                      "sk-ssh-ed25519@openssh.com, sk-ecdsa-sha2-nistp256@openssh.com), no options; "
                                      f"at most {ssh.MAX_PROFILE_KEYS} keys. 400 names the field (title, value, sshKeys); "
                                      "409 for a title or key already there. Jobs submitted from then on trust it.",
                          body=_body(_SSH_KEY_IN), ok=_ok(201, "added", _SSH_KEY)),
    },
    "/api/v2/users/me/ssh-keys/{title}": {
        "delete": operation("Delete one of one's SSH public keys", tags=_USERS, fails=(404,), params=[_KEY_TITLE],
                            ok=_ok(200, "deleted", MESSAGE)),
    },
    "/api/v2/users/{user}/ssh-keys": {
        "get": operation("A user's SSH public keys (themselves or admins)", tags=_USERS, fails=(403, 404),
                         params=[_USER], ok=_ok(200, "the keys", _SSH_KEYS)),
        "post": operation("Add an SSH public key to a user's profile (themselves or admins)", tags=_USERS,
                          fails=(400, 403, 404, 409, 413), params=[_USER], body=_body(_SSH_KEY_IN),
                          ok=_ok(201, "added", _SSH_KEY)),
    },
    "/api/v2/users/{user}/ssh-keys/{title}": {
        "delete": operation("Delete one of a user's SSH public keys (themselves or admins)", tags=_USERS,
                            fails=(403, 404), params=[_USER, _KEY_TITLE], ok=_ok(200, "deleted", MESSAGE)),
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
                         ok=_ok(200, "the members, as OpenPAI's", {"type": "array", "items": {
                             "type": "object", "required": ["username", "clusterAdmin"],
                             "properties": {"username": {"type": "string"}, "clusterAdmin": {"type": "boolean"}}}})),
    },
}
