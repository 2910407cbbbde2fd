"""A user's SSH public keys, added, listed and deleted one at a time.

OpenPAI keeps them in the user's extension (`extension.sshKeys`: `[{title, value, time}]`),
which its clients edit by putting the whole extension (`PUT /users/{user}/extension`,
identity/openpai.py); the ssh plugin reads them from there at submission
(services/rest/job_ssh.py). These routes edit that same list, key by key, with each key
checked as the plugin reads it (libs/common/protocol/ssh.py):

    GET    /api/v2/users/me/ssh-keys               {"sshKeys": [{title, value, time}]}
    POST   /api/v2/users/me/ssh-keys               {"title", "value"} -> 201 the key
    DELETE /api/v2/users/me/ssh-keys/{title}
    ... and /api/v2/users/{user}/ssh-keys[/{title}]  (that user or admins)

A change is a compare-and-set on the user record (store.change_user): two adds at once
both land, and an add never undoes another edit of the user.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from libs.common.errors import ConflictUser, Forbidden, NotFound
from libs.common.protocol import ssh
from services.rest.identity import store
from services.rest.records import User
from services.rest.request import USER, bad_field, ctx_of, read_json_object

EXAMPLE = '{"title": "laptop", "value": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA... me@laptop"}'


class NoSshKey(NotFound):
    code = "NotFoundError"


def _whose(request: web.Request) -> str:
    """The user named by the path (`me`: the caller); only they or an admin edit their keys."""
    caller = request[USER]
    name = request.match_info.get("user", caller.username)
    if not (caller.admin or caller.username == name):
        raise Forbidden(f"only {name} or an admin may see or change the SSH keys of {name}")
    return name


def _extension_with(user: User, entries: list[dict[str, Any]]) -> User:
    return msgspec.structs.replace(user, extension={**user.extension, "sshKeys": entries})


async def list_keys(request: web.Request) -> web.Response:
    name = _whose(request)
    user, _ = await store.require_user(ctx_of(request).bus, name)
    return web.json_response({"sshKeys": ssh.profile_key_entries(user.extension)})


async def add_key(request: web.Request) -> web.Response:
    name = _whose(request)
    bus = ctx_of(request).bus
    await store.require_user(bus, name)
    body = await read_json_object(request, what="the key", example=EXAMPLE)
    title, value = body.get("title"), body.get("value")
    unknown = sorted(set(body) - {"title", "value"})
    if unknown:
        raise bad_field(unknown[0], "unknown", f"not a field of a key; send {EXAMPLE}")
    entry = {"title": title.strip() if isinstance(title, str) else title,
             "value": value.strip() if isinstance(value, str) else value, "time": int(time.time() * 1000)}

    def apply(user: User) -> User:  # again on a lost race, so the check sees the stored list
        entries = ssh.profile_key_entries(user.extension)
        problem = ssh.profile_key_problem(entries, entry["title"], entry["value"])
        if problem is not None:
            field, rule, message = problem
            if rule == "unique":  # a key of that title or body is there: 409, as OpenPAI's name clashes
                raise ConflictUser(f"{field}: {message}", details={"errors": [
                    {"path": field, "rule": rule, "message": message}]})
            raise bad_field(field, rule, message)
        return _extension_with(user, [*entries, entry])

    await store.change_user(bus, name, apply)
    return web.json_response(entry, status=201)


async def delete_key(request: web.Request) -> web.Response:
    name = _whose(request)
    title = request.match_info["title"]

    def apply(user: User) -> User:
        entries = ssh.profile_key_entries(user.extension)
        kept = [e for e in entries if e["title"] != title]
        if len(kept) == len(entries):
            listed = ", ".join(e["title"] for e in entries) or "none"
            raise NoSshKey(f"{name} has no SSH key titled {title[:64]!r} (their keys: {listed})")
        return _extension_with(user, kept)

    await store.change_user(ctx_of(request).bus, name, apply)
    return web.json_response({"message": f"SSH key {title} of {name} deleted"})


# `/users/me/...` before `/users/{user}/...`: aiohttp matches in the order routes are added.
routes = [
    web.get("/api/v2/users/me/ssh-keys", list_keys),
    web.post("/api/v2/users/me/ssh-keys", add_key),
    web.delete("/api/v2/users/me/ssh-keys/{title}", delete_key),
    web.get("/api/v2/users/{user}/ssh-keys", list_keys),
    web.post("/api/v2/users/{user}/ssh-keys", add_key),
    web.delete("/api/v2/users/{user}/ssh-keys/{title}", delete_key),
]
