"""OpenPAI's tensorboard plugin through the whole platform, tasks as processes: a job
writes a scalar event file, its TensorBoard (PyPI's, the platform's own) serves it, and
the owner fetches TensorBoard's page, its script (larger than one bus message: chunked)
and its data API through rest, relayed by the launcher; anyone else gets 403."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest

from cli.client import ApiError, Client, Connection
from libs.common.tensorboard_relay import CHUNK_BYTES
from services.launcher.backends import local
from tests.integration.conftest import Api, job_yaml

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
TENSORBOARD = Path(sys.executable).parent / "tensorboard"
# Five steps of a scalar `loss`, written with TensorBoard's own event writer (no TensorFlow).
WRITE = (
    "import sys, time\n"
    "from tensorboard.summary.writer.event_file_writer import EventFileWriter\n"
    "from tensorboard.compat.proto import event_pb2, summary_pb2\n"
    "w = EventFileWriter(sys.argv[1])\n"
    "for step in range(5):\n"
    "    value = summary_pb2.Summary.Value(tag='loss', simple_value=1.0 / (step + 1))\n"
    "    w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))\n"
    "w.close()\n"
)
PLUGIN = "extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: tensorboard\n      parameters: {logdir: {path: tb}}\n"


@pytest.fixture(scope="module")
async def owner(platform: Api) -> Client:
    created = await platform.client.request("POST", "/api/v2/users", json_body={"username": f"tbown{RUN}"})
    return Client(Connection(platform.conn.url, created["token"]))


async def fetch(url: str, token: str | None = None, *, cookie: str | None = None,
                method: str = "GET", accept_encoding: str | None = None) -> tuple[int, dict, bytes]:
    """aiohttp's answer, decoded as a browser's; with `accept_encoding` ("" for none, as
    urllib and curl without --compressed send), the bytes as they came."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    cookies = {"pai_tensorboard": cookie} if cookie else None
    raw = accept_encoding is not None
    if accept_encoding:
        headers["Accept-Encoding"] = accept_encoding
    async with aiohttp.ClientSession(cookies=cookies, auto_decompress=not raw,
                                     skip_auto_headers=("Accept-Encoding",) if raw else ()) as http, \
            http.request(method, url, headers=headers, allow_redirects=False) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_the_owner_reads_the_jobs_tensorboard_through_rest(platform: Api, owner: Client):
    if not TENSORBOARD.is_file() or not local._platform_tensorboard():
        pytest.skip("needs TensorBoard from PyPI in the platform's environment, runnable by task users "
                    "(make install puts it there with the test extras)")
    # The event file written by a Python the task's user may run, with TensorBoard's packages:
    # the platform's, as the launcher gives it to process tasks.
    given = local._platform_tensorboard()
    python = given["PAI_TENSORBOARD"].split()[0] if "PAI_TENSORBOARD_PYTHONPATH" in given else sys.executable
    packages = given.get("PAI_TENSORBOARD_PYTHONPATH", "")
    commands = [f"PYTHONPATH={packages} {python} -c {_quoted(WRITE)} tb", "sleep 300"]
    body = job_yaml(f"tb{RUN}", commands, extra=PLUGIN).replace("memoryMB: 256", "memoryMB: 1024")
    job = (await owner.request("POST", "/api/v2/jobs", data=body.encode(), content_type="text/yaml"))["job"]
    base = f"{platform.conn.url}/api/v2/jobs/{job}/tensorboard"
    token = owner.conn.token
    try:
        await platform.wait_state(job, "RUNNING", timeout=60)
        tags: bytes = b""
        status = 0
        for _ in range(300):  # TensorBoard starts, then reads the event file (every 5 s)
            status, _, tags = await fetch(f"{base}/data/plugin/scalars/tags", token)
            if status == 200 and b"loss" in tags:
                break
            await asyncio.sleep(0.2)
        assert status == 200 and b'"loss"' in tags, (status, tags[:300], await platform.logs(job))

        status, _, scalars = await fetch(f"{base}/data/plugin/scalars/scalars?run=.&tag=loss", token)
        assert status == 200
        assert [round(point[2], 3) for point in json.loads(scalars)] == [1.0, 0.5, 0.333, 0.25, 0.2]

        status, headers, page = await fetch(f"{base}/", token)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"tb-relative-root" in page  # TensorBoard's own page, its addresses relative to it
        # Its coding follows the client's Accept-Encoding: a plain client (urllib, curl without
        # --compressed) gets the plain data, one that accepts gzip TensorBoard's gzip, each with
        # its own length. (TensorBoard gzips its data API's JSON for a client that accepts it.)
        data = f"{base}/data/plugin/scalars/scalars?run=.&tag=loss"
        status, headers, plain = await fetch(data, token, accept_encoding="")
        assert status == 200 and "Content-Encoding" not in headers and plain == scalars
        assert int(headers["Content-Length"]) == len(plain)
        status, headers, packed = await fetch(data, token, accept_encoding="gzip")
        assert status == 200 and headers["Content-Encoding"] == "gzip" and gzip.decompress(packed) == scalars
        assert int(headers["Content-Length"]) == len(packed) and headers["Vary"] == "Accept-Encoding"
        status, headers, _ = await fetch(base, token)  # under the slash, where the relative addresses work
        assert status == 302 and headers["Location"].endswith(f"/api/v2/jobs/{job}/tensorboard/")

        # Its script is larger than one bus message: relayed in chunks, byte for byte.
        status, _, script = await fetch(f"{base}/index.js", token)
        detail = await owner.request("GET", f"/api/v2/jobs/{job}")
        port = detail["taskRoles"]["main"]["taskStatuses"][0]["containerPorts"]["tensorboard"]
        direct = await fetch(f"http://127.0.0.1:{port}/index.js")
        assert status == 200 and len(script) > CHUNK_BYTES and script == direct[2]

        # A browser tab: the portal's cookie, on this path only.
        status, _, _ = await fetch(f"{base}/data/runs", cookie=token)
        assert status == 200
        status, _, _ = await fetch(f"{platform.conn.url}/api/v2/jobs/{job}", cookie=token)
        assert status == 401

        # Nobody else: another user, and admins (the pages run on PAI's own address).
        other = await platform.client.request("POST", "/api/v2/users", json_body={"username": f"tboth{RUN}"})
        for who in (other["token"], platform.conn.token):
            status, _, answer = await fetch(f"{base}/data/runs", who)
            assert status == 403 and b"may open the TensorBoard" in answer
        log = await platform.logs(job)
        assert "tensorboard plugin: TensorBoard" in log and "started over tb" in log

        # Stopped: its TensorBoard went with it, and the answer says why.
        await owner.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})
        await platform.wait_state(job, "STOPPED", timeout=60)
        status, _, answer = await fetch(f"{base}/data/runs", token)
        assert status == 409 and b"not running" in answer
    finally:
        await owner.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})


async def test_a_job_without_the_plugin_has_no_tensorboard(platform: Api, owner: Client):
    body = job_yaml(f"notb{RUN}", ["sleep 1"])
    job = (await owner.request("POST", "/api/v2/jobs", data=body.encode(), content_type="text/yaml"))["job"]
    with pytest.raises(ApiError) as missing:
        await owner.request("GET", f"/api/v2/jobs/{job}/tensorboard/data/runs")
    assert missing.value.status == 404 and "runs no TensorBoard" in str(missing.value.body)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
