"""A thousand node agents connecting at once, then reconnecting after NATS restarts.

Each agent is a `Bus.connect` as the `monitor` user (what the node agent runs),
against a local nats-server with PAI's users and permissions. Phases:

- `one_agent_alone`: one connect with nothing else going on, the server's CPU for it;
- `connect`: every agent starts connecting at the same instant; time until the last
  one is connected (its first round trip answered), and nats-server's CPU seconds;
- `reconnect` (nkeys only): nats-server is killed -9 and started again on the same
  port and store; time from its start until every agent has reconnected and
  answered a round trip, and the server's CPU over that (the jittered backoff of
  libs/common/reconnect.py spreads the agents over its window).

Both for PAI's nkeys (`after`) and, with fewer agents, for the bcrypt passwords
(cost 11) PAI used before (`before`): each connect then costs the server a bcrypt
check. Every phase is bounded by --timeout; agents not connected by then are
counted, not waited for. Prints one JSON object.

    python benchmarks/agents_reconnect.py [--agents 1000] [--before-agents 50] [--timeout 90]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.feeding import cpu_seconds  # noqa: E402
from libs.common import busauth  # noqa: E402
from libs.common.bus import Bus  # noqa: E402
from libs.common.natsserver import NatsServer, binary  # noqa: E402

AGENT_USER = "monitor"  # the node agent logs in as the monitor


class BcryptServer(NatsServer):
    """nats-server whose monitor user has a bcrypt password (cost 11), as PAI's
    configuration had before nkeys."""

    def __init__(self, store_dir: Path, password: str):
        super().__init__(store_dir)
        self.password = password

    def start(self) -> NatsServer:
        import subprocess

        import bcrypt

        from libs.common.natsserver import wait_for_port

        self.store_dir.mkdir(parents=True, exist_ok=True)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(11)).decode()
        config = busauth.server_config(None, host=self.host, port=self.port, store_dir=self.store_dir)
        config["authorization"] = {
            "users": [{"user": AGENT_USER, "password": hashed, "permissions": busauth.permissions_block(AGENT_USER)}]
        }
        conf = busauth.write_server_config(self.config_file, config)
        self.proc = subprocess.Popen([binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for_port(self.host, self.port)
        return self


async def connect_all(url: str, login: dict, agents: int, timeout: float) -> tuple[list[Bus], list[float], int]:
    """Start `agents` connects at once; the seconds each took, and how many failed."""
    start = time.monotonic()

    async def one(i: int) -> tuple[Bus, float]:
        bus = await Bus.connect(url, name=f"agent-{i}", connect_timeout=timeout, **login)
        await bus.round_trip()
        return bus, time.monotonic() - start

    tasks = [asyncio.create_task(one(i)) for i in range(agents)]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    buses, times, failed = [], [], len(pending)
    for task in done:
        if task.exception() is not None:
            failed += 1
        else:
            bus, took = task.result()
            buses.append(bus)
            times.append(took)
    return buses, times, failed


def summary(times: list[float], failed: int, agents: int, server_cpu: float) -> dict:
    times = sorted(times)
    return {
        "agents": agents,
        "connected": len(times),
        "not_connected": failed,
        "all_connected_seconds": round(times[-1], 3) if times and not failed else None,
        "p50_seconds": round(times[len(times) // 2], 3) if times else None,
        "server_cpu_seconds": round(server_cpu, 3),
        "server_cpu_ms_per_connect": round(1000 * server_cpu / max(1, len(times)), 3),
    }


async def one_alone(server: NatsServer, login: dict, timeout: float) -> dict:
    """One connect with nothing else going on: what it costs the server."""
    cpu_before = cpu_seconds(server.pid)
    buses, times, failed = await connect_all(server.url, login, 1, timeout)
    result = summary(times, failed, 1, cpu_seconds(server.pid) - cpu_before)
    await close_all(buses)
    return {"seconds": result["all_connected_seconds"], "server_cpu_ms": result["server_cpu_ms_per_connect"]}


async def close_all(buses: list[Bus]) -> None:
    await asyncio.gather(*(bus.close() for bus in buses), return_exceptions=True)


async def reconnect_phase(server: NatsServer, buses: list[Bus], timeout: float) -> dict:
    server.stop(kill=True)
    await asyncio.sleep(1.0)  # every agent has noticed and is backing off
    server.start()
    start, cpu_before = time.monotonic(), cpu_seconds(server.pid)
    deadline = start + timeout
    back: list[float] = []

    async def wait_back(bus: Bus) -> None:
        while time.monotonic() < deadline:
            if bus.nc.is_connected:
                try:
                    await bus.round_trip()
                    back.append(time.monotonic() - start)
                    return
                except Exception:  # noqa: BLE001 - still reconnecting
                    pass
            await asyncio.sleep(0.05)

    await asyncio.gather(*(wait_back(bus) for bus in buses))
    return summary(back, len(buses) - len(back), len(buses), cpu_seconds(server.pid) - cpu_before)


async def run_after(root: Path, agents: int, timeout: float) -> dict:
    credentials = busauth.load_or_create_credentials(root / "nats-credentials.json")
    server = NatsServer(root / "store", auth=credentials).start()
    try:
        result = {"one_agent_alone": await one_alone(server, server.login(AGENT_USER), timeout)}
        cpu_before = cpu_seconds(server.pid)
        buses, times, failed = await connect_all(server.url, server.login(AGENT_USER), agents, timeout)
        result["connect"] = summary(times, failed, agents, cpu_seconds(server.pid) - cpu_before)
        result["reconnect"] = await reconnect_phase(server, buses, timeout)
        await close_all(buses)
        return result
    finally:
        server.stop(kill=True)


async def run_before(root: Path, agents: int, timeout: float) -> dict:
    server = BcryptServer(root / "store", password="agent-password-of-the-bcrypt-era").start()
    try:
        login = {"user": AGENT_USER, "password": server.password}
        result = {"one_agent_alone": await one_alone(server, login, timeout)}
        cpu_before = cpu_seconds(server.pid)
        buses, times, failed = await connect_all(server.url, login, agents, timeout)
        result["connect"] = summary(times, failed, agents, cpu_seconds(server.pid) - cpu_before)
        await close_all(buses)
        return result
    finally:
        server.stop(kill=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000, help="agents with nkeys (PAI today)")
    parser.add_argument("--before-agents", type=int, default=50, help="agents with bcrypt passwords (0: skip)")
    parser.add_argument("--timeout", type=float, default=90.0, help="bound of each phase, seconds")
    args = parser.parse_args()
    logging_quiet()
    out: dict = {"auth": "nkeys (ed25519)", "user": AGENT_USER}
    with tempfile.TemporaryDirectory(prefix="pai-agents-") as tmp:
        out["after"] = await run_after(Path(tmp) / "after", args.agents, args.timeout)
        if args.before_agents:
            try:
                out["before_bcrypt"] = await run_before(Path(tmp) / "before", args.before_agents, args.timeout)
            except ImportError:
                out["before_bcrypt"] = "skipped: the bcrypt package is not installed"
    print(json.dumps(out, indent=2))


def logging_quiet() -> None:
    """Agents waiting on a server that is away log each try; keep the JSON readable."""
    import logging

    logging.basicConfig(level=logging.ERROR)


if __name__ == "__main__":
    asyncio.run(main())
