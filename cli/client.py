"""A small HTTP client of PAI's API for the `pai` command.

Where to connect: see `resolve` (flags, environment, contexts).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import msgspec


class Connection(msgspec.Struct, frozen=True):
    url: str
    token: str


class ApiError(Exception):
    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"HTTP {status}: {message}")


class RateLimited(Exception):
    def __init__(self, error: ApiError, wait: float):
        self.error = error
        self.wait = wait


def connection_file(data_dir: str | Path) -> Path:
    return Path(data_dir).expanduser() / "cli.json"


def resolve(url: str | None, token: str | None, data_dir: str | None, context: str | None = None) -> Connection:
    """Where to connect, first found wins: `--url`/`--token`, `PAI_URL`/`PAI_TOKEN`,
    the context named by `--context` or `PAI_CONTEXT`, the connection file of a data
    directory named by `--data-dir` or `PAI_DATA_DIR` (`pai up` writes it), the
    current context (cli/contexts.py), and, once, the login kept in ./.pai/ before
    contexts."""
    url = url or os.environ.get("PAI_URL")
    token = token or os.environ.get("PAI_TOKEN")
    if not (url and token):
        saved = _saved_connection(data_dir, context)
        if saved is not None:
            url, token = url or saved.url, token or saved.token
    if not (url and token):
        raise SystemExit("don't know where PAI runs: `pai login --url URL`, `pai up`, "
                         "or set PAI_URL and PAI_TOKEN (`pai context list` shows the clusters known)")
    return Connection(url=url.rstrip("/"), token=token)


def connect(args: Any) -> Connection:
    """`resolve` with a command's global options."""
    return resolve(args.url, args.token, args.data_dir, getattr(args, "context", None))


def _saved_connection(data_dir: str | None, context: str | None) -> Connection | None:
    from cli import contexts

    named = context or os.environ.get("PAI_CONTEXT")
    data_dir = data_dir or os.environ.get("PAI_DATA_DIR")
    if data_dir and not named:
        path = connection_file(data_dir)
        return msgspec.json.decode(path.read_bytes(), type=Connection) if path.exists() else None
    found = contexts.selected(named) or contexts.migrate_old_login()
    return Connection(url=found[1].url, token=found[1].token) if found else None


# A 429 (this token's rate limit) is waited out this many times, each for the
# server's Retry-After (at most RATE_LIMIT_WAIT_CAP seconds), before it is shown.
RATE_LIMIT_RETRIES = 5
RATE_LIMIT_WAIT_CAP = 5.0


def retry_after_seconds(header: str | None) -> float:
    try:
        return min(max(float(header or 1), 0.05), RATE_LIMIT_WAIT_CAP)
    except ValueError:
        return 1.0


class Client:
    def __init__(self, conn: Connection):
        self.conn = conn

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call; a rate-limited one is repeated after the wait the server asks for."""
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                return await self._request_once(method, path, **kwargs)
            except RateLimited as limited:
                if attempt == RATE_LIMIT_RETRIES:
                    raise limited.error from None
                await asyncio.sleep(limited.wait)
        raise AssertionError("unreachable")

    async def _request_once(self, method: str, path: str, *, data: bytes | None = None, json_body: Any = None,
                            content_type: str | None = None, params: dict[str, Any] | None = None,
                            raw: bool = False) -> Any:
        headers = {"Authorization": f"Bearer {self.conn.token}"}
        if content_type:
            headers["Content-Type"] = content_type
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.conn.url + path, data=data, json=json_body, headers=headers,
                                       params=params) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    try:
                        parsed = json.loads(body)
                    except ValueError:
                        parsed = body.decode(errors="replace")
                    if resp.status == 429:
                        raise RateLimited(ApiError(resp.status, parsed), retry_after_seconds(resp.headers.get("Retry-After")))
                    raise ApiError(resp.status, parsed)
                if raw:
                    return body
                return json.loads(body) if body else None

    async def stream(self, path: str, *, params: dict[str, Any] | None = None, sink) -> None:
        """GET a streaming body (e.g. a followed log), handing each chunk to `sink`."""
        headers = {"Authorization": f"Bearer {self.conn.token}"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(self.conn.url + path, headers=headers, params=params) as resp:
                if resp.status >= 400:
                    body = await resp.read()
                    try:
                        raise ApiError(resp.status, json.loads(body))
                    except ValueError:
                        raise ApiError(resp.status, body.decode(errors="replace")) from None
                async for chunk in resp.content.iter_any():
                    sink(chunk)
