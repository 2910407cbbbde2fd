"""What the Helm chart relies on at a service's start, against a real nats-server:

- a single-active service's standby is ready as Kubernetes reads it (/readyz 200,
  "standby") while the leader answers "ready": under `helm install --wait`, Argo CD
  and Flux a never-ready standby kept the release from ever finishing;
- the admin token the chart keeps in a Secret (mounted where admin_token_file
  points) is the admin's: rest registers it, on every replica's start, and makes
  none of its own."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.service import ServiceContext, health_routes, hold_leadership
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV

pytestmark = pytest.mark.timeout(60)
RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
async def platform(nats_server):
    bus = await Bus.connect(nats_server.url, name="chart-platform", **nats_server.login("platform"))
    await bus.bootstrap()
    yield bus
    await bus.close()


async def readyz(ctx: ServiceContext) -> tuple[int, str]:
    app = web.Application()
    app.add_routes(health_routes(lambda: ctx))
    async with TestServer(app) as server, ClientSession() as session:
        async with session.get(server.make_url("/readyz")) as resp:
            return resp.status, (await resp.json())["status"]


async def test_a_standby_is_ready_and_says_it_stands_by(nats_server, platform, tmp_path: Path) -> None:
    name = f"scheduler{RUN}"
    contexts = []
    for replica in ("a", "b"):
        bus = await Bus.connect(nats_server.url, name=f"{name}-{replica}", **nats_server.login("scheduler"))
        config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path / replica), replica=replica)
        contexts.append(ServiceContext(name="scheduler", config=config, bus=bus))
    leader, standby = contexts
    try:
        await hold_leadership(leader)
        leader.set_ready()
        waiting = asyncio.ensure_future(hold_leadership(standby))
        for _ in range(100):
            if standby.standby:
                break
            await asyncio.sleep(0.05)
        assert await readyz(leader) == (200, "ready")
        assert await readyz(standby) == (200, "standby")
        assert not waiting.done()  # still waiting for the lease: not leading
        waiting.cancel()
    finally:
        for ctx in contexts:
            ctx.stopping.set()
            for task in ctx.tasks:
                task.cancel()
            await ctx.bus.close()


async def start_rest(nats_server, data_dir: Path, token_file: Path, admin: str) -> ServiceContext:
    bus = await Bus.connect(nats_server.url, name="chart-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(data_dir), admin_user=admin,
                         admin_token_file=str(token_file))
    return ServiceContext(name="rest", config=config, bus=bus)


async def test_the_admin_token_from_the_secret_is_registered_and_none_is_made(nats_server, platform,
                                                                              tmp_path: Path) -> None:
    admin = f"chartadmin{RUN}"
    token = f"{admin}.{uuid.uuid4().hex}{uuid.uuid4().hex}"
    secret = tmp_path / "secret" / "token"  # as the chart mounts the Secret: read-only, there before rest
    secret.parent.mkdir()
    secret.write_text(token + "\n")
    secret.chmod(0o400)
    replicas = [await start_rest(nats_server, tmp_path / f"rest{i}", secret, admin) for i in range(2)]
    try:
        await asyncio.gather(*(startup(ctx) for ctx in replicas))  # two replicas starting at once
        assert secret.read_text() == token + "\n"
        server = TestServer(await create_app(replicas[0]))
        await server.start_server()
        replicas[0].set_ready()
        async with ClientSession() as session:
            async with session.get(server.make_url(f"/api/v2/users/{admin}"),
                                   headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["admin"] is True
            async with session.get(server.make_url("/api/v2/tokens"), headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 200, await resp.text()
                assert len((await resp.json())["tokens"]) == 1  # the Secret's: rest made none of its own
        await server.close()
        await startup(replicas[1])  # a restart registers nothing more
    finally:
        for ctx in replicas:
            await ctx.bus.close()


async def test_a_token_of_another_user_in_the_secret_is_refused_naming_the_setting(nats_server, platform,
                                                                                  tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("someoneelse.abcdef\n")
    ctx = await start_rest(nats_server, tmp_path / "rest", secret, f"chartadmin2{RUN}")
    try:
        with pytest.raises(ValueError, match="admin_token_file"):
            await startup(ctx)
    finally:
        await ctx.bus.close()
