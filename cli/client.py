"""A small HTTP client of PAI's API for the `pai` command.

Where to connect: `--url/--token`, else `PAI_URL`/`PAI_TOKEN`, else the file
`pai up` writes (`<data dir>/cli.json`).
"""

from __future__ import annotations

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


def connection_file(data_dir: str | Path) -> Path:
    return Path(data_dir).expanduser() / "cli.json"


def resolve(url: str | None, token: str | None, data_dir: str | None) -> Connection:
    url = url or os.environ.get("PAI_URL")
    token = token or os.environ.get("PAI_TOKEN")
    if not (url and token):
        path = connection_file(data_dir or os.environ.get("PAI_DATA_DIR", ".pai"))
        if path.exists():
            saved = msgspec.json.decode(path.read_bytes(), type=Connection)
            url, token = url or saved.url, token or saved.token
    if not (url and token):
        raise SystemExit("don't know where PAI runs: start it with `pai up`, or set PAI_URL and PAI_TOKEN")
    return Connection(url=url.rstrip("/"), token=token)


class Client:
    def __init__(self, conn: Connection):
        self.conn = conn

    async def request(self, method: str, path: str, *, data: bytes | None = None, json_body: Any = None,
                      content_type: str | None = None, params: dict[str, Any] | None = None, raw: bool = False) -> Any:
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
