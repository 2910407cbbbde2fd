"""The launcher's side of a job's TensorBoard (services/launcher/tensorboard_relay.py) on a
real nats-server with PAI's permissions: rest (logged in as `rest`) asks as its handler
does (libs/common/tensorboard_relay.py), the launcher (as `launcher`) fetches from the
job's task, here a stand-in TensorBoard that gzips every answer whatever it was asked.

Content codings follow the client's Accept-Encoding: the launcher asks with the client's
own, a client that accepts gzip gets the upstream's gzip bytes as they were, and one
that did not (urllib, curl without --compressed) gets the plain body, whole across the
bus's chunks, with no Content-Encoding and its own length. The whole platform with a real
TensorBoard is tests/integration/test_tensorboard.py."""

from __future__ import annotations

import gzip
import zlib
from types import SimpleNamespace

import pytest
from aiohttp import web

from libs.common import tensorboard_relay
from libs.common.bus import Bus
from libs.common.messages import TaskState
from libs.common.protocol.tensorboard import PORT_LABEL
from libs.common.tensorboard_relay import CHUNK_BYTES, RelayReply, RelayRequest
from services.launcher import tensorboard_relay as launcher_relay

JOB = "alice~tb"
# Larger than one bus message once inflated, a few KiB gzipped: the plain body comes in chunks.
PLAIN = b"".join(b'{"step": %d, "loss": %f}\n' % (i, 1.0 / (i + 1)) for i in range(40_000))
ETAG = '"tb-1"'


class GzipAlways:
    """A TensorBoard stand-in that ignores Accept-Encoding: every answer gzipped."""

    def __init__(self):
        self.asked: list[str] = []
        self.body = gzip.compress(PLAIN)

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append(request.headers.get("Accept-Encoding", "<none>"))
        if request.path == "/corrupt":
            body = self.body[: len(self.body) // 2]
        elif request.path == "/bomb":  # 2 MiB of zeros in a few KiB
            body = gzip.compress(bytes(2 * 1024 * 1024))
        else:
            body = self.body
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json",
                                                "ETag": ETAG})


@pytest.fixture
async def world(nats_server):
    upstream = GzipAlways()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    # The job's record as the launcher's core holds it: running, its TensorBoard task at the stand-in.
    task = SimpleNamespace(state=TaskState.RUNNING, live=True, ports={PORT_LABEL: [port]}, hostIp="127.0.0.1")
    record = SimpleNamespace(attempts=[1], state=SimpleNamespace(is_final=False),
                             current=SimpleNamespace(task=lambda role, index: task))
    core = SimpleNamespace(job=lambda jid: record if jid == JOB else None)
    rest = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    launcher = await Bus.connect(nats_server.url, name="launcher", **nats_server.login("launcher"))
    relay = await launcher_relay.serve(launcher, core)  # type: ignore[arg-type]
    try:
        yield SimpleNamespace(rest=rest, upstream=upstream)
    finally:
        await relay.close()
        for bus in (rest, launcher):
            await bus.close()
        await runner.cleanup()


async def fetch(bus: Bus, path: str, accept_encoding: str) -> tuple[RelayReply, bytes]:
    """As rest's handler asks: the first reply, then the rest of the body by offsets."""
    req = RelayRequest(job=JOB, role="main", fetch=path + accept_encoding, path=path, acceptEncoding=accept_encoding)
    first = await tensorboard_relay.ask(bus, req, timeout=10)
    body = first.data + b"".join([chunk async for chunk in tensorboard_relay.rest_of_body(bus, req, first)])
    return first, body


async def test_a_client_that_did_not_ask_for_gzip_gets_the_plain_body(world):
    for accept in ("", "identity", "gzip;q=0, identity", "br"):
        first, body = await fetch(world.rest, "/data/plugin/scalars/scalars", accept)
        assert first.status == 200 and not first.error
        assert "Content-Encoding" not in first.headers, accept
        assert body == PLAIN and first.size == len(PLAIN) > CHUNK_BYTES  # Content-Length is the plain body's
        assert first.headers["ETag"] == "W/" + ETAG  # the same content, no longer the same bytes
    # TensorBoard was asked as the client asked (identity when it named nothing).
    assert world.upstream.asked == ["identity", "identity", "gzip;q=0, identity", "br"]


async def test_a_client_that_accepts_gzip_gets_the_gzip_as_it_was(world):
    for accept in ("gzip, deflate, br", "*", "x-gzip"):
        first, body = await fetch(world.rest, "/index.js", accept)
        assert first.status == 200 and first.headers["Content-Encoding"] == "gzip"
        assert body == world.upstream.body and first.size == len(world.upstream.body)  # not encoded again
        assert gzip.decompress(body) == PLAIN and first.headers["ETag"] == ETAG
    assert world.upstream.asked == ["gzip, deflate, br", "*", "x-gzip"]


async def test_an_answer_that_cannot_be_decoded_is_refused_with_why(world, monkeypatch):
    first, _ = await fetch(world.rest, "/corrupt", "")
    assert first.status == 502 and "could not be decoded" in first.error
    # Inflating stops at the answer's limit: a small body that inflates hugely is refused, not held.
    monkeypatch.setattr(launcher_relay, "MAX_ANSWER_BYTES", 1024 * 1024)
    first, _ = await fetch(world.rest, "/bomb", "")
    assert first.status == 502 and "over 1048576 bytes" in first.error
    first, body = await fetch(world.rest, "/bomb", "gzip")  # passed on as it is, never inflated here
    assert first.status == 200 and zlib.decompress(body, 32 + zlib.MAX_WBITS) == bytes(2 * 1024 * 1024)
