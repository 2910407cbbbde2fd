"""User names are unique whatever their case, and a 507 to POST /api/v2/users means
nothing of the user was kept; rest against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.js.errors
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.busauth import load_or_create_credentials
from libs.common.config import Config, load_config
from libs.common.jetstream_limits import StoreLimits, store_settings
from libs.common.natsserver import NatsServer
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
PASSWORD = "correct horse battery"
USERS_BUCKET_BYTES = 24 * 1024
FILLER_BYTES = 2048


class Api:
    def __init__(self, server: TestServer, session: ClientSession):
        self.server, self.session = server, session

    async def call(self, token: str | None, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session.request(method, self.server.make_url(path), json=body, headers=headers) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("nats-users")
    base = store_settings(Config())
    settings = msgspec.structs.replace(base, buckets={**base.buckets, Bucket.USERS: StoreLimits(max_bytes=USERS_BUCKET_BYTES)})
    with NatsServer(root / "store", auth=load_or_create_credentials(root / "nats-credentials.json")) as srv:
        srv.bootstrap(settings)
        yield srv


@pytest.fixture
async def rest(small_store, tmp_path) -> AsyncIterator[tuple[Api, Bus, Bus]]:
    bus = await Bus.connect(small_store.url, name="rest", **small_store.login("rest"))
    admin_bus = await Bus.connect(small_store.url, name="test-admin", **small_store.login("platform"))
    ctx = ServiceContext(name="rest", config=load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path)), bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        yield Api(server, session), bus, admin_bus
    await server.close()
    await admin_bus.js.purge_stream(f"KV_{Bucket.USERS.value}")
    await admin_bus.close()
    await bus.close()


async def test_user_names_differing_only_in_case_are_one_name(rest) -> None:
    api, bus, _ = rest
    admin = await auth.create_user(bus, f"admin{RUN}", admin=True)
    first = f"Alice{RUN}"
    status, body = await api.call(admin, "POST", "/api/v2/users", {"username": first, "password": PASSWORD})
    assert status == 201, body
    for other in (first.lower(), first.upper()):
        status, body = await api.call(admin, "POST", "/api/v2/users", {"username": other, "password": PASSWORD})
        assert (status, body["code"]) == (409, "ConflictUserError"), body
        assert first in body["message"], "the 409 names the user who has the name"
    # Signing in with another case is signing in as that user.
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login",
                                  {"username": first.lower(), "password": PASSWORD})
    assert (status, body["user"]) == (200, first), body
    # Two creations of one name in two cases at once: one of them gets it.
    pair = (f"Bob{RUN}", f"bOB{RUN}")
    answers = await asyncio.gather(*(api.call(admin, "POST", "/api/v2/users", {"username": n, "password": PASSWORD})
                                     for n in pair))
    assert sorted(status for status, _ in answers) == [201, 409], answers
    listed = (await api.call(admin, "GET", "/api/v2/users"))[1]
    assert sum(1 for u in listed if u["username"].lower() == pair[0].lower()) == 1
    # A deleted user's name is free again, in any case.
    assert (await api.call(admin, "DELETE", f"/api/v2/users/{first}"))[0] == 200
    status, body = await api.call(admin, "POST", "/api/v2/users", {"username": first.lower(), "password": PASSWORD})
    assert status == 201, body


async def _fill(admin_bus: Bus) -> None:
    """Fill the users bucket until it refuses, then free one filler's room exactly
    (a stream purge writes nothing)."""
    kv = await admin_bus.kv(Bucket.USERS)
    n = 0
    for size in (FILLER_BYTES, 64):
        while True:
            try:
                await kv.put(f"filler.{size}.{n}", b"x" * size)
                n += 1
            except nats.js.errors.APIError:
                break
    await admin_bus.js.purge_stream(f"KV_{Bucket.USERS.value}", subject=f"$KV.{Bucket.USERS.value}.filler.{FILLER_BYTES}.0")


async def test_a_507_to_a_new_user_means_the_user_was_not_stored(rest) -> None:
    """Across the sizes where the user's record fits the room left and its first token
    does not: a 507 leaves no user behind; a 201 is a user that exists."""
    api, bus, admin_bus = rest
    seen = set()
    for step, extension in enumerate(range(FILLER_BYTES - 1200, FILLER_BYTES - 100, 40)):
        await admin_bus.js.purge_stream(f"KV_{Bucket.USERS.value}")
        admin = await auth.create_user(bus, f"root{RUN}{step}", admin=True)
        await _fill(admin_bus)
        name = f"u{RUN}{step}"
        status, body = await api.call(admin, "POST", "/api/v2/users",
                                      {"username": name, "extension": {"pad": "p" * extension}})
        seen.add(status)
        got = await api.call(admin, "GET", f"/api/v2/users/{name}")
        if status == 507:
            assert "nothing was stored" in body["message"], body
            assert got[0] == 404, f"a 507 left the user {name} stored (extension {extension})"
        else:
            assert status == 201, body
            assert got[0] == 200
            if body["token"] is None:
                assert "was created" in body["warnings"][0]
            else:
                assert (await api.call(body["token"], "GET", "/api/v2/users/me"))[0] == 200
    assert seen == {201, 507}, f"the sizes tried must cross the bucket's limit: {seen}"
