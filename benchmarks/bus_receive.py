"""The bus client's CPU per message received, in each of the ways PAI services receive them.

    python benchmarks/bus_receive.py [--messages 4000] [--repeat 3] [--profile]

Starts a nats-server (PAI's users and permissions, store bootstrapped), then a
client process of its own (`Bus`, as a service connects) that measures its own
CPU time (user + system) over three phases:

- `pubacks`: `publish_many` of `messages` events in batches of 200: each
  publish is sent and its PubAck received on the batch inbox;
- `deliveries`: `consume_batches` with a no-op handler over those events (a
  backlog): JetStream deliveries with their reply subject, pull answers ending
  in a status message, one ack sent per event;
- `watch`: a KV watch (the ordered push consumer rest's job index runs, applied
  on arrival) over a bucket of `messages` keys;
- `requests`: nats-py requests (`nc.request`, as nats-py's single publishes and
  KV reads make them), 100 at a time, answered by nats-server itself
  (`$JS.API.INFO`): the request sent and its answer received.

nats-server runs in a process of its own, so the figures are the client's only;
`nats_server_all_phases` is the server's CPU over the whole client run, per message.
`--profile` runs the client under cProfile and prints where its time went.

Prints JSON per run: client CPU microseconds per message, per phase.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.feeding import cpu_seconds
from libs.common import busauth, telemetry
from libs.common.bus import Bus, apply_on_arrival
from libs.common.busauth import load_or_create_credentials
from libs.common.ids import EventId, JobId, VcName
from libs.common.messages import StopRequested
from libs.common.natsserver import NatsServer
from libs.common.subjects import Bucket, Durable, Kind

BATCH = 200


async def client(url: str, login: dict[str, str], messages: int, profile: bool) -> dict[str, float]:
    telemetry.setup("bench-client", level="ERROR")  # as a service sets itself up: no spans exported
    bus = await Bus.connect(url, name="bench-client", **login)
    profiler = cProfile.Profile() if profile else None
    figures: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str):
        if profiler:
            profiler.enable()
        start = time.process_time()
        yield
        figures[name] = round((time.process_time() - start) / messages * 1e6, 1)
        if profiler:
            profiler.disable()

    events = [StopRequested(id=EventId(f"bench/{n}/stop"), job=JobId(f"bench~j{n}"), vc=VcName("default"), by="bench")
              for n in range(messages)]
    with phase("pubacks"):
        for start in range(0, messages, BATCH):
            await bus.publish_many(events[start:start + BATCH])

    handled = 0
    stopping = asyncio.Event()

    async def count(batch) -> None:
        nonlocal handled
        handled += len(batch)
        if handled >= messages:
            stopping.set()

    with phase("deliveries"):
        await bus.consume_batches(Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], [StopRequested], count, stopping=stopping)

    value = b'{"state": "RUNNING", "padding": "' + b"x" * 300 + b'"}'
    for start in range(0, messages, BATCH):
        await bus.kv_write_many(Bucket.JOB_STATUS, {f"u.j{n}": value for n in range(start, min(start + BATCH, messages))})
    seen = 0
    all_seen = asyncio.Event()

    def on_entry(msg) -> None:
        nonlocal seen
        seen += 1
        if seen >= messages:
            all_seen.set()

    with phase("watch"):
        sub = await bus.js.subscribe(f"$KV.{Bucket.JOB_STATUS.value}.>", stream=f"KV_{Bucket.JOB_STATUS.value}",
                                     ordered_consumer=True, deliver_policy="last_per_subject")
        apply_on_arrival(sub, on_entry)
        await all_seen.wait()
    await sub.unsubscribe()

    with phase("requests"):
        for _ in range(0, messages, 100):
            await asyncio.gather(*(bus.nc.request("$JS.API.INFO", b"", timeout=10) for _ in range(100)))
    await bus.close()
    if profiler:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    return figures


def run_once(messages: int, profile: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with NatsServer(root / "store", auth=load_or_create_credentials(root / "creds.json")) as nats:
            nats.bootstrap()
            server_before = cpu_seconds(nats.proc.pid)
            child = subprocess.run(
                [sys.executable, __file__, "--child", nats.url, json.dumps(nats.login(busauth.PLATFORM)),
                 "--messages", str(messages), *(["--profile"] if profile else [])],
                stdout=subprocess.PIPE, check=True, env=os.environ)
            figures = json.loads(child.stdout)
            # The server's side of all four phases, per message of one phase: what the
            # client's way of reading may change in the server's (write sizes, wake-ups).
            figures["nats_server_all_phases"] = round((cpu_seconds(nats.proc.pid) - server_before) / messages * 1e6, 1)
            return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("URL", "LOGIN"))
    args = parser.parse_args()
    if args.child:
        url, login = args.child
        print(json.dumps(asyncio.run(client(url, json.loads(login), args.messages, args.profile))))
        return
    for _ in range(args.repeat):
        print(json.dumps({"us_per_message": run_once(args.messages, args.profile)}), flush=True)


if __name__ == "__main__":
    main()
