"""rest against a real nats-server, as an attacker would use it: who may call what
(a matrix over every route), bodies that arrive in pieces, too large, too deep or
mistyped, the per-token rate limit, and health when the bus is gone for good.

The launcher's log replies and the runtime's rule replies come from small
stand-ins on their NATS subjects: these tests are about rest's answers.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.logs import LOG_SUBJECT, LogReply
from libs.common.protocol import JobSpec, limits
from libs.common.records import JobRecord
from libs.common.rules_rpc import RULES_SUBJECT, Outcome, RulesReply
from libs.common.service import BusClosed, ServiceContext, exit_when_bus_closed, health_routes
from libs.common.subjects import Bucket
from services.rest import auth
from services.rest.app import create_app
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
OWNER, OTHER, ADMIN = f"alice{RUN}", f"bob{RUN}", f"root{RUN}"
SECRET_OUTPUT = "the-owner-printed-this-s3cret"
RULE = {"code": 137, "phrase": "killed", "reaction": "NEVER_RETRY", "pattern": {"exitCode": 137}}


def job_yaml(name: str, commands: tuple[str, ...] = ("echo hi",)) -> str:
    lines = "".join(f"      - {json.dumps(c)}\n" for c in commands)
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            f"    commands:\n{lines}")


class Rest:
    """rest's API served in this process, with one token per kind of caller."""

    def __init__(self, server: TestServer, session: ClientSession, tokens: dict[str, str | None]):
        self.server = server
        self.session = session
        self.tokens = tokens

    async def call(self, who: str, method: str, path: str, *, body: bytes | None = None,
                   content_type: str = "application/json", headers: dict[str, str] | None = None
                   ) -> tuple[int, Any, dict]:
        sent = {"Content-Type": content_type, **(headers or {})}
        if self.tokens.get(who):
            sent["Authorization"] = f"Bearer {self.tokens[who]}"
        async with self.session.request(method, self.server.make_url(path), data=body, headers=sent) as resp:
            raw = await resp.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            return resp.status, parsed, dict(resp.headers)


async def _stand_ins(bus: Bus) -> list:
    """The launcher's log replies and the runtime's rule replies."""

    async def logs(msg):
        await msg.respond(msgspec.json.encode(LogReply(found=True, data=SECRET_OUTPUT.encode())))

    async def rules(msg):
        await msg.respond(msgspec.json.encode(RulesReply(outcome=Outcome.OK, rules=[RULE], position=0, revision=1)))

    return [await bus.nc.subscribe(LOG_SUBJECT, cb=logs), await bus.nc.subscribe(RULES_SUBJECT, cb=rules)]


@pytest.fixture(scope="module")
async def bus(nats_server) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_server.url, name="rest-security-test", **nats_server.login("platform"))
    await b.bootstrap()
    subscriptions = await _stand_ins(b)
    yield b
    for subscription in subscriptions:
        await subscription.unsubscribe()
    await b.close()


async def serve(bus: Bus, tmp_path, **settings: Any) -> tuple[TestServer, ServiceContext]:
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path), **settings)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    return server, ctx


@pytest.fixture(scope="module")
async def rest(bus, tmp_path_factory) -> AsyncIterator[Rest]:
    server, _ = await serve(bus, tmp_path_factory.mktemp("rest"))
    tokens: dict[str, str | None] = {"anonymous": None}
    for who, name, admin in (("owner", OWNER, False), ("other", OTHER, False), ("admin", ADMIN, True)):
        tokens[who] = await auth.create_user(bus, name, admin=admin)
    async with ClientSession() as session:
        api = Rest(server, session, tokens)
        status, body, _ = await api.call("owner", "POST", "/api/v2/jobs", body=job_yaml("secretjob").encode(),
                                         content_type="text/yaml")
        assert status == 202, body
        yield api
    await server.close()


# --- authorization: every route, four callers ------------------------------------------

JOB = f"{OWNER}~secretjob"
CALLERS = ("anonymous", "other", "owner", "admin")  # in this order: the owner's stop comes after the other's try
ANYONE, SIGNED_IN, OWNER_OR_ADMIN, ADMIN_ONLY = "anyone", "signed in", "owner or admin", "admin only"
_fresh = iter(range(10**6))


