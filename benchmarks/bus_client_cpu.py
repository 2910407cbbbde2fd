"""What the bus client benchmarks share (bus_receive.py, bus_send.py): a nats-server
with PAI's users and permissions, a client process of its own (`Bus`, as a service
connects) that times its own CPU per message over named phases, and the server's
CPU over the whole client run.

nats-server runs in a process of its own, so the phases' figures are the client's
only; `nats_server_all_phases` is the server's CPU over the whole client run, per
message of one phase. `--profile` runs the client under cProfile and prints where
its time went. Prints JSON per run: client CPU microseconds per message, per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from benchmarks.feeding import cpu_seconds
from libs.common import busauth, telemetry
from libs.common.bus import Bus
from libs.common.busauth import load_or_create_credentials
from libs.common.ids import EventId, JobId, VcName
from libs.common.messages import StopRequested
from libs.common.natsserver import NatsServer


class Phases:
    """The client's CPU time per message, phase by phase."""

    def __init__(self, messages: int, profile: bool):
        self.messages = messages
        self.profiler = cProfile.Profile() if profile else None
        self.figures: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.profiler:
            self.profiler.enable()
        start = time.process_time()
        yield
        self.figures[name] = round((time.process_time() - start) / self.messages * 1e6, 1)
        if self.profiler:
            self.profiler.disable()


def stop_events(messages: int, prefix: str) -> list[StopRequested]:
    """`messages` distinct events to publish and consume (ids and jobs named with `prefix`)."""
    return [StopRequested(id=EventId(f"{prefix}/{n}/stop"), job=JobId(f"bench~{prefix}{n}"), vc=VcName("default"),
                          by="bench") for n in range(messages)]


class Backlog:
    """Handlers that count what a consumer hands them and set `stopping` once
    `expected` events were handled: a consumer run over a backlog of known size."""

    def __init__(self, expected: int):
        self.expected = expected
        self.handled = 0
        self.stopping = asyncio.Event()

    async def batch(self, events: list) -> None:
        self.handled += len(events)
        if self.handled >= self.expected:
            self.stopping.set()

    async def one(self, event) -> None:
        await self.batch([event])


# What a benchmark runs in the client: its phases, timed with `Phases.phase`.
ClientPhases = Callable[[Bus, Phases], Awaitable[None]]


async def _client(url: str, login: dict[str, str], phases: Phases, run: ClientPhases) -> dict[str, float]:
    telemetry.setup("bench-client", level="ERROR")  # as a service sets itself up: no spans exported
    bus = await Bus.connect(url, name="bench-client", **login)
    await run(bus, phases)
    await bus.close()
    if phases.profiler:
        pstats.Stats(phases.profiler, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    return phases.figures


def _run_once(script: str, messages: int, profile: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with NatsServer(root / "store", auth=load_or_create_credentials(root / "creds.json")) as nats:
            nats.bootstrap()
            server_before = cpu_seconds(nats.proc.pid)
            child = subprocess.run(
                [sys.executable, script, "--child", nats.url, json.dumps(nats.login(busauth.PLATFORM)),
                 "--messages", str(messages), *(["--profile"] if profile else [])],
                stdout=subprocess.PIPE, check=True, env=os.environ)
            figures = json.loads(child.stdout)
            # The server's side of all phases, per message of one phase: what the
            # client's way of sending and reading may change in the server's.
            figures["nats_server_all_phases"] = round((cpu_seconds(nats.proc.pid) - server_before) / messages * 1e6, 1)
            return figures


def main(script: str, run: ClientPhases, *, default_messages: int) -> None:
    """The command line of a bus client benchmark whose client runs `run`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=default_messages)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("URL", "LOGIN"))
    args = parser.parse_args()
    if args.child:
        url, login = args.child
        phases = Phases(args.messages, args.profile)
        print(json.dumps(asyncio.run(_client(url, json.loads(login), phases, run))))
        return
    for _ in range(args.repeat):
        print(json.dumps({"us_per_message": _run_once(script, args.messages, args.profile)}), flush=True)
