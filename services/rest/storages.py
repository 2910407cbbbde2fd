"""Storages over HTTP, as OpenPAI's rest server lists them, and the storages of a job at submission.

- `GET /api/v2/storages`: `{storages: [{name, share, volumeName, default, ...}]}`, the
  storages the caller's groups grant (`extension.acls.storageConfigs`); admins see all.
- `GET /api/v2/storages/{name}`: one storage with its `type`, `data` and `mountOptions`
  (OpenPAI's detail); 404 `NoStorageError` when none is declared, 403 when the
  caller's groups do not grant it.
- `GET /api/v2/storage/config[/{name}]`, `GET /api/v2/storage/server[/{name}]`: OpenPAI's
  deprecated views of the same declarations (a config of one server named after the storage),
  read as above: the caller's granted ones, admins all; 404/403 by name.
- `PUT /api/v2/storages/{name}` and `DELETE /api/v2/storages/{name}` (PAI's, admins):
  declare or change a storage, or take it away. Jobs already accepted keep the
  declaration they were given.

Declarations live in `pai_users` as `storage.<name>`, beside the groups that grant
them (rest owns the bucket; identity/store.py keeps users and groups there the same
way): created with `create`, changed at the revision read. `storages_file` (the
config) declares storages at rest's start: each one it lists is written as the file
has it, others are left alone. The shapes and decisions are libs/common/storages.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import yaml
from aiohttp import web
from nats.js.kv import KeyValue

from libs.common import storages as core
from libs.common.bus import Bus, all_keys, get_json
from libs.common.errors import BadInput, Conflict, Forbidden, NoStorage
from libs.common.protocol.model import JobSpec
from libs.common.service import ServiceContext
from libs.common.storages import Storage
from libs.common.subjects import Bucket
from services.rest.identity import core as identity_core, store as identity_store
from services.rest.identity.core import Principal
from services.rest.request import USER, ctx_of, read_json_object

log = logging.getLogger("pai.rest.storages")
KEY_PREFIX = "storage."
UPDATE_ATTEMPTS = 10


def storage_key(name: str) -> str:
    return f"{KEY_PREFIX}{name}"


async def _kv(bus: Bus) -> KeyValue:
    return await bus.kv(Bucket.USERS)


async def get_storage(bus: Bus, name: str) -> tuple[Storage, int] | None:
    try:
        core.check_storage_name(name)
    except BadInput:
        return None
    return await get_json(await _kv(bus), storage_key(name), Storage)


async def all_storages(bus: Bus) -> dict[str, Storage]:
    kv = await _kv(bus)
    keys = await all_keys(kv, KEY_PREFIX)
    got = await asyncio.gather(*(get_json(kv, key, Storage) for key in keys))
    return {s.name: s for s, _ in (g for g in got if g is not None)}


async def put_storage(bus: Bus, storage: Storage) -> bool:
    """Declare or replace; True when it was new. Retried at the revision read on a race."""
    kv = await _kv(bus)
    value = msgspec.json.encode(storage)
    for _ in range(UPDATE_ATTEMPTS):
        current = await get_json(kv, storage_key(storage.name), Storage)
        try:
            if current is None:
                await kv.create(storage_key(storage.name), value)
                return True
            if current[0] != storage:
                await kv.update(storage_key(storage.name), value, last=current[1])
            return False
        except nats.js.errors.KeyWrongLastSequenceError:
            continue
    raise Conflict(f"storage {storage.name} is being changed by someone else; try again")


async def delete_storage(bus: Bus, name: str) -> None:
    got = await get_storage(bus, name)
    if got is None:
        raise NoStorage(f"storage {name[:64]} is not declared")
    try:
        await (await _kv(bus)).delete(storage_key(name), last=got[1])
    except nats.js.errors.KeyWrongLastSequenceError:
        raise Conflict(f"storage {name} was changed while being deleted; try again") from None


async def granted(bus: Bus, caller: Principal) -> frozenset[str] | None:
    """The storages the caller's groups grant; None for an admin (every storage)."""
    if caller.admin:
        return None
    groups = await identity_store.groups_named(bus, caller.grouplist)
    return core.granted_names(g.extension.acls.storageConfigs for g in groups.values())


