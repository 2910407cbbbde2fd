"""A container engine's Docker-compatible REST API over its unix socket (aiohttp).

The same calls serve Docker Engine and podman's `system service`; PAI starts the
latter itself when configured to (`container_engine: auto` with a podman binary and
no socket answering: `start_podman_service`). One long-lived session; a wait per
running container holds one connection, so the connector has no limit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

API = "/v1.41"
# Sockets tried by `container_engine: auto`, in order: podman's rootful service,
# then Docker Engine's.
WELL_KNOWN_SOCKETS = ("/run/podman/podman.sock", "/var/run/docker.sock")
# Where PAI's own podman service listens when it starts one (root: one per machine).
PAI_PODMAN_SOCKET = "/run/pai/podman.sock"
_PROJECT_ROOT = Path(__file__).resolve().parents[3]
PAI_CONTAINERS_CONF = _PROJECT_ROOT / "deploy" / "containers" / "containers.conf"
PAI_STORAGE_CONF = _PROJECT_ROOT / "deploy" / "containers" / "storage.conf"
# An idle podman service exits after this long (a launcher starts it again).
PODMAN_IDLE_SECONDS = 600
PODMAN_TMPDIR = "/var/tmp"  # podman's own default for its large temporary files
SERVICE_START_SECONDS = 15.0
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=10)


class EngineError(Exception):
    """The engine refused a call or could not be reached; `status` is its HTTP status (0: unreachable)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"container engine: {message} (HTTP {status})" if status else f"container engine: {message}")
        self.status = status
        self.message = message


