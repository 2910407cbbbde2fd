"""A browser terminal in a running process task, through the whole platform: the owner
opens GET /api/v2/jobs/{id}/terminal as a WebSocket on rest, types, and reads the shell's
answers from inside the task (its user, working directory, environment); another user
is refused 403, a task that does not run 409; each session lands in the job's events
with who opened it and how long it lasted, a session cut by the launcher's death too
(closed once, by the launcher that starts next)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import uuid

import aiohttp
import pytest

from cli.client import Client, Connection
from tests.integration.conftest import Api, job_yaml

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
# The task says who and where it is, in its log, to compare with the terminal's answers.
TASK = ['echo "task-user=$(id -un) task-dir=$(pwd)"', "sleep 300"]


async def user(platform: Api, name: str) -> Client:
    created = await platform.client.request("POST", "/api/v2/users", json_body={"username": name})
    return Client(Connection(platform.conn.url, created["token"]))


def terminal_url(platform: Api, job: str, role: str, index: int) -> str:
    return f"{platform.conn.url}/api/v2/jobs/{job}/terminal?taskRole={role}&taskIndex={index}&cols=120&rows=40"


def browser_protocols(token: str) -> list[str]:
    """What the portal offers: the protocol and the token, as a browser cannot send a header."""
    encoded = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    return ["pai.terminal.v1", f"base64url.bearer.pai.{encoded}"]


async def read_until(ws: aiohttp.ClientWebSocketResponse, pattern: re.Pattern, seen: bytearray,
                     timeout: float = 20.0) -> re.Match:
    async def read() -> re.Match:
        while True:
            found = pattern.search(seen.decode(errors="replace"))
            if found:
                return found
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                seen.extend(msg.data)
            elif msg.type != aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"the terminal closed ({msg.type}, {msg.extra}) before {pattern.pattern!r}; "
                                     f"it showed: {seen.decode(errors='replace')!r}")
    return await asyncio.wait_for(read(), timeout)


async def task_says(platform: Api, job: str, role: str, index: int) -> tuple[str, str]:
    for _ in range(200):
        log = await platform.logs(job, taskRole=role, taskIndex=index)
        found = re.search(r"task-user=(\S+) task-dir=(\S+)", log)
        if found:
            return found.group(1), found.group(2)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} {role}[{index}] printed no identity")


async def events_of(client: Client, job: str, reasons: set[str], timeout: float = 20.0) -> list[dict]:
    for _ in range(int(timeout / 0.2)):
        found = [e for e in (await client.request("GET", f"/api/v2/jobs/{job}/events"))["data"] if e["reason"] in reasons]
        if {e["reason"] for e in found} >= reasons:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"the events of {job} never held {reasons}")


async def test_the_owner_types_in_a_running_task_and_the_session_is_recorded(platform: Api):
    name = f"term{RUN}"
    owner = await user(platform, name)
    stranger = await user(platform, f"other{RUN}")
    answer = await owner.request("POST", "/api/v2/jobs", data=job_yaml(f"term{RUN}", TASK, roles={"worker": 2}).encode(),
                                 content_type="text/yaml")
    job = answer["job"]
    try:
        detail = await platform.wait_state(job, "RUNNING", timeout=60)
        for _ in range(100):
            tasks = detail["taskRoles"]["worker"]["taskStatuses"]
            if all(t["taskState"] == "RUNNING" for t in tasks):
                break
            await asyncio.sleep(0.1)
            detail = await platform.job(job)
        task_user, task_dir = await task_says(platform, job, "worker", 1)

        async with aiohttp.ClientSession() as http:
            # Another user: refused before any upgrade.
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(terminal_url(platform, job, "worker", 1),
                                      protocols=browser_protocols(stranger.conn.token))
            assert refused.value.status == 403
            # No token at all: 401.
            with pytest.raises(aiohttp.WSServerHandshakeError) as anonymous:
                await http.ws_connect(terminal_url(platform, job, "worker", 1), protocols=["pai.terminal.v1"])
            assert anonymous.value.status == 401

            # The owner, as the portal connects: the token as a subprotocol.
            async with http.ws_connect(terminal_url(platform, job, "worker", 1),
                                       protocols=browser_protocols(owner.conn.token)) as ws:
                assert ws.protocol == "pai.terminal.v1"  # the token is never echoed back
                seen = bytearray()
                await ws.send_str(json.dumps({"resize": {"cols": 100, "rows": 30}}))
                await ws.send_bytes(b"id -un; pwd; echo $PAI_TASK_INDEX; stty size; echo done-$((6*7))\n")
                await read_until(ws, re.compile(r"done-42"), seen)
                lines = [line.strip() for line in seen.decode(errors="replace").replace("\r", "").split("\n")]
                at = lines.index("done-42")
                assert lines[at - 4: at] == [task_user, task_dir, "1", "30 100"], lines
                await ws.send_bytes(b"exit\n")
                closing = await asyncio.wait_for(ws.receive(), 20)
                while closing.type == aiohttp.WSMsgType.BINARY:
                    closing = await asyncio.wait_for(ws.receive(), 20)
                assert closing.type == aiohttp.WSMsgType.TEXT and "exited" in json.loads(closing.data)["closed"]

        events = await events_of(owner, job, {"TerminalOpened", "TerminalClosed"})
        opened = next(e for e in events if e["reason"] == "TerminalOpened")
        closed = next(e for e in events if e["reason"] == "TerminalClosed")
        assert f"{name} opened a terminal in task worker[1] (process)" == opened["message"]
        assert re.fullmatch(rf"the terminal {name} opened in task worker\[1\] closed after \d+s: the shell exited",
                            closed["message"]), closed["message"]
        assert closed["firstTimestamp"] >= opened["firstTimestamp"]
    finally:
        await owner.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})

    await platform.wait_state(job, "STOPPED", timeout=60)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as not_running:
            await http.ws_connect(terminal_url(platform, job, "worker", 0),
                                  headers={"Authorization": f"Bearer {owner.conn.token}"})
        assert not_running.value.status == 409


async def test_a_session_cut_by_a_launcher_killed_9_is_closed_once_after_its_restart(platform: Api):
    name = f"cut{RUN}"
    owner = await user(platform, name)
    answer = await owner.request("POST", "/api/v2/jobs", data=job_yaml(f"cut{RUN}", TASK).encode(),
                                 content_type="text/yaml")
    job = answer["job"]
    try:
        await platform.wait_state(job, "RUNNING", timeout=60)
        await task_says(platform, job, "main", 0)
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(terminal_url(platform, job, "main", 0),
                                       protocols=browser_protocols(owner.conn.token)) as ws:
                await ws.send_bytes(b"echo alive-$((6*7))\n")
                await read_until(ws, re.compile(r"alive-42"), bytearray())
                await asyncio.to_thread(platform.platform.kill_service, "launcher", signal.SIGKILL)
            await events_of(owner, job, {"TerminalOpened"})
            await asyncio.to_thread(platform.platform.start_service, "launcher")
            closed = [e for e in await events_of(owner, job, {"TerminalClosed"}) if e["reason"] == "TerminalClosed"]
            assert len(closed) == 1 and closed[0]["message"].startswith(
                f"the terminal {name} opened in task main[0] closed after "), closed
            assert ": the launcher restarted: the session was cut when it stopped; its length is measured to the " \
                   "last moment the launcher was known to hold it open" in closed[0]["message"], closed

            # Killed and started again: no second close. A session opened afterwards works
            # and is recorded; once its close is in the events, the first one's would be too.
            await asyncio.to_thread(platform.platform.kill_service, "launcher", signal.SIGKILL)
            await asyncio.to_thread(platform.platform.start_service, "launcher")
            async with http.ws_connect(terminal_url(platform, job, "main", 0),
                                       protocols=browser_protocols(owner.conn.token)) as ws:
                await ws.send_bytes(b"exit\n")
                closing = await asyncio.wait_for(ws.receive(), 20)
                while closing.type == aiohttp.WSMsgType.BINARY:
                    closing = await asyncio.wait_for(ws.receive(), 20)
        for _ in range(100):
            events = (await owner.request("GET", f"/api/v2/jobs/{job}/events"))["data"]
            closes = [e["message"] for e in events if e["reason"] == "TerminalClosed"]
            if any(m.endswith("the shell exited") for m in closes):
                break
            await asyncio.sleep(0.2)
        assert len(closes) == 2 and sum("the launcher restarted" in m for m in closes) == 1, closes
        assert sum(e["reason"] == "TerminalOpened" for e in events) == 2, events
    finally:
        await owner.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})