def _new_job(who: str) -> bytes:
    return job_yaml(f"job{who}{next(_fresh)}").encode()


def _new_user(_: str) -> bytes:
    return json.dumps({"username": f"u{RUN}{next(_fresh)}"}).encode()


# (method, route as registered) -> (who may, path to call, body for a caller, status when allowed)
MATRIX: dict[tuple[str, str], tuple[str, str, Any, int]] = {
    ("GET", "/healthz"): (ANYONE, "/healthz", None, 200),
    ("GET", "/readyz"): (ANYONE, "/readyz", None, 200),
    ("GET", "/metrics"): (ANYONE, "/metrics", None, 200),
    ("POST", "/api/v2/jobs"): (SIGNED_IN, "/api/v2/jobs", _new_job, 202),
    ("GET", "/api/v2/jobs"): (SIGNED_IN, "/api/v2/jobs", None, 200),
    ("GET", "/api/v2/jobs/{job}"): (SIGNED_IN, f"/api/v2/jobs/{JOB}", None, 200),
    ("GET", "/api/v2/jobs/{job}/config"): (OWNER_OR_ADMIN, f"/api/v2/jobs/{JOB}/config", None, 200),
    ("GET", "/api/v2/jobs/{job}/job-attempts"): (OWNER_OR_ADMIN, f"/api/v2/jobs/{JOB}/job-attempts", None, 200),
    ("GET", "/api/v2/jobs/{job}/logs"): (OWNER_OR_ADMIN, f"/api/v2/jobs/{JOB}/logs", None, 200),
    ("PUT", "/api/v2/jobs/{job}/executionType"): (OWNER_OR_ADMIN, f"/api/v2/jobs/{JOB}/executionType",
                                                  lambda _: b'{"value": "STOP"}', 202),
    ("GET", "/api/v2/virtual-clusters"): (SIGNED_IN, "/api/v2/virtual-clusters", None, 200),
    ("GET", "/api/v2/users/me"): (SIGNED_IN, "/api/v2/users/me", None, 200),
    ("POST", "/api/v2/users"): (ADMIN_ONLY, "/api/v2/users", _new_user, 201),
    ("GET", "/api/v2/rules"): (SIGNED_IN, "/api/v2/rules", None, 200),
    ("POST", "/api/v2/rules"): (ADMIN_ONLY, "/api/v2/rules", lambda _: json.dumps(RULE).encode(), 201),
    ("POST", "/api/v2/rules/reset"): (ADMIN_ONLY, "/api/v2/rules/reset", None, 200),
    ("GET", "/api/v2/rules/{code}"): (SIGNED_IN, "/api/v2/rules/137", None, 200),
    ("PUT", "/api/v2/rules/{code}"): (ADMIN_ONLY, "/api/v2/rules/137", lambda _: json.dumps(RULE).encode(), 200),
    ("DELETE", "/api/v2/rules/{code}"): (ADMIN_ONLY, "/api/v2/rules/137", None, 200),
}
ALLOWED = {
    ANYONE: set(CALLERS),
    SIGNED_IN: {"other", "owner", "admin"},
    OWNER_OR_ADMIN: {"owner", "admin"},
    ADMIN_ONLY: {"admin"},
}


def test_the_matrix_covers_every_route_rest_serves(rest):
    served = {(route.method, route.resource.canonical) for route in rest.server.app.router.routes()
              if route.method != "HEAD"}
    # Every route rest serves, the identity API's included, is in the full matrix of
    # tests/component/test_authz_matrix.py; these are the ones this module checks too.
    assert set(MATRIX) <= served


@pytest.mark.parametrize("route", list(MATRIX), ids=[f"{m} {p}" for m, p in MATRIX])
async def test_authorization_matrix(rest, route):
    who_may, path, body_for, allowed_status = MATRIX[route]
    answers = {}
    for caller in CALLERS:
        body = body_for(caller) if body_for else None
        status, reply, _ = await rest.call(caller, route[0], path, body=body,
                                           content_type="text/yaml" if route == ("POST", "/api/v2/jobs")
                                           else "application/json")
        if caller in ALLOWED[who_may]:
            expected = (allowed_status, None)
        elif caller == "anonymous":
            expected = (401, "UnauthorizedUserError")
        else:
            expected = (403, "ForbiddenUserError")
        code = reply.get("code") if isinstance(reply, dict) and status >= 400 else None
        answers[caller] = (status, code)
        assert (status, code) == expected, f"{caller}: {status} {reply}"
        if caller not in ALLOWED[who_may] and route[1].startswith("/api/v2/jobs/{job}"):
            assert SECRET_OUTPUT not in json.dumps(reply)


