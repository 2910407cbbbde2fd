"""`pai up`: the whole platform on this machine.

Starts an embedded nats-server with JetStream in `<data dir>/nats`, then the five
services as separate processes, waits until each answers /readyz, prints the API
URL and the admin token, and supervises: nats-server or a service that dies is
started again (the state is in JetStream's store, so each picks up where it
was). Ctrl-C (or SIGTERM) stops the services, then every task process the local
backend still runs, then NATS, leaving no process behind. A second `pai up` on the same data dir resumes
with every job as it was.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec

from cli.client import Connection, connection_file
from libs.common.config import Config
from libs.common.natsserver import NatsServer

SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")
READY_TIMEOUT_SECONDS = 60.0
RESTART_BACKOFF_SECONDS = 1.0
SUPERVISE_SECONDS = 0.5


class Platform:
    def __init__(self, config: Config, *, print_fn=print):
        self.config = config
        self.data = config.data_path.resolve()
        self.logs = self.data / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.nats: NatsServer | None = None
        self.print = print_fn
        self._stopping = False

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.config.rest_port}"

    def start(self) -> Connection:
        self.logs.mkdir(parents=True, exist_ok=True)
        port = int(self.config.nats_url.rsplit(":", 1)[-1])
        self.nats = NatsServer(self.data / "nats", port=port, host=self.config.host, log_file=self.logs / "nats.log").start()
        for name in SERVICES:
            self._spawn(name)
        for name in SERVICES:
            self._wait_ready(name)
        token = self.config.token_path.read_text().strip()
        conn = Connection(url=self.api_url, token=token)
        path = connection_file(self.data)
        path.write_bytes(msgspec.json.encode(conn))
        path.chmod(0o600)
        return conn

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.config.to_env())
        env["PAI_DATA_DIR"] = str(self.data)
        env.pop("PAI_CONFIG", None)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _spawn(self, name: str) -> None:
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"],
            env=self._env(),
            stdout=log,
            stderr=log,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,  # Ctrl-C reaches us; we stop them in order
        )

    def _wait_ready(self, name: str) -> None:
        url = f"http://{self.config.host}:{self.config.port_of(name)}/readyz"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.logs / (name + '.log')}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{name} was not ready after {READY_TIMEOUT_SECONDS:.0f}s; see {self.logs / (name + '.log')}")

    def kill_service(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one service (chaos tests); `start_service` brings it back."""
        proc = self.procs[name]
        proc.send_signal(sig)
        proc.wait()

    def start_service(self, name: str) -> None:
        self._spawn(name)
        self._wait_ready(name)

    def kill_nats(self) -> None:
        assert self.nats is not None
        self.nats.stop(kill=True)

    def start_nats(self) -> None:
        assert self.nats is not None
        self.nats.start()

    def supervise(self) -> None:
        """Block until asked to stop, starting again NATS or any service that died."""
        while not self._stopping:
            self.restart_what_died()
            time.sleep(SUPERVISE_SECONDS)

    def restart_what_died(self) -> list[str]:
        """One round of supervision: NATS first (every service needs it), then the
        services; returns what was started again."""
        restarted = []
        if self.nats is not None and self.nats.proc is not None and self.nats.proc.poll() is not None and not self._stopping:
            self.print(f"[yellow]nats-server exited with code {self.nats.proc.returncode}; starting it again[/]")
            self.nats.start()  # same store and port: JetStream recovers its streams
            restarted.append("nats")
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None and not self._stopping:
                self.print(f"[yellow]{name} exited with code {proc.returncode}; starting it again[/]")
                time.sleep(RESTART_BACKOFF_SECONDS)
                self._spawn(name)
                restarted.append(name)
        return restarted

    def request_stop(self, *_: object) -> None:
        self._stopping = True

    def stop(self) -> None:
        self._stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.config.backend == "local":
            asyncio.run(stop_local_tasks(self.data / "launcher", grace_seconds=min(self.config.grace_seconds, 5.0)))
        if self.nats is not None:
            self.nats.stop()


# platformReason of tasks ended because the platform itself was stopped; the
# runtime's rules retry them without counting it against the job's budget.
PLATFORM_STOPPED = "PlatformStopped"


async def stop_local_tasks(launcher_dir: Path, *, grace_seconds: float) -> int:
    """End every task process the local backend still runs (after the launcher stopped).

    Uses the backend's own stop (SIGTERM to the whole task, SIGKILL after the
    grace period), so each exit is recorded and the next launcher learns of it.
    """
    from services.launcher.backends.local import LocalBackend

    if not launcher_dir.exists():
        return 0
    backend = LocalBackend(launcher_dir, grace_seconds=grace_seconds)
    try:
        keys = await backend.recover()
        await asyncio.gather(*(backend.kill(k, grace_seconds=grace_seconds, reason=PLATFORM_STOPPED) for k in keys))
        return len(keys)
    finally:
        await backend.close()
