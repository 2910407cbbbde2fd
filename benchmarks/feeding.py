"""What the one-service benchmarks share (launcher_consume.py, monitor_consume.py): a
service process fed real events on a real nats-server, its own CPU time read from /proc
(api_load.py reads rest's with it too)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from libs.common import busauth
from libs.common.bus import Bus
from libs.common.busauth import load_or_create_credentials
from libs.common.messages import Event, encode, subject_of
from libs.common.natsserver import NatsServer, free_port

REPO = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PUBLISH_WINDOW = 256  # publishes awaiting their acks at once
IDLE_SECONDS = 3.0


def cpu_seconds(pid: int) -> float:
    """The process's own CPU time (utime + stime), not its children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def idle_cpu_share(pid: int) -> float:
    """The process's CPU share over IDLE_SECONDS with nothing fed to it (its own
    timers and polls), to subtract from what it used while fed."""
    before = cpu_seconds(pid)
    await asyncio.sleep(IDLE_SECONDS)
    return (cpu_seconds(pid) - before) / IDLE_SECONDS


async def publish_all(bus: Bus, events: list[Event]) -> None:
    """Pipelined: up to PUBLISH_WINDOW publishes awaiting their acks at once."""
    for start in range(0, len(events), PUBLISH_WINDOW):
        await asyncio.gather(*(
            bus.js.publish(subject_of(e), encode(e), headers={"Nats-Msg-Id": e.id}, timeout=30)
            for e in events[start:start + PUBLISH_WINDOW]
        ))


async def wait_ready(url: str, proc: subprocess.Popen, service: str) -> None:
    """Until the service's /readyz answers 200; fails when the process exits first."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"the {service} exited at start")
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"the {service} never became ready")


@contextlib.asynccontextmanager
async def platform_nats(root: Path) -> AsyncIterator[tuple[NatsServer, Bus]]:
    """A nats-server with its store under `root` (PAI's users and permissions, store
    bootstrapped), and a connection to it as the platform user."""
    with NatsServer(root / "store", auth=load_or_create_credentials(root / "creds.json")) as nats:
        await asyncio.to_thread(nats.bootstrap)
        bus = await Bus.connect(nats.url, name="bench", **nats.login(busauth.PLATFORM))
        try:
            yield nats, bus
        finally:
            await bus.close()


@contextlib.asynccontextmanager
async def service_process(nats: NatsServer, root: Path, service: str, *args: str) -> AsyncIterator[
        tuple[subprocess.Popen, int]]:
    """`python -m services.{service} *args` as users run it (its own NATS user, a free
    port, its data under `root`), once it answers ready: the process and its port.
    Terminated at the end, killed if it has not exited 10 s later."""
    port = free_port()
    env = {**os.environ, "PAI_NATS_URL": nats.url, **nats.env(service), f"PAI_{service.upper()}_PORT": str(port),
           "PAI_DATA_DIR": str(root / "data"), "PAI_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", f"services.{service}", *args], cwd=REPO, env=env)
    try:
        await wait_ready(f"http://127.0.0.1:{port}/readyz", proc, service)
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
