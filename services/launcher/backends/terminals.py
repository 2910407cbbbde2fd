"""A shell in a running task, as the backends open it for a browser terminal
(services/launcher/terminals.py relays it over the bus).

Every kind is a `TerminalChannel`: bytes read until the shell's end (b""), bytes
written, a resize, a close that ends the shell. Three kinds:
- `PtyTerminal`: a process task (local backend): a pty whose other side runs
  `terminal_enter` (the task's cgroups, mount namespace, uid, directory, environment);
- `EngineExecTerminal`: a container task: the engine's exec with a tty (Docker's API:
  POST /containers/{id}/exec, then /exec/{id}/start upgraded to a raw stream);
- `KubeExecTerminal`: a Pod: Kubernetes' exec over a WebSocket (kube_exec.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import signal
import struct
import sys
import termios
from pathlib import Path
from typing import Protocol

from services.launcher.backends.engine import API as ENGINE_API, Engine, EngineError

TERM = "xterm-256color"
READ_BYTES = 64 * 1024
_PROJECT_ROOT = Path(__file__).resolve().parents[3]
# The shell a container task's exec runs: bash where the image has it.
CONTAINER_SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"]


class TerminalChannel(Protocol):
    mode: str  # "process", "container" or "pod"

    async def read(self) -> bytes:
        """The shell's next output; b"" once it ended."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def resize(self, cols: int, rows: int) -> None: ...

    async def close(self) -> None:
        """End the shell (if it still runs) and free what the channel holds."""
        ...


def clamp_size(cols: int, rows: int) -> tuple[int, int]:
    return max(1, min(cols or 80, 1000)), max(1, min(rows or 24, 1000))