def registry_auth_header(username: str, password: str, server: str) -> str:
    """X-Registry-Auth as Docker's API takes it: base64url of the JSON credentials."""
    doc = {"username": username, "password": password, "serveraddress": server}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def split_image(ref: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; tag "latest" when none (a digest stays in the name)."""
    if "@" in ref:
        return ref, ""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # "host:5000/img" has a port, not a tag
        return ref, "latest"
    return name, tag


class Engine:
    """The calls PAI makes; each raises EngineError on a refusal (404 where noted returns None)."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.UnixConnector(path=self.socket_path, limit=0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=_REQUEST_TIMEOUT)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None,
        headers: dict[str, str] | None = None, ok: tuple[int, ...] = (200, 201, 204, 304),
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, bytes]:
        try:
            async with self._http().request(
                method, f"http://engine{API}{path}", params=params, json=body, headers=headers,
                timeout=timeout or _REQUEST_TIMEOUT,
            ) as resp:
                data = await resp.read()
                if resp.status not in ok:
                    raise EngineError(resp.status, _message(data) or resp.reason or "refused")
                return resp.status, data
        except (aiohttp.ClientConnectionError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise EngineError(0, f"{self.socket_path} unreachable: {exc}") from exc

    async def ping(self) -> bool:
        try:
            await self._call("GET", "/_ping", timeout=aiohttp.ClientTimeout(total=5))
        except EngineError:
            return False
        return True

    async def version(self) -> dict[str, Any]:
        return json.loads((await self._call("GET", "/version"))[1])

    async def image_exists(self, ref: str) -> bool:
        status, _ = await self._call("GET", f"/images/{ref}/json", ok=(200, 404))
        return status == 200

    async def pull(self, ref: str, *, auth: str | None = None) -> None:
        """Pull `ref`; `auth`: an X-Registry-Auth value. The engine streams progress
        lines and reports a failure in one of them (with HTTP 200)."""
        name, tag = split_image(ref)
        params = {"fromImage": name} | ({"tag": tag} if tag else {})
        _, data = await self._call(
            "POST", "/images/create", params=params, headers={"X-Registry-Auth": auth} if auth else None,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        for line in data.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and item.get("error"):
                raise EngineError(500, str(item.get("error")))

    async def create(self, name: str, spec: dict[str, Any]) -> str:
        """The new container's id; EngineError 409 when `name` is taken."""
        _, data = await self._call("POST", "/containers/create", params={"name": name}, body=spec)
        return str(json.loads(data)["Id"])

    async def start(self, ref: str) -> None:
        await self._call("POST", f"/containers/{ref}/start")

    async def inspect(self, ref: str) -> dict[str, Any] | None:
        status, data = await self._call("GET", f"/containers/{ref}/json", ok=(200, 404))
        return json.loads(data) if status == 200 else None

    async def wait(self, ref: str) -> int:
        """Block until the container is not running; its exit code."""
        _, data = await self._call(
            "POST", f"/containers/{ref}/wait", timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        return int(json.loads(data).get("StatusCode", -1))

    async def stop(self, ref: str, grace_seconds: float) -> None:
        """SIGTERM, then SIGKILL after the grace period (whole seconds, at least 1)."""
        t = str(max(1, round(grace_seconds)))
        await self._call("POST", f"/containers/{ref}/stop", params={"t": t}, ok=(204, 304, 404),
                         timeout=aiohttp.ClientTimeout(total=grace_seconds + 60, sock_connect=10))

    async def remove(self, ref: str) -> None:
        await self._call("DELETE", f"/containers/{ref}", params={"force": "true", "v": "true"}, ok=(200, 204, 404))

    async def list(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Every container (running or not) carrying all of `labels`."""
        filters = json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})
        _, data = await self._call("GET", "/containers/json", params={"all": "true", "filters": filters})
        return list(json.loads(data))

    async def logs(self, ref: str, *, tail: int | None = None) -> tuple[bytes, bytes]:
        """(stdout and stderr interleaved, stderr alone) of a container without a tty;
        None when it is gone. `tail`: lines from the end."""
        params = {"stdout": "true", "stderr": "true"} | ({"tail": str(tail)} if tail is not None else {})
        status, data = await self._call("GET", f"/containers/{ref}/logs", params=params, ok=(200, 404))
        if status == 404:
            return b"", b""
        return demux(data)


def demux(data: bytes) -> tuple[bytes, bytes]:
    """Docker's multiplexed log stream (8-byte frame headers: stream, 0, 0, 0, size)
    as (both streams in order, stderr alone); a stream without headers is all output."""
    both, err = bytearray(), bytearray()
    at = 0
    while at + 8 <= len(data) and data[at] in (0, 1, 2) and data[at + 1:at + 4] == b"\0\0\0":
        size = int.from_bytes(data[at + 4:at + 8], "big")
        chunk = data[at + 8:at + 8 + size]
        both += chunk
        if data[at] == 2:
            err += chunk
        at += 8 + size
    if at < len(data):
        both += data[at:]
    return bytes(both), bytes(err)


def _message(data: bytes) -> str:
    try:
        doc = json.loads(data)
    except ValueError:
        return data.decode(errors="replace").strip()[:500]
    return str(doc.get("message") or doc.get("cause") or doc)[:500] if isinstance(doc, dict) else str(doc)[:500]


def podman_env() -> dict[str, str]:
    """The environment PAI's podman runs with: PAI's engine configuration unless the
    caller set its own (the host's /etc/containers left as it is)."""
    env = dict(os.environ)
    # The service outlives whoever started it: a TMPDIR of theirs may go (a test
    # session's), and podman then fails every image inspect writing its temp files there.
    env["TMPDIR"] = PODMAN_TMPDIR
    env.setdefault("CONTAINERS_CONF", str(PAI_CONTAINERS_CONF))
    env.setdefault("CONTAINERS_STORAGE_CONF", str(PAI_STORAGE_CONF))
    return {k: v for k, v in env.items() if not k.startswith("PAI_NATS_")}


async def start_podman_service(socket_path: str = PAI_PODMAN_SOCKET) -> None:
    """Start `podman system service` on `socket_path` in a session of its own (it
    outlives the launcher: containers do not depend on it, and a restarted launcher
    finds it), then wait until it answers. A second one racing us fails to bind and
    exits; whichever listens serves both."""
    podman = shutil.which("podman")
    if podman is None:
        raise EngineError(0, "no podman binary to start the engine's API service with")
    os.makedirs(os.path.dirname(socket_path), mode=0o700, exist_ok=True)
    if os.path.exists(socket_path):
        os.unlink(socket_path)  # nobody answered on it (checked by the caller)
    subprocess.Popen(
        [podman, "system", "service", f"--time={PODMAN_IDLE_SECONDS}", f"unix://{socket_path}"],
        env=podman_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
        # Its own directory, not the launcher's: conmon leaves files (an `oom` marker) in
        # the working directory it inherits, which was a checkout's when PAI ran from one.
        cwd=os.path.dirname(socket_path),
    )
    engine = Engine(socket_path)
    try:
        deadline = asyncio.get_running_loop().time() + SERVICE_START_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            if await engine.ping():
                return
            await asyncio.sleep(0.05)
    finally:
        await engine.close()
    raise EngineError(0, f"podman's API service did not answer on {socket_path} within {SERVICE_START_SECONDS:.0f}s")


async def connect(setting: str) -> Engine | None:
    """The engine `container_engine` names: "none" -> None; a socket path -> that
    socket (EngineError if it does not answer); "auto" -> a well-known socket that
    answers, else PAI's own podman service (started if needed), else None."""
    if setting == "none":
        return None
    if setting != "auto":
        engine = Engine(setting)
        if not await engine.ping():
            await engine.close()
            raise EngineError(0, f"container_engine {setting!r} does not answer")
        return engine
    for path in (PAI_PODMAN_SOCKET, *WELL_KNOWN_SOCKETS):
        if os.path.exists(path):
            engine = Engine(path)
            if await engine.ping():
                return engine
            await engine.close()
    if shutil.which("podman") is None or os.geteuid() != 0:
        return None  # rootless podman is not what PAI's tasks are isolated with
    await start_podman_service(PAI_PODMAN_SOCKET)
    return Engine(PAI_PODMAN_SOCKET)
