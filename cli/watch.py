"""`pai watch [JOB]`: job state changes as they happen (GET /api/v2/events, SSE).

A dropped connection is resumed with the id of the last event seen
(`Last-Event-ID`), so nothing is missed and nothing printed twice. With a job,
the command ends when the job does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import aiohttp
from rich.console import Console

from cli.client import ApiError, Client, Connection, connect

console = Console()
FINAL_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
STATE_STYLE = {"WAITING": "yellow", "RUNNING": "cyan", "STOPPING": "magenta", "SUCCEEDED": "green",
               "FAILED": "red", "STOPPED": "dim"}
RECONNECT_SECONDS = (0.5, 1, 2, 5)


async def read_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """SSE events of one response: {id, event, data} (comments and `retry:` skipped)."""
    fields: dict[str, Any] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in fields:
                yield fields
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")


async def events(conn: Connection, *, job: str | None = None, last_id: str | None = None
                 ) -> AsyncIterator[dict[str, Any]]:
    """Every event from now (or after `last_id`), across reconnects."""
    params = {"job": job} if job else {}
    failures = 0
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    while True:
        headers = {"Authorization": f"Bearer {conn.token}", "Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(f"{conn.url}/api/v2/events", params=params, headers=headers) as resp:
                    if resp.status >= 400:
                        body = await resp.read()
                        try:
                            raise ApiError(resp.status, json.loads(body))
                        except ValueError:
                            raise ApiError(resp.status, body.decode(errors="replace")) from None
                    failures = 0
                    async for event in read_events(resp):
                        last_id = event.get("id", last_id)
                        event["data"] = json.loads(event["data"])
                        yield event
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            pass  # network trouble or rest restarting: resume below (API errors were raised above)
        delay = RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]
        failures += 1
        console.print(f"[dim]connection lost; resuming in {delay} s[/]", highlight=False)
        await asyncio.sleep(delay)


def line_of(data: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(data["time"] / 1000).strftime("%H:%M:%S")
    state = data["state"]
    style = STATE_STYLE.get(state, "white")
    previous = f"{data['previous']} -> " if data.get("previous") else ""
    extra = ""
    if data.get("exitCode") is not None:
        extra = f"  exit {data['exitCode']}" + (f" ({data['exitPhrase']})" if data.get("exitPhrase") else "")
    return f"{when}  {data['job']}  attempt {data['attempt']}  {previous}[{style}]{state}[/]{extra}"


async def watch(conn: Connection, job: str | None) -> int:
    if job:
        await Client(conn).request("GET", f"/api/v2/jobs/{job}")  # 404 now rather than waiting for nothing
    # One job: its whole kept history first (from event 0), so a change made just
    # before the command started is not missed; all jobs: from now on.
    async for event in events(conn, job=job, last_id="0" if job else None):
        data = event["data"]
        if event.get("event") != "job.state":
            console.print(f"[yellow]{data.get('message', data)}[/]", highlight=False)
            continue
        console.print(line_of(data), highlight=False)
        if job and data["job"] == job and data["state"] in FINAL_STATES:
            return 0 if data["state"] == "SUCCEEDED" else 1
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        return asyncio.run(watch(conn, args.job))
    except KeyboardInterrupt:
        return 130


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    w = subparsers.add_parser("watch", help="print job state changes as they happen (one job: until it ends)")
    w.add_argument("job", nargs="?", help="user~name (default: all your jobs; admins: every job)")
    w.set_defaults(func=cmd_watch)
