"""rest against a hostile client, on a real nats-server and rest's own HTTP server
setup (libs/common/http_server.py): a job no store can encode must fail alone and as a
400 naming its field, a slow-loris of 2,000 half-sent headers must not take the API
away from anyone else, and the bytes that used to make rest answer 500 get a 4xx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession, TCPConnector

from libs.common import http_server
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.service import ServiceContext
from services.rest import auth
from services.rest.app import create_app
from tests.component.rest_replica import job_body
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
LORIS = 2_000
HALF_HEADER = b"GET /api/v2/jobs HTTP/1.1\r\nHost: pai\r\nX-Waiting: "
# A second loopback address: the normal client is another peer than the attacker.
OTHER_PEER = "127.0.0.2"
WAIT_SECONDS = 30.0


class Served:
    def __init__(self, ctx: ServiceContext, port: int):
        self.ctx, self.port = ctx, port
        self.url = f"http://127.0.0.1:{port}"

    async def call(self, method: str, path: str, *, token: str | None = None, body: bytes | None = None,
                   content_type: str = "application/json", local: str = "127.0.0.1") -> tuple[int, dict]:
        headers = {"Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with ClientSession(connector=TCPConnector(local_addr=(local, 0))) as session, \
                session.request(method, self.url + path, data=body, headers=headers) as resp:
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, {"raw": raw.decode(errors="replace")}

    async def raw(self, request: bytes) -> bytes:
        """Send `request` as bytes (what no HTTP client library sends) and read the answer."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(request)
            await writer.drain()
            return await asyncio.wait_for(reader.read(), WAIT_SECONDS)
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def served(nats_server, tmp_path, **settings) -> AsyncIterator[Served]:
    """rest's app behind the HTTP server every service runs (`http_server.serve`), on a free port."""
    bus = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path), **settings)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    runner, site = await http_server.serve(await create_app(ctx), "127.0.0.1", 0, http_server.Limits.of(config))
    ctx.set_ready()
    try:
        yield Served(ctx, site.port)
    finally:
        await runner.cleanup()
        await bus.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def json_job(name: str, description: str) -> bytes:
    """A job as JSON text, `description` inserted as written (escapes and all)."""
    return (b'{"protocolVersion": 2, "name": "' + name.encode() + b'", "type": "job", "description": "'
            + description.encode() + b'", "taskRoles": {"main": {"instances": 1, "commands": ["echo hi"]}}}')


async def test_an_unencodable_job_is_a_400_naming_its_field_and_fails_no_one_else(nats_server, tmp_path):
    async with served(nats_server, tmp_path) as rest:
        mallory = await auth.create_user(rest.ctx.bus, f"mallory{RUN}")
        ann = await auth.create_user(rest.ctx.bus, f"ann{RUN}")
        bad = [rest.call("POST", "/api/v2/jobs", token=mallory, body=json_job(f"bad{n}", "\\ud800"))
               for n in range(5)]
        good = [rest.call("POST", "/api/v2/jobs", token=ann, body=job_body(f"good{n}"), content_type="text/yaml")
                for n in range(30)]
        answers = await asyncio.gather(*bad, *good)
        for status, body in answers[:5]:
            assert status == 400, body
            assert [(e["path"], e["rule"]) for e in body["errors"]] == [("description", "encoding")]
        assert [status for status, _ in answers[5:]] == [202] * 30, answers[5:]

        # YAML's loader refuses the escape itself, naming its line.
        yaml_job = (b'protocolVersion: 2\nname: yamlbad\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n'
                    b'    commands:\n      - "echo \\ud800"\n')
        status, body = await rest.call("POST", "/api/v2/jobs", token=mallory, body=yaml_job, content_type="text/yaml")
        assert status == 400 and body["errors"][0]["line"] == 8, body
        # In JSON, deep down or in a key, the path names it.
        deep = json_job("deepbad", "fine").replace(b'"echo hi"', b'"echo \\ud800"')
        status, body = await rest.call("POST", "/api/v2/jobs", token=mallory, body=deep)
        assert status == 400 and body["errors"][0]["path"] == "taskRoles.main.commands[0]", body
        key_job = json_job("keybad", "fine").replace(b'"type"', b'"\\udfff"')
        status, body = await rest.call("POST", "/api/v2/jobs", token=mallory, body=key_job)
        assert status == 400 and body["errors"][0]["rule"] == "encoding", body


