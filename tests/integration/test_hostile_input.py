"""Ordinary users trying to break the shared platform over HTTP: every attempt is a
clear 4xx (or 403 for another user's job), and afterwards the platform still
runs another user's normal job."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest

from cli.client import Client, Connection
from libs.common.protocol import limits
from tests.integration.conftest import job_yaml

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]


class User:
    def __init__(self, url: str, name: str, token: str):
        self.url, self.name, self.token = url, name, token
        self.client = Client(Connection(url=url, token=token))

    async def send(self, method: str, path: str, data: Any = None, content_type: str = "text/yaml"
                   ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.url + path, data=data, headers=headers) as resp:
                raw = await resp.read()
                try:
                    return resp.status, json.loads(raw)
                except ValueError:
                    return resp.status, raw.decode(errors="replace")


@pytest.fixture(scope="module")
async def users(platform) -> dict[str, User]:
    made = {"admin": User(platform.conn.url, "admin", platform.conn.token)}
    for who in ("bob", "carol"):
        name = f"{who}{RUN}"
        created = await platform.client.request("POST", "/api/v2/users", json_body={"username": name})
        made[who] = User(platform.conn.url, name, created["token"])
    return made


async def wait_final(user: User, job: str, timeout: float = 60.0) -> dict:
    for _ in range(int(timeout / 0.2)):
        detail = await user.client.request("GET", f"/api/v2/jobs/{job}")
        if detail["jobStatus"]["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            return detail
        await asyncio.sleep(0.2)
    raise AssertionError(f"{job} did not end in {timeout}s")


async def test_another_users_logs_config_and_attempts_are_403(users):
    bob, carol = users["bob"], users["carol"]
    name = f"private{RUN}"
    status, _ = await bob.send("POST", "/api/v2/jobs", job_yaml(name, ["echo only-for-bob"]))
    assert status == 202
    job = f"{bob.name}~{name}"
    assert (await wait_final(bob, job))["jobStatus"]["state"] == "SUCCEEDED"
    for path in ("logs", "config", "job-attempts"):
        status, body = await carol.send("GET", f"/api/v2/jobs/{job}/{path}")
        assert (status, body["code"]) == (403, "ForbiddenUserError"), path
        assert "only-for-bob" not in json.dumps(body)
    status, body = await carol.send("PUT", f"/api/v2/jobs/{job}/executionType", '{"value": "STOP"}',
                                    "application/json")
    assert (status, body["code"]) == (403, "ForbiddenUserError")
    status, log = await bob.send("GET", f"/api/v2/jobs/{job}/logs")
    assert status == 200 and "only-for-bob" in log
    status, log = await users["admin"].send("GET", f"/api/v2/jobs/{job}/logs")
    assert status == 200 and "only-for-bob" in log


async def test_a_chunked_job_sent_in_pieces_runs_all_its_commands(users):
    bob = users["bob"]
    name = f"pieces{RUN}"
    body = job_yaml(name, [f"echo piece-{i}" for i in range(8)]).encode()

    async def in_pieces():
        for start in range(0, len(body), 50):
            yield body[start:start + 50]
            await asyncio.sleep(0.05)

    status, reply = await bob.send("POST", "/api/v2/jobs", in_pieces())
    assert status == 202, reply
    job = f"{bob.name}~{name}"
    assert (await wait_final(bob, job))["jobStatus"]["state"] == "SUCCEEDED"
    status, log = await bob.send("GET", f"/api/v2/jobs/{job}/logs")
    assert log.split() == [f"piece-{i}" for i in range(8)]


def _over(limit: int) -> str:
    return f"at most {limit}"


async def test_hostile_requests_are_clear_4xx_and_other_users_jobs_still_run(users, platform):
    bob, carol, admin = users["bob"], users["carol"], users["admin"]

    async def two_mib():
        for _ in range(32):
            yield b"#" * (64 * 1024)

    attacks: list[tuple[str, User, str, str, Any, str, int, str]] = [
        # (what, who, method, path, body, content type, status, text the answer must hold)
        ("yaml nested 30,000 deep", bob, "POST", "/api/v2/jobs", "[" * 30_000 + "]" * 30_000, "text/yaml",
         400, f"more than {limits.MAX_NESTING_DEPTH} levels"),
        ("json nested 30,000 deep", bob, "POST", "/api/v2/jobs", '{"a": ' * 30_000 + "1" + "}" * 30_000,
         "application/json", 400, f"more than {limits.MAX_NESTING_DEPTH} levels"),
        ("instances: 1000000", bob, "POST", "/api/v2/jobs",
         job_yaml(f"huge{RUN}", ["true"]).replace("instances: 1", "instances: 1000000"), "text/yaml",
         400, _over(limits.MAX_INSTANCES_PER_ROLE)),
        ("a 241-character job name", bob, "POST", "/api/v2/jobs", job_yaml("n" * 241, ["true"]), "text/yaml",
         400, _over(limits.MAX_JOB_NAME_LENGTH)),
        ("jobRetryCount 10^30", bob, "POST", "/api/v2/jobs",
         job_yaml(f"retry{RUN}", ["true"]).replace("jobRetryCount: 0", "jobRetryCount: " + "1" + "0" * 30),
         "text/yaml", 400, _over(limits.MAX_JOB_RETRY_COUNT)),
        ("2 MiB chunked", bob, "POST", "/api/v2/jobs", two_mib(), "text/yaml", 413, str(limits.MAX_BODY_BYTES)),
        ("a 10,000-character username", admin, "POST", "/api/v2/users", json.dumps({"username": "u" * 10_000}),
         "application/json", 400, _over(limits.MAX_USERNAME_LENGTH)),
        ('"admin": "false"', admin, "POST", "/api/v2/users", json.dumps({"username": f"x{RUN}", "admin": "false"}),
         "application/json", 400, "admin"),
        ("a rule nested 20,000 deep", admin, "POST", "/api/v2/rules", "[" * 20_000 + "]" * 20_000, "text/yaml",
         400, f"more than {limits.MAX_NESTING_DEPTH} levels"),
        ("a non-admin changing rules", bob, "POST", "/api/v2/rules", "{}", "application/json", 403, "admin"),
    ]
    for what, who, method, path, body, content_type, status, text in attacks:
        got, reply = await who.send(method, path, body() if callable(body) else body, content_type)
        assert isinstance(reply, dict) and got == status, f"{what}: {got} {reply}"
        assert text in json.dumps(reply), f"{what}: {reply}"

    # No user x{RUN} was made an admin, nor made at all.
    status, _ = await admin.send("POST", "/api/v2/users", json.dumps({"username": f"x{RUN}"}), "application/json")
    assert status == 201
    # rest and its NATS connection are still there, and another user's job runs.
    async with aiohttp.ClientSession() as session:
        async with session.get(platform.conn.url + "/healthz") as resp:
            assert resp.status == 200
    name = f"normal{RUN}"
    status, _ = await carol.send("POST", "/api/v2/jobs", job_yaml(name, ["echo carol-ran"]))
    assert status == 202
    assert (await wait_final(carol, f"{carol.name}~{name}"))["jobStatus"]["state"] == "SUCCEEDED"
