"""What the bus client benchmarks share (bus_receive.py, bus_send.py): a nats-server
with PAI's users and permissions, a client process of its own (`Bus`, as a service
connects) that times its own CPU per message over named phases, and the server's
CPU over the whole client run.

nats-server runs in a process of its own, so the phases' figures are the client's
only; `nats_server_all_phases` is the server's CPU over the whole client run, per
message of one phase. `--profile` runs the client under cProfile and prints where
its time went; `--only PHASE` (repeatable) times, and profiles, those phases alone,
and the client stops once they are done (a phase still runs the ones before it, which
it may need: a backlog to consume). Prints JSON per run: client CPU microseconds per
message, per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import resource
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


def _system_seconds() -> float:
    """The process's CPU time in the kernel so far (sends, receives, polls)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


class PhasesDone(Exception):
    """Every phase asked for (`--only`) is timed: the client skips the rest."""


class Phases:
    """The client's CPU time per message, phase by phase."""

    def __init__(self, messages: int, profile: bool, only: frozenset[str] = frozenset(), split: bool = False):
        self.messages = messages
        self.profiler = cProfile.Profile() if profile else None
        self.only = only  # the phases timed; empty: all
        self.split = split  # also each phase's system CPU and garbage collection time
        self.figures: dict[str, float] = {}
        self._gc_seconds = 0.0
        self._gc_started = 0.0
        if split:
            gc.callbacks.append(self._time_gc)

    def _time_gc(self, stage: str, info: dict[str, int]) -> None:
        if stage == "start":
            self._gc_started = time.process_time()
        else:
            self._gc_seconds += time.process_time() - self._gc_started

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        timed = not self.only or name in self.only
        if self.profiler and timed:
            self.profiler.enable()
        start, start_system, start_gc = time.process_time(), _system_seconds(), self._gc_seconds
        yield
        spent = time.process_time() - start
        if self.profiler and timed:
            self.profiler.disable()
        if timed:
            self.figures[name] = round(spent / self.messages * 1e6, 1)
            if self.split:
                self.figures[f"{name}:system"] = round((_system_seconds() - start_system) / self.messages * 1e6, 1)
                self.figures[f"{name}:gc"] = round((self._gc_seconds - start_gc) / self.messages * 1e6, 1)
        if self.only and self.only <= self.figures.keys():
            raise PhasesDone


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
    with contextlib.suppress(PhasesDone):
        await run(bus, phases)
    await bus.close()
    if phases.profiler:
        pstats.Stats(phases.profiler, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    return phases.figures


def _run_once(script: str, messages: int, profile: bool, only: list[str], split: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with NatsServer(root / "store", auth=load_or_create_credentials(root / "creds.json")) as nats:
            nats.bootstrap()
            server_before = cpu_seconds(nats.proc.pid)
            child = subprocess.run(
                [sys.executable, script, "--child", nats.url, json.dumps(nats.login(busauth.PLATFORM)),
                 "--messages", str(messages), *(["--profile"] if profile else []),
                 *(arg for phase in only for arg in ("--only", phase)), *(["--split"] if split else [])],
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
    parser.add_argument("--only", action="append", default=[], metavar="PHASE",
                        help="time (and profile) this phase alone, and those given with other --only")
    parser.add_argument("--split", action="store_true",
                        help="also each phase's system CPU (<phase>:system) and garbage collection (<phase>:gc)")
    parser.add_argument("--child", nargs=2, metavar=("URL", "LOGIN"))
    args = parser.parse_args()
    if args.child:
        url, login = args.child
        phases = Phases(args.messages, args.profile, frozenset(args.only), args.split)
        print(json.dumps(asyncio.run(_client(url, json.loads(login), phases, run))))
        return
    for _ in range(args.repeat):
        print(json.dumps({"us_per_message": _run_once(script, args.messages, args.profile, args.only, args.split)}), flush=True)