async def test_bytes_that_made_rest_fail_get_a_4xx_naming_the_cause(nats_server, tmp_path):
    async with served(nats_server, tmp_path) as rest:
        token = await auth.create_user(rest.ctx.bus, f"ivy{RUN}")
        # An Authorization header that is not UTF-8.
        answer = await rest.raw(b"GET /api/v2/jobs HTTP/1.1\r\nHost: pai\r\nAuthorization: Bearer \xff\xfe\x80token\r\n"
                                b"Connection: close\r\n\r\n")
        assert status_of(answer) == 401 and b"not valid UTF-8" in answer, answer
        # A lone surrogate in a JSON body (the generic body path: PUT /users/me here).
        status, body = await rest.call("PUT", "/api/v2/users/me", token=token,
                                       body=b'{"password": "\\ud800longenough1", "oldPassword": "x"}')
        assert status == 400 and body["details"]["errors"][0]["path"] == "password", body
        # ... and in a failure rule (YAML's double quotes spell it in PyYAML).
        admin = await auth.create_user(rest.ctx.bus, f"ada{RUN}", admin=True)
        status, body = await rest.call("POST", "/api/v2/rules", token=admin, content_type="text/yaml",
                                       body=b'code: 4242\nphrase: "bad \\udc80"\npattern: {exitCode: 42}\n')
        assert status == 400 and body["details"]["errors"][0]["path"] == "phrase", body
        # A portal path longer than a file name may be.
        status, body = await rest.call("GET", "/portal/" + "a" * 300)
        assert status == 404, body
        status, body = await rest.call("GET", "/portal/js/" + "b" * 256 + ".js")
        assert status == 404, body


async def test_a_body_that_does_not_arrive_is_a_408(nats_server, tmp_path):
    async with served(nats_server, tmp_path, http_body_timeout_seconds=0.5) as rest:
        token = await auth.create_user(rest.ctx.bus, f"sam{RUN}")
        answer = await rest.raw(b"POST /api/v2/jobs HTTP/1.1\r\nHost: pai\r\nContent-Type: text/yaml\r\n"
                                b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: 500\r\n\r\nname: x\n")
        assert status_of(answer) == 408 and b"http_body_timeout_seconds" in answer, answer


@pytest.fixture
def enough_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * LORIS + 1024  # both ends of each loris connection on this process, and room
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        pytest.fail(f"this test needs {wanted} open files (RLIMIT_NOFILE hard limit {hard})")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class LogSize(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.bytes += len(self.format(record))


async def test_a_slow_loris_is_shed_while_another_client_is_answered(nats_server, tmp_path, enough_files):
    limiter = http_server.limit_log_rates()
    logged = LogSize()
    logging.getLogger().addHandler(logged)
    sockets: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with served(nats_server, tmp_path, http_header_timeout_seconds=2.0, http_keepalive_seconds=2.0,
                          http_max_connections=1_500, http_max_connections_per_peer=1_000) as rest:
            token = await auth.create_user(rest.ctx.bus, f"nia{RUN}")

            async def half_a_request():
                reader, writer = await asyncio.open_connection("127.0.0.1", rest.port)
                writer.write(HALF_HEADER)
                sockets.append((reader, writer))

            results = await asyncio.gather(*(half_a_request() for _ in range(LORIS)), return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)][:3]

            # Another peer is answered while the loris holds its connections, public and signed-in routes alike.
            assert (await rest.call("GET", "/healthz", local=OTHER_PEER))[0] == 200
            status, body = await rest.call("GET", "/api/v2/jobs", token=token, local=OTHER_PEER)
            assert status == 200, body

            # The loris's connections past the per-peer cap were refused at once, with a reason.
            # (A refused one may see a reset instead: the server closed it with its half header unread.)
            async def ending(reader: asyncio.StreamReader) -> bytes:
                try:
                    return await asyncio.wait_for(reader.read(), WAIT_SECONDS)
                except ConnectionResetError:
                    return b"reset"

            endings = await asyncio.gather(*(ending(reader) for reader, _ in sockets))
            answered = [e for e in endings if e.startswith(b"HTTP/1.1 503")]
            assert len(answered) + endings.count(b"reset") == LORIS - 1_000
            assert all(b"http_max_connections_per_peer" in e for e in answered)
            # And every one it held was closed by the server (read() returned: EOF), without an answer.
            assert endings.count(b"") == 1_000
            # Once they are gone the loris's own address is served again.
            assert (await rest.call("GET", "/healthz"))[0] == 200
    finally:
        for _, writer in sockets:
            writer.close()
        logging.getLogger().removeHandler(logged)
        for name in http_server.FLOODABLE_LOGGERS:
            logging.getLogger(name).removeFilter(limiter)
    assert logged.bytes < 64 * 1024, f"{logged.bytes} bytes logged"