async def with_storages(bus: Bus, caller: Principal, spec: JobSpec) -> JobSpec:
    """The spec with the declarations of the storages it mounts; 404/403 naming a storage
    that is not declared or not granted (libs/common/storages.py: resolve_for_job)."""
    if spec.storageConfigNames is None and not spec.storageRequests:
        return spec
    mounted = core.resolve_for_job(spec.storageConfigNames, await all_storages(bus), await granted(bus, caller),
                                   asks=spec.storageRequests, user=spec.user)
    return msgspec.structs.replace(spec, storages=mounted)


# --- routes --------------------------------------------------------------------------------------


async def list_storages(request: web.Request) -> web.Response:
    bus = ctx_of(request).bus
    shown = core.visible((await all_storages(bus)).values(), await granted(bus, request[USER]))
    return web.json_response({"storages": [core.summary(s) for s in shown]})


async def readable(request: web.Request, name: str) -> Storage:
    """One storage the caller may read: 404 when none is declared, 403 when their groups do not grant it."""
    bus = ctx_of(request).bus
    got = await get_storage(bus, name)
    if got is None:
        raise NoStorage(f"storage {name[:64]} is not found")
    allowed = await granted(bus, request[USER])
    if allowed is not None and name not in allowed:
        raise Forbidden(f"user {request[USER].username} is not allowed to access {name}")
    return got[0]


async def get_one(request: web.Request) -> web.Response:
    return web.json_response(core.detail(await readable(request, request.match_info["name"])))


def _legacy(shape: Callable[[Storage], dict[str, Any]]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """OpenPAI's deprecated `/storage/config` and `/storage/server` reads of the same declarations
    (libs/common/storages.py: legacy_config, legacy_server): one by name, or a list of those the
    caller may read, `?names=` (repeated, or `names[]=` as OpenPAI's SDK writes arrays) picking some."""

    async def answer(request: web.Request) -> web.Response:
        if "name" in request.match_info:
            return web.json_response(shape(await readable(request, request.match_info["name"])))
        bus = ctx_of(request).bus
        shown = core.visible((await all_storages(bus)).values(), await granted(bus, request[USER]))
        names = {n for key in ("names", "names[]") for n in request.query.getall(key, []) if n}
        return web.json_response([shape(s) for s in shown if not names or s.name in names])

    return answer


async def put_one(request: web.Request) -> web.Response:
    identity_core.require(request[USER], identity_core.Action.MANAGE_STORAGES)
    name = request.match_info["name"]
    core.check_storage_name(name)
    example = '{"type": "hostPath", "data": {"path": "/srv/pai-storage/team"}}'
    raw = await read_json_object(request, what="the storage", example=example)
    if raw.setdefault("name", name) != name:
        raise BadInput(f"name: the body names {str(raw['name'])[:64]!r}, the path {name!r}")
    storage = core.decode_storage(raw)
    created = await put_storage(ctx_of(request).bus, storage)
    log.info("storage %s %s by %s", name, "declared" if created else "changed", request[USER].username)
    return web.json_response(core.detail(storage), status=201 if created else 200)


async def delete_one(request: web.Request) -> web.Response:
    identity_core.require(request[USER], identity_core.Action.MANAGE_STORAGES)
    name = request.match_info["name"]
    await delete_storage(ctx_of(request).bus, name)
    return web.json_response({"message": f"storage {name} deleted"})


routes = [
    web.get("/api/v2/storages", list_storages),
    web.get("/api/v2/storages/{name}", get_one),
    web.put("/api/v2/storages/{name}", put_one),
    web.delete("/api/v2/storages/{name}", delete_one),
    # OpenPAI's deprecated routes (reads only, as OpenPAI has them), from the same declarations
    web.get("/api/v2/storage/config", _legacy(core.legacy_config)),
    web.get("/api/v2/storage/config/{name}", _legacy(core.legacy_config)),
    web.get("/api/v2/storage/server", _legacy(core.legacy_server)),
    web.get("/api/v2/storage/server/{name}", _legacy(core.legacy_server)),
]


async def seed(ctx: ServiceContext) -> None:
    """The storages of `storages_file`, declared as the file has them."""
    path = ctx.config.storages_file
    if not path:
        return
    try:
        raw = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"storages_file {path}: {exc}") from None
    for storage in core.parse_storages_file(raw, f"storages_file {path}"):
        if await put_storage(ctx.bus, storage):
            log.info("declared storage %s (%s) from %s", storage.name, storage.type, path)
