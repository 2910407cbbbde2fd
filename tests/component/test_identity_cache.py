"""Who a token is, remembered by each rest replica, and forgotten in time: two rest
replicas on one real nats-server; a change made through one holds on the same one
for the next request and on the other within the watch's delivery, well before the
cache's own age limit (set to an hour here, so only the watch can make it forget)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.service import ServiceContext
from services.rest import auth
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
ADMIN = f"cacheadmin{RUN}"
PASSWORD = "correct horse battery"
# How long the other replica may take to hear of a change on a loaded machine; the
# watch normally delivers in milliseconds.
WATCH_SLACK_SECONDS = 10.0


class Replica:
    def __init__(self, server: TestServer, session: ClientSession):
        self.server, self.session = server, session

    @property
    def cache(self):
        return self.server.app[auth.PRINCIPALS]

    async def call(self, token: str | None, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.server.make_url(path), data=data, headers=headers) as resp:
            return resp.status, json.loads(await resp.read())

    async def until_status(self, token: str, path: str, wanted: int) -> float:
        """Seconds until `path` answers `wanted` (fails after WATCH_SLACK_SECONDS)."""
        began = time.monotonic()
        while True:
            status, body = await self.call(token, "GET", path)
            if status == wanted:
                return time.monotonic() - began
            assert time.monotonic() - began < WATCH_SLACK_SECONDS, (status, body)
            await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
async def replicas(nats_server, tmp_path_factory) -> AsyncIterator[tuple[Replica, Replica, str]]:
    platform = await Bus.connect(nats_server.url, name="cache-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("identity-cache")), admin_user=ADMIN)
    buses, servers = [], []
    for n in range(2):
        bus = await Bus.connect(nats_server.url, name=f"cache-rest-{n}", **nats_server.login("rest"))
        ctx = ServiceContext(name="rest", config=config, bus=bus)
        if n == 0:
            await startup(ctx)
        server = TestServer(await create_app(ctx))
        await server.start_server()
        ctx.set_ready()
        server.app[auth.PRINCIPALS].max_age = 3600.0
        buses.append(bus)
        servers.append(server)
    admin = config.token_path.read_text().strip()
    async with ClientSession() as session:
        one, other = Replica(servers[0], session), Replica(servers[1], session)
        for replica in (one, other):  # each watch running before the tests change anything
            deadline = time.monotonic() + WATCH_SLACK_SECONDS
            while not replica.cache.watching:
                assert time.monotonic() < deadline, "the pai_users watch did not start"
                await asyncio.sleep(0.05)
        yield one, other, admin
    for server in servers:
        await server.close()
    for bus in buses:
        await bus.close()
    await platform.close()


async def signed_in_user(one: Replica, admin: str, **fields: Any) -> tuple[str, str]:
    name = f"cached{RUN}{uuid.uuid4().hex[:4]}"
    status, body = await one.call(admin, "POST", "/api/v2/users", {"username": name, "password": PASSWORD, **fields})
    assert status == 201, body
    status, body = await one.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})
    assert status == 200, body
    return name, body["token"]


async def used_on_both(one: Replica, other: Replica, token: str) -> None:
    for replica in (one, other):
        for _ in range(2):  # the second call is served from the cache
            assert (await replica.call(token, "GET", "/api/v2/users/me"))[0] == 200
        assert len(replica.cache) > 0


async def test_a_logout_holds_at_once_here_and_within_the_watch_on_the_other_replica(replicas):
    one, other, admin = replicas
    _, token = await signed_in_user(one, admin)
    await used_on_both(one, other, token)
    assert (await one.call(token, "DELETE", "/api/v2/authn/basic/logout"))[0] == 200
    status, body = await one.call(token, "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError")
    await other.until_status(token, "/api/v2/users/me", 401)


async def test_a_revoked_application_token_stops_on_both_replicas(replicas):
    one, other, admin = replicas
    _, session = await signed_in_user(one, admin)
    status, made = await one.call(session, "POST", "/api/v2/tokens", {"expiration": 3600})
    assert status == 201
    await used_on_both(one, other, made["token"])
    assert (await other.call(session, "DELETE", f"/api/v2/tokens/{made['id']}"))[0] == 200
    assert (await other.call(made["token"], "GET", "/api/v2/users/me"))[0] == 401
    await one.until_status(made["token"], "/api/v2/users/me", 401)
    assert (await one.call(session, "GET", "/api/v2/users/me"))[0] == 200  # the other token stays


async def test_a_deleted_user_is_signed_out_on_both_replicas(replicas):
    one, other, admin = replicas
    name, token = await signed_in_user(one, admin)
    await used_on_both(one, other, token)
    assert (await one.call(admin, "DELETE", f"/api/v2/users/{name}"))[0] == 200
    assert (await one.call(token, "GET", "/api/v2/users/me"))[0] == 401
    await other.until_status(token, "/api/v2/users/me", 401)


async def test_a_group_losing_admin_rights_takes_them_from_its_members_on_both_replicas(replicas):
    one, other, admin = replicas
    group = f"ops{RUN}"
    status, body = await one.call(admin, "POST", "/api/v2/groups",
                                  {"groupname": group, "extension": {"acls": {"admin": True}}})
    assert status == 201, body
    _, token = await signed_in_user(one, admin, grouplist=["default", group])
    for replica in (one, other):
        assert (await replica.call(token, "GET", "/api/v2/users"))[0] == 200  # an admin's list
    status, body = await one.call(admin, "PUT", f"/api/v2/groups/{group}", {"extension": {"acls": {"admin": False}}})
    assert status == 200, body
    status, body = await one.call(token, "GET", "/api/v2/users")
    assert (status, body["code"]) == (403, "ForbiddenUserError")
    await other.until_status(token, "/api/v2/users", 403)


async def test_an_expired_token_is_refused_though_remembered(replicas):
    one, other, admin = replicas
    name, _ = await signed_in_user(one, admin)
    status, body = await one.call(None, "POST", "/api/v2/authn/basic/login",
                                  {"username": name, "password": PASSWORD, "expiration": 1})
    short = body["token"]
    await used_on_both(one, other, short)
    await asyncio.sleep(1.2)
    for replica in (one, other):
        status, body = await replica.call(short, "GET", "/api/v2/users/me")
        assert (status, body["code"]) == (401, "UnauthorizedUserError")
