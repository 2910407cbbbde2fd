"""`pai login`, `pai watch JOB` and `pai logout` against rest over real HTTP (rest
and a launcher stand-in logged in to a real nats-server as themselves)."""

from __future__ import annotations

import asyncio
import json
import stat
import time
import uuid

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from cli.main import main
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.messages import JobState, JobStateChanged
from libs.common.service import ServiceContext
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
ADMIN, USER = f"cliadmin{RUN}", f"cliuser{RUN}"
PASSWORD = "watching passphrase"


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
async def rest(nats_server, tmp_path_factory):
    platform = await Bus.connect(nats_server.url, name="cli-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    bus = await Bus.connect(nats_server.url, name="cli-rest", **nats_server.login("rest"))
    launcher = await Bus.connect(nats_server.url, name="cli-launcher", **nats_server.login("launcher"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("cli-rest")), admin_user=ADMIN)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    admin = config.token_path.read_text().strip()
    async with ClientSession() as session:
        async with session.post(server.make_url("/api/v2/users"), json={"username": USER, "password": PASSWORD},
                                headers={"Authorization": f"Bearer {admin}"}) as resp:
            assert resp.status == 201
    yield str(server.make_url("")).rstrip("/"), launcher
    await server.close()
    for b in (launcher, bus, platform):
        await b.close()


def pai(*argv: str) -> int:
    return main(list(argv))


async def test_login_watch_logout(rest, tmp_path, monkeypatch, capsys):
    url, launcher = rest
    for name in ("PAI_URL", "PAI_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PAI_PASSWORD", PASSWORD)
    monkeypatch.setenv("COLUMNS", "200")  # one event, one line
    data = str(tmp_path / "cli")

    assert await asyncio.to_thread(pai, "--url", url, "--data-dir", data, "login", "--user", USER,
                                   "--password-from-env") == 0
    saved = tmp_path / "cli" / "cli.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    token = json.loads(saved.read_text())["token"]
    assert token.startswith(f"{USER}.")

    job = f"{USER}~watched"
    spec = "protocolVersion: 2\nname: watched\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo hi\n"
    async with ClientSession() as session:
        async with session.post(f"{url}/api/v2/jobs", data=spec, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "text/yaml"}) as resp:
            assert resp.status == 202
    capsys.readouterr()

    # The job was WAITING before `pai watch` started: it shows that too (history first).
    states = (JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED)
    await launcher.publish(JobStateChanged(id=f"{job}/1/state/WAITING", job=job, vc="default", user=USER, attempt=1,
                                           state=JobState.WAITING, at=time.time()))
    watching = asyncio.create_task(asyncio.to_thread(pai, "--data-dir", data, "watch", job))
    await asyncio.sleep(1.0)
    for previous, state in zip(states, states[1:], strict=False):
        await launcher.publish(JobStateChanged(id=f"{job}/1/state/{state.value}", job=job, vc="default", user=USER,
                                               attempt=1, state=state, previous=previous, at=time.time(),
                                               exitCode=0 if state == JobState.SUCCEEDED else None))
    assert await asyncio.wait_for(watching, 60) == 0  # ends with the job, 0 for SUCCEEDED
    lines = [line for line in capsys.readouterr().out.splitlines() if job in line]
    names = {s.value for s in JobState}
    assert [[w for w in line.split() if w in names][-1] for line in lines] == ["WAITING", "RUNNING", "SUCCEEDED"], lines
    assert "exit 0" in lines[-1]

    assert await asyncio.to_thread(pai, "--data-dir", data, "logout") == 0
    assert json.loads(saved.read_text())["token"] == ""
    async with ClientSession() as session:
        async with session.get(f"{url}/api/v2/users/me", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 401