async def test_job_status_is_public_but_output_quoted_in_it_is_the_owners(rest, bus):
    """Diagnostics quote the job's output, which can show what its secrets printed."""
    sub = await bus.kv(Bucket.JOBS)
    entry = msgspec.json.decode((await sub.get(ids.job_key(JOB))).value)
    record = JobRecord(job=JOB, name="secretjob", user=OWNER, vc="default",
                       spec=msgspec.convert(entry["spec"], type=JobSpec),
                       appExitDiagnostics=[f"Traceback: token={SECRET_OUTPUT}"])
    await (await bus.kv(Bucket.JOB_STATUS)).put(ids.job_key(JOB), msgspec.json.encode(record))
    for who, sees in (("owner", True), ("admin", True), ("other", False)):
        status, detail, _ = await rest.call(who, "GET", f"/api/v2/jobs/{JOB}")
        assert status == 200 and detail["jobStatus"]["username"] == OWNER
        assert (SECRET_OUTPUT in json.dumps(detail)) is sees, who
    status, rows, _ = await rest.call("other", "GET", f"/api/v2/jobs?username={OWNER}")
    assert status == 200 and JOB in {r["debugId"] for r in rows} and SECRET_OUTPUT not in json.dumps(rows)


async def test_unknown_routes_and_methods_answer_json(rest):
    status, body, _ = await rest.call("owner", "GET", "/api/v2/nothing-here")
    assert (status, body["code"]) == (404, "NotFoundError")
    status, body, headers = await rest.call("owner", "PATCH", "/api/v2/jobs")
    assert (status, body["code"]) == (405, "MethodNotAllowed") and "POST" in headers["Allow"]


async def test_a_job_id_longer_than_any_name_is_404_without_asking_nats(rest):
    status, body, _ = await rest.call("owner", "GET", f"/api/v2/jobs/{'u' * 5_000}~x")  # past NATS' 4 KiB control line
    assert (status, body["code"]) == (404, "NoJobError")
    status, _, _ = await rest.call("owner", "GET", "/api/v2/users/me")
    assert status == 200  # the NATS connection is still there


# --- bodies ----------------------------------------------------------------------------