class PtyTerminal:
    """A process task's shell on a pty of ours (see terminal_enter)."""

    mode = "process"

    def __init__(self, master: int, process: asyncio.subprocess.Process):
        self._master = master
        self._process = process
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._closed = False
        os.set_blocking(master, False)
        asyncio.get_running_loop().add_reader(master, self._readable)

    @classmethod
    async def open(cls, *, pid: int, uid: int | None, gid: int | None, cwd: str, env: dict[str, str],
                   mounts: bool, cols: int, rows: int) -> PtyTerminal:
        master, slave = os.openpty()
        try:
            _set_size(slave, cols, rows)
            plan = json.dumps({"pid": pid, "uid": uid, "gid": gid, "cwd": cwd, "mounts": mounts})
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.launcher.backends.terminal_enter", plan,
                stdin=slave, stdout=slave, stderr=slave, start_new_session=True, close_fds=True,
                env={**env, "TERM": TERM, "PYTHONPATH": str(_PROJECT_ROOT)}, cwd="/",
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return cls(master, process)

    def _readable(self) -> None:
        try:
            data = os.read(self._master, READ_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:  # EIO: every process on the other side closed it
            if exc.errno not in (errno.EIO, errno.EBADF):
                raise
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self._master)
        self._chunks.put_nowait(data)

    async def read(self) -> bytes:
        return await self._chunks.get()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._master, view):]
            except BlockingIOError:
                await asyncio.sleep(0.01)
            except OSError:
                return  # the shell is gone: its end comes through read

    async def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(OSError):
            _set_size(self._master, cols, rows)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGHUP)
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._master)
        os.close(self._master)
        try:
            await asyncio.wait_for(self._process.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
            await self._process.wait()


def _set_size(fd: int, cols: int, rows: int) -> None:
    cols, rows = clamp_size(cols, rows)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class EngineExecTerminal:
    """A container task's shell through the engine's exec, on a raw upgraded stream."""

    mode = "container"

    def __init__(self, engine: Engine, exec_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._engine = engine
        self._exec_id = exec_id
        self._reader = reader
        self._writer = writer
        self._closed = False

    @classmethod
    async def open(cls, engine: Engine, container: str, *, cols: int, rows: int) -> EngineExecTerminal:
        _, data = await engine._call("POST", f"/containers/{container}/exec", body={
            "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "Tty": True,
            "Cmd": CONTAINER_SHELL, "Env": [f"TERM={TERM}"],
        })
        exec_id = str(json.loads(data)["Id"])
        # aiohttp cannot hand over an upgraded connection: the start is written by hand.
        try:
            reader, writer = await asyncio.open_unix_connection(engine.socket_path)
        except OSError as exc:
            raise EngineError(0, f"{engine.socket_path} unreachable: {exc}") from exc
        body = json.dumps({"Detach": False, "Tty": True}).encode()
        writer.write(
            f"POST {ENGINE_API}/exec/{exec_id}/start HTTP/1.1\r\nHost: engine\r\n"
            f"Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[1] not in ("101", "200"):
            writer.close()
            raise EngineError(int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0,
                              f"exec start refused: {status_line}")
        channel = cls(engine, exec_id, reader, writer)
        await channel.resize(cols, rows)
        return channel

    async def read(self) -> bytes:
        try:
            return await self._reader.read(READ_BYTES)
        except (ConnectionError, OSError):
            return b""

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError):
            pass  # its end comes through read

    async def resize(self, cols: int, rows: int) -> None:
        cols, rows = clamp_size(cols, rows)
        with contextlib.suppress(EngineError):
            await self._engine._call("POST", f"/exec/{self._exec_id}/resize", params={"h": str(rows), "w": str(cols)},
                                     ok=(200, 201, 204, 404, 409, 500))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # An engine leaves an exec running when its stream goes (a detach): its shell is
        # hung up by its host pid, as the engine reports it (we run beside the engine).
        with contextlib.suppress(Exception):
            status, data = await self._engine._call("GET", f"/exec/{self._exec_id}/json", ok=(200, 404))
            found = json.loads(data) if status == 200 else {}
            if found.get("Running") and int(found.get("Pid") or 0) > 0:
                os.kill(int(found["Pid"]), signal.SIGHUP)
        with contextlib.suppress(Exception):
            if self._writer.can_write_eof():
                self._writer.write_eof()
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 5)


# Kubernetes' exec streams (the v4.channel.k8s.io subprotocol): each binary frame starts
# with its channel's byte.
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4


class KubeExecTerminal:
    """A Pod's shell through Kubernetes' exec: a WebSocket to the API server, which the
    kubelet joins to the container's process (kubectl exec -it)."""

    mode = "pod"

    def __init__(self, client, ws):
        self._client = client
        self._ws = ws
        self._closed = False
        self.status = b""  # what the API server said on the error channel (the shell's end)

    @classmethod
    async def open(cls, configuration, namespace: str, pod: str, container: str, *, cols: int, rows: int
                   ) -> KubeExecTerminal:
        from kubernetes_asyncio.client import CoreV1Api
        from kubernetes_asyncio.stream import WsApiClient

        client = WsApiClient(configuration=configuration)
        try:
            # Not preloaded: the call gives aiohttp's ws_connect, still to be awaited.
            connecting = await CoreV1Api(client).connect_get_namespaced_pod_exec(
                pod, namespace, command=CONTAINER_SHELL, container=container, stdin=True, stdout=True,
                stderr=False, tty=True, _preload_content=False)  # with a tty, stderr is stdout
            ws = await connecting
        except BaseException:
            await client.close()
            raise
        channel = cls(client, ws)
        await channel.resize(cols, rows)
        return channel

    async def read(self) -> bytes:
        from aiohttp import WSMsgType

        while True:
            msg = await self._ws.receive()
            if msg.type != WSMsgType.BINARY:
                if msg.type == WSMsgType.TEXT:
                    continue
                return b""  # closed, closing or failed: the shell's end
            if not msg.data:
                continue
            channel, data = msg.data[0], msg.data[1:]
            if channel in (STDOUT, STDERR) and data:
                return bytes(data)
            if channel == ERROR:
                self.status = bytes(data)

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._ws.send_bytes(bytes([STDIN]) + data)

    async def resize(self, cols: int, rows: int) -> None:
        cols, rows = clamp_size(cols, rows)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._ws.send_bytes(bytes([RESIZE]) + json.dumps({"Width": cols, "Height": rows}).encode())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The stream's end is the exec's end: the kubelet hangs the shell up.
        with contextlib.suppress(Exception):
            await self._ws.close()
        await self._client.close()
