"""A user's default for job status mail (the profile's Notifications: extension.
jobStatusChangeNotification, services/rest/notify_default.py), through rest's API on a
real nats-server: a job that does not say follows it as it is at submission; a job's own
setting wins; a value PAI cannot read means nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus, get_json
from libs.common.config import load_config
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.app import create_app, startup
from services.rest.records import SubmittedJob
from tests.component.test_identity import Api
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
JOB = "protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  a:\n    instances: 1\n    commands: [train]\n"


@pytest.fixture(scope="module")
async def setup(nats_server, tmp_path_factory) -> AsyncIterator[tuple[Api, Bus, str, str]]:
    platform = await Bus.connect(nats_server.url, name="notify-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    bus = await Bus.connect(nats_server.url, name="notify-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("notify")), admin_user=f"nadmin{RUN}")
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        api = Api(server, session)
        admin = config.token_path.read_text().strip()
        name = await api.new_user(admin, username=f"nuser{RUN}")
        yield api, bus, name, await api.login(name)
    await server.close()
    await bus.close()
    await platform.close()


async def _submitted(api: Api, bus: Bus, token: str, user: str, job: str, extra: str = "") -> tuple[bool, list[str]]:
    status, body = await api.call(token, "POST", "/api/v2/jobs", JOB.format(name=job) + extra, content_type="text/yaml")
    assert status == 202, body
    got = await get_json(await bus.kv(Bucket.JOBS), ids.job_key(ids.job_id(user, job)), SubmittedJob)
    assert got is not None
    return got[0].spec.notifyOnStateChange, got[0].spec.notifyStates


async def _set(api: Api, token: str, user: str, value: object) -> None:
    status, body = await api.call(token, "PUT", f"/api/v2/users/{user}/extension",
                                  {"extension": {"jobStatusChangeNotification": value}})
    assert status == 201, body


async def test_a_job_that_does_not_say_follows_the_users_default(setup):
    api, bus, user, token = setup
    assert await _submitted(api, bus, token, user, "before") == (False, [])
    await _set(api, token, user, {"failed": True, "Succeeded": True, "running": False, "nonsense": True})
    assert await _submitted(api, bus, token, user, "chosen") == (True, ["failed", "succeeded"])
    # The job's own setting wins, even `false`.
    assert await _submitted(api, bus, token, user, "own", "extras:\n  jobStatusChangeNotification: false\n") == (False, [])
    assert await _submitted(api, bus, token, user, "own-states", "extras:\n  jobStatusChangeNotification: {stopped: true}\n") \
        == (True, ["stopped"])
    await _set(api, token, user, True)  # every state the monitor mails by default
    assert await _submitted(api, bus, token, user, "all") == (True, [])
    await _set(api, token, user, "yes please")  # not a setting PAI reads: nothing
    assert await _submitted(api, bus, token, user, "unread") == (False, [])
    await _set(api, token, user, False)
    assert await _submitted(api, bus, token, user, "switched-off") == (False, [])