async def test_a_chunked_job_arriving_in_pieces_is_read_whole(rest):
    """One read returned only the first piece: the job ran with its first commands only."""
    commands = tuple(f"echo part {i}" for i in range(6))
    body = job_yaml(f"pieces{RUN}", commands).encode()
    pieces = [body[i:i + 40] for i in range(0, len(body), 40)]
    reader, writer = await asyncio.open_connection(rest.server.host, rest.server.port)
    writer.write(
        (f"POST /api/v2/jobs HTTP/1.1\r\nHost: pai\r\nAuthorization: Bearer {rest.tokens['owner']}\r\n"
         "Content-Type: text/yaml\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    )
    for piece in pieces:
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # each piece arrives on its own
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    response = await reader.read()
    writer.close()
    assert response.startswith(b"HTTP/1.1 202"), response[:300]
    status, config, _ = await rest.call("owner", "GET", f"/api/v2/jobs/{OWNER}~pieces{RUN}/config")
    assert status == 200 and config["taskRoles"]["main"]["commands"] == list(commands)


@pytest.mark.parametrize("path", ["/api/v2/jobs", "/api/v2/users", "/api/v2/rules"])
async def test_a_chunked_body_over_the_limit_is_413_naming_it(rest, path):
    async def two_mib():
        for _ in range(32):
            yield b"#" * (64 * 1024)
            await asyncio.sleep(0)

    headers = {"Authorization": f"Bearer {rest.tokens['admin']}", "Content-Type": "text/yaml"}
    async with rest.session.post(rest.server.make_url(path), data=two_mib(), headers=headers) as resp:
        body = await resp.json()
    limit = limits.MAX_BODY_BYTES if path == "/api/v2/jobs" else limits.MAX_ADMIN_BODY_BYTES
    assert (resp.status, body["code"]) == (413, "RequestEntityTooLarge")
    assert f"limit of {limit} bytes" in body["message"]


# 20,000 levels, under the 64 KiB of an admin body: a plain-text 500 (RecursionError) before.
DEEP_JSON = ("[" * 20_000 + "]" * 20_000).encode()
DEEP_YAML = ("{a: " * 12_000 + "1" + "}" * 12_000).encode()


@pytest.mark.parametrize(("method", "path", "body", "content_type"), [
    ("POST", "/api/v2/jobs", DEEP_YAML, "text/yaml"),
    ("POST", "/api/v2/jobs", DEEP_JSON, "application/json"),
    ("POST", "/api/v2/users", DEEP_JSON, "application/json"),
    ("PUT", f"/api/v2/jobs/{JOB}/executionType", DEEP_JSON, "application/json"),
    ("POST", "/api/v2/rules", DEEP_YAML, "text/yaml"),
    ("POST", "/api/v2/rules", DEEP_JSON, "application/json"),
    ("PUT", "/api/v2/rules/137", DEEP_YAML, "text/yaml"),
], ids=["job-yaml", "job-json", "user", "execution-type", "rule-yaml", "rule-json", "rule-change"])
async def test_deep_bodies_are_a_json_400_naming_the_depth(rest, method, path, body, content_type):
    status, reply, _ = await rest.call("admin", method, path, body=body, content_type=content_type)
    assert status == 400 and isinstance(reply, dict), reply
    assert reply["code"] in ("InvalidParametersError", "InvalidJobConfigError")
    assert f"more than {limits.MAX_NESTING_DEPTH} levels" in json.dumps(reply)


@pytest.mark.parametrize(("body", "path", "rule"), [
    ({"username": "x", "admin": "false"}, "admin", "type"),
    ({"username": "x", "admin": 1}, "admin", "type"),
    ({"username": "x", "admin": None}, "admin", "type"),
    ({"username": 5}, "username", "type"),
    ({"username": "x", "role": "admin"}, "$", "type"),
    ({"username": "u" * 10_000}, "username", "maxLength"),
    ({"username": "u" * (limits.MAX_USERNAME_LENGTH + 1)}, "username", "maxLength"),
    ({"username": "has.dot"}, "username", "pattern"),
    ({"username": "x", "email": "e" * 300}, "email", "maxLength"),
    (["username", "x"], "$", "type"),
], ids=["admin-string-false", "admin-one", "admin-null", "username-number", "unknown-field", "username-10000",
        "username-33", "username-dot", "email-300", "not-an-object"])
async def test_malformed_new_users_are_400_naming_the_field(rest, body, path, rule):
    status, reply, _ = await rest.call("admin", "POST", "/api/v2/users", body=json.dumps(body).encode())
    assert (status, reply["code"]) == (400, "InvalidParametersError"), reply
    assert reply["details"]["errors"][0]["path"] == path and reply["details"]["errors"][0]["rule"] == rule
    if isinstance(body, dict) and isinstance(body.get("username"), str):
        status, _, _ = await rest.call("admin", "GET", "/api/v2/users/me")
        assert status == 200


async def test_admin_false_creates_an_ordinary_user(rest):
    name = f"plain{RUN}"
    status, created, _ = await rest.call("admin", "POST", "/api/v2/users",
                                         body=json.dumps({"username": name, "admin": False}).encode())
    assert status == 201
    rest.tokens["plain"] = created["token"]
    status, me, _ = await rest.call("plain", "GET", "/api/v2/users/me")
    assert (me["username"], me["admin"], me["email"], me["grouplist"]) == (name, False, "", ["default"])


@pytest.mark.parametrize(("body", "content_type"), [
    (b"\xff\xfe not text", "text/yaml"),
    (b"code: " + b"9" * 5000, "text/yaml"),
    (b"{unclosed", "application/json"),
    (b"- just\n- a list\n", "text/yaml"),
], ids=["not-utf8", "huge-integer", "bad-json", "not-a-mapping"])
async def test_malformed_rule_bodies_are_json_4xx(rest, body, content_type):
    status, reply, _ = await rest.call("admin", "POST", "/api/v2/rules", body=body, content_type=content_type)
    assert 400 <= status < 500 and isinstance(reply, dict) and reply["code"] == "InvalidParametersError", (status, reply)


# --- rate limit ------------------------------------------------------------------------


async def test_a_token_past_its_rate_gets_429_with_retry_after(bus, tmp_path):
    server, _ = await serve(bus, tmp_path, rest_rate_limit_burst=3, rest_rate_limit_per_second=0.5)
    busy, calm = (await auth.create_user(bus, f"busy{RUN}"), await auth.create_user(bus, f"calm{RUN}"))
    try:
        async with ClientSession() as session:
            api = Rest(server, session, {"busy": busy, "calm": calm})
            statuses = [(await api.call("busy", "GET", "/api/v2/users/me"))[0] for _ in range(3)]
            assert statuses == [200, 200, 200]
            status, body, headers = await api.call("busy", "GET", "/api/v2/users/me")
            assert (status, body["code"]) == (429, "TooManyRequestsError")
            assert int(headers["Retry-After"]) >= 1 and "3 requests at once" in body["message"]
            assert (await api.call("calm", "GET", "/api/v2/users/me"))[0] == 200  # per token
            assert (await api.call("busy", "GET", "/healthz"))[0] == 200  # probes are never limited
    finally:
        await server.close()


# --- metrics ---------------------------------------------------------------------------


async def test_every_answer_is_counted_by_method_route_and_status(rest):
    from prometheus_client import REGISTRY

    def counted(route: str, status: int) -> float:
        labels = {"method": "GET", "route": route, "status": str(status)}
        return REGISTRY.get_sample_value("pai_rest_request_seconds_count", labels) or 0.0

    me, job = "/api/v2/users/me", "/api/v2/jobs/{job}"
    before = {(me, 401): counted(me, 401), (me, 200): counted(me, 200), (job, 404): counted(job, 404)}
    for who, path in (("anonymous", me), ("anonymous", me), ("owner", me), ("owner", f"/api/v2/jobs/{OWNER}~nosuchjob")):
        await rest.call(who, "GET", path)
    assert counted(me, 401) - before[(me, 401)] == 2  # refused before the route ran: still counted
    assert counted(me, 200) - before[(me, 200)] == 1
    assert counted(job, 404) - before[(job, 404)] == 1  # by the route's pattern, not the path asked


async def test_accepted_jobs_are_counted_per_virtual_cluster(rest):
    from prometheus_client import REGISTRY

    def accepted() -> float:
        return REGISTRY.get_sample_value("pai_rest_jobs_submitted_total", {"vc": "default"}) or 0.0

    before = accepted()
    status, body, _ = await rest.call("owner", "POST", "/api/v2/jobs", body=_new_job("owner"), content_type="text/yaml")
    assert status == 202, body
    await rest.call("owner", "POST", "/api/v2/jobs", body=b"name: [", content_type="text/yaml")  # refused: not counted
    assert accepted() - before == 1


# --- health ----------------------------------------------------------------------------


async def test_a_bus_closed_for_good_is_unhealthy_and_ends_the_service(nats_server, tmp_path):
    bus = await Bus.connect(nats_server.url, name="closing", **nats_server.login("platform"))
    ctx = ServiceContext(name="rest", config=load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path)), bus=bus)
    ctx.set_ready()
    app = web.Application()
    app.add_routes(health_routes(lambda: ctx))
    server = TestServer(app)
    await server.start_server()
    watch = asyncio.ensure_future(exit_when_bus_closed(ctx))
    try:
        async with ClientSession() as session:
            async def status(path: str) -> int:
                async with session.get(server.make_url(path)) as resp:
                    return resp.status

            assert (await status("/healthz"), await status("/readyz")) == (200, 200)
            await bus.nc.close()  # what nats-py does after e.g. a protocol error: no reconnecting
            assert (await status("/healthz"), await status("/readyz")) == (503, 503)
            with pytest.raises(BusClosed):
                await asyncio.wait_for(watch, timeout=5)
    finally:
        watch.cancel()
        await server.close()
