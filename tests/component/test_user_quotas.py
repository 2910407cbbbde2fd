"""Per-user quotas against a real nats-server with a small job bucket: one user who
fills their quota is refused with the limit named (507 or 429, with what to do), and
another user still submits; tokens past the limit are refused, sign-ins end the
oldest sign-in instead."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
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
from services.rest import auth, jobs_api
from services.rest.app import create_app
from services.rest.identity import store
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
_names = iter(range(10_000))
JOBS_BUCKET_BYTES = 256 * 1024
USER_JOB_BYTES = 96 * 1024  # what one user may keep: well under the bucket
EXTRAS_BYTES = 10 * 1024


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("nats-quotas")
    base = store_settings(Config())
    settings = msgspec.structs.replace(base, buckets={**base.buckets, Bucket.JOBS: StoreLimits(max_bytes=JOBS_BUCKET_BYTES)})
    with NatsServer(root / "store", auth=load_or_create_credentials(root / "nats-credentials.json")) as srv:
        srv.bootstrap(settings)
        yield srv


def job_body(name: str, extras_bytes: int = 0) -> bytes:
    extras = f"extras:\n  blob: {'x' * extras_bytes}\n" if extras_bytes else ""
    return (f"protocolVersion: 2\nname: {name}\ntype: job\n{extras}taskRoles:\n  main:\n    instances: 1\n"
            "    commands:\n      - echo hi\n").encode()


class Api:
    def __init__(self, server: TestServer, session: ClientSession):
        self.server, self.session = server, session

    async def call(self, method: str, path: str, token: str, data: Any = None, json_body: Any = None
                   ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        if data is not None:
            headers["Content-Type"] = "text/yaml"
        async with self.session.request(method, self.server.make_url(path), data=data, json=json_body,
                                        headers=headers) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None

    async def submit(self, token: str, name: str, extras_bytes: int = 0) -> tuple[int, Any]:
        return await self.call("POST", "/api/v2/jobs", token, data=job_body(name, extras_bytes))


@pytest.fixture
async def rest(small_store, tmp_path, request) -> AsyncIterator[tuple[Api, Bus, Any]]:
    limits = getattr(request, "param", {})
    bus = await Bus.connect(small_store.url, name="rest", **small_store.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path), **limits)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    app = await create_app(ctx)
    server = TestServer(app)
    await server.start_server()
    ctx.set_ready()
    for _ in range(200):  # the byte quota is counted by the job index
        if app[jobs_api.INDEX].ready:
            break
        await asyncio.sleep(0.05)
    async with ClientSession() as session:
        yield Api(server, session), bus, app
    await server.close()
    admin = await Bus.connect(small_store.url, name="test-admin", **small_store.login("platform"))
    await admin.js.purge_stream(f"KV_{Bucket.JOBS.value}")
    await admin.close()
    await bus.close()


async def new_user(bus: Bus) -> tuple[str, str]:
    name = f"q{RUN}{next(_names)}"
    return name, await auth.create_user(bus, name)


def assert_names_limit(status: int, body: dict, expected_status: int, limit: str, value: int) -> None:
    assert status == expected_status, body
    assert body["details"]["limit"] == limit, body
    assert body["details"]["value"] == value, body
    assert limit in body["message"] or str(value) in body["message"], body
    assert body["details"]["remedy"], body


@pytest.mark.parametrize("rest", [{"rest_user_max_job_bytes": USER_JOB_BYTES}], indirect=True)
async def test_a_user_who_fills_their_job_bytes_is_refused_by_name_while_another_still_submits(rest) -> None:
    api, bus, _ = rest
    alice, alice_token = await new_user(bus)
    bob, bob_token = await new_user(bus)
    accepted = 0
    for n in range(40):  # more than the bucket could take: the quota must stop alice first
        status, body = await api.submit(alice_token, f"big{n}", EXTRAS_BYTES)
        if status != 202:
            break
        accepted += 1
    assert 0 < accepted < 40
    assert_names_limit(status, body, 507, "rest_user_max_job_bytes", USER_JOB_BYTES)
    assert "delete finished jobs" in body["message"]
    assert body["code"] == "QuotaExceededError"
    # The store has room left for everyone else.
    for n in range(3):
        status, body = await api.submit(bob_token, f"small{n}", EXTRAS_BYTES)
        assert status == 202, body
    listed = await api.call("GET", f"/api/v2/jobs?username={alice}", alice_token)
    assert len(listed[1]) == accepted, "a refused submission is not stored"
    assert bob


@pytest.mark.parametrize("rest", [{"rest_user_max_jobs": 3}], indirect=True)
async def test_a_user_past_their_stored_jobs_is_refused_with_the_limit_named(rest) -> None:
    api, bus, _ = rest
    _, alice_token = await new_user(bus)
    _, bob_token = await new_user(bus)
    for n in range(3):
        assert (await api.submit(alice_token, f"j{n}"))[0] == 202
    status, body = await api.submit(alice_token, "j3")
    assert_names_limit(status, body, 507, "rest_user_max_jobs", 3)
    assert body["details"]["used"] == 3
    # Nothing runs them here: all three wait, so deleting finished jobs would free nothing.
    assert "(0 finished)" in body["message"], body
    assert "pai stop" in body["details"]["remedy"], body
    assert (await api.submit(bob_token, "j0"))[0] == 202


@pytest.mark.parametrize("rest", [{"rest_user_max_submissions_in_flight": 1}], indirect=True)
async def test_a_second_submission_in_flight_past_the_limit_is_429(rest) -> None:
    api, bus, _ = rest
    _, alice_token = await new_user(bus)
    _, bob_token = await new_user(bus)
    release = asyncio.Event()

    async def slow_body():  # holds alice's one slot while its body trickles in
        body = job_body("slow")
        yield body[:10]
        await release.wait()
        yield body[10:]

    slow = asyncio.ensure_future(api.call("POST", "/api/v2/jobs", alice_token, data=slow_body()))
    await asyncio.sleep(0.3)
    status, body = await api.submit(alice_token, "quick")
    assert_names_limit(status, body, 429, "rest_user_max_submissions_in_flight", 1)
    assert (await api.submit(bob_token, "quick"))[0] == 202, "another user's slot is their own"
    release.set()
    assert (await slow)[0] == 202
    assert (await api.submit(alice_token, "quick"))[0] == 202, "the slot is free once answered"


@pytest.mark.parametrize("rest", [{"rest_user_max_tokens": 3}], indirect=True)
async def test_tokens_past_the_limit_are_refused_and_sign_ins_end_the_oldest(rest) -> None:
    api, bus, _ = rest
    name = f"t{RUN}{next(_names)}"
    token = await auth.create_user(bus, name)  # one token: the user's own
    password_hash = await store.hash_password("a-long-password")
    await store.change_user(bus, name, lambda u: msgspec.structs.replace(u, passwordHash=password_hash))
    made = []
    for _ in range(2):
        status, body = await api.call("POST", "/api/v2/tokens", token, json_body={"description": "ci"})
        assert status == 201, body
        made.append(body["token"])
    status, body = await api.call("POST", "/api/v2/tokens", token, json_body={"description": "ci"})
    assert_names_limit(status, body, 507, "rest_user_max_tokens", 3)
    assert "revoke tokens" in body["message"]
    # Revoking one makes room again.
    assert (await api.call("DELETE", f"/api/v2/tokens/{made[0]}", token))[0] == 200
    assert (await api.call("POST", "/api/v2/tokens", token, json_body={}))[0] == 201
    # Sign-ins past the limit refuse nothing and store nothing more: with every
    # token an application one, a sign-in is refused by name.
    async with api.session.post(api.server.make_url("/api/v2/authn/basic/login"),
                                json={"username": name, "password": "a-long-password"}) as resp:
        assert resp.status == 507, await resp.text()
        assert (await resp.json())["details"]["limit"] == "rest_user_max_tokens"
    # Once there is a sign-in to end, the next sign-in ends it: logins never lock a user out.
    assert (await api.call("DELETE", f"/api/v2/tokens/{made[1]}", token))[0] == 200
    logins = []
    for _ in range(3):
        async with api.session.post(api.server.make_url("/api/v2/authn/basic/login"),
                                    json={"username": name, "password": "a-long-password"}) as resp:
            assert resp.status == 200, await resp.text()
            logins.append((await resp.json())["token"])
    listed = await api.call("GET", "/api/v2/tokens", token)
    assert len(listed[1]["tokens"]) == 3
    assert (await api.call("GET", "/api/v2/users/me", logins[0]))[0] == 401, "the oldest sign-in was ended"
    assert (await api.call("GET", "/api/v2/users/me", logins[-1]))[0] == 200
