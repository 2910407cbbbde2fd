"""The bus client's CPU per message sent, in each of the ways PAI services send them.

    python benchmarks/bus_send.py [--messages 3000] [--repeat 3] [--profile]

Starts a nats-server (PAI's users and permissions, store bootstrapped), then a
client process of its own (`Bus`, as a service connects) that measures its own
CPU time (user + system) per message over these phases:

- `publish_many`: `Bus.publish_many` of `messages` events in batches of 200
  (each publish sent and its PubAck received on the batch inbox);
- `acks_batched`: `consume_batches` with a no-op handler over a backlog of
  `messages` events (pulled in batches of up to 256, every one acked after its
  batch's handler returned): a delivery received and an ack sent per event;
- `acks_one_by_one`: `consume` (one event at a time) over another backlog: a
  pull request, a delivery and an ack per event;
- `publish`: `Bus.publish`, one event at a time (as a handler publishes one
  event): a JetStream publish and its PubAck;
- `publish_concurrent`: `Bus.publish`, 100 at a time (`asyncio.gather`);
- `kv_create`: `KeyValue.create` of new keys, one at a time;
- `kv_update`: `KeyValue.update` of those keys with their last revision, 100 at a time;
- `kv_get`: `get_json` of those keys, one at a time (a JetStream API request,
  `STREAM.MSG.GET`, and its answer);
- `kv_write_many`: `Bus.kv_write_many` of those keys in batches of 200.

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
from libs.common.bus import Bus, get_json
from libs.common.busauth import load_or_create_credentials
from libs.common.ids import EventId, JobId, VcName
from libs.common.messages import StopRequested
from libs.common.natsserver import NatsServer
from libs.common.subjects import Bucket, Durable, Kind

BATCH = 200
CONCURRENT = 100


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

    def stops(prefix: str) -> list[StopRequested]:
        return [StopRequested(id=EventId(f"{prefix}/{n}/stop"), job=JobId(f"bench~{prefix}{n}"), vc=VcName("default"),
                              by="bench") for n in range(messages)]

    async def consume_backlog(durable: Durable, one_by_one: bool) -> None:
        handled = 0
        stopping = asyncio.Event()

        async def count(batch) -> None:
            nonlocal handled
            handled += len(batch)
            if handled >= messages:
                stopping.set()

        async def count_one(event) -> None:
            await count([event])

        if one_by_one:
            await bus.consume(durable, [Kind.JOB_STOP_REQUESTED], [StopRequested], count_one, stopping=stopping)
        else:
            await bus.consume_batches(durable, [Kind.JOB_STOP_REQUESTED], [StopRequested], count, stopping=stopping)

    events = stops("a")
    with phase("publish_many"):
        for start in range(0, messages, BATCH):
            await bus.publish_many(events[start:start + BATCH])
    with phase("acks_batched"):
        await consume_backlog(Durable.MONITOR, one_by_one=False)
    with phase("acks_one_by_one"):
        await consume_backlog(Durable.RUNTIME, one_by_one=True)

    events = stops("p")
    with phase("publish"):
        for event in events:
            await bus.publish(event)
    events = stops("q")
    with phase("publish_concurrent"):
        for start in range(0, messages, CONCURRENT):
            await asyncio.gather(*(bus.publish(event) for event in events[start:start + CONCURRENT]))

    kv = await bus.kv(Bucket.JOB_STATUS)
    value = b'{"state": "RUNNING", "padding": "' + b"x" * 300 + b'"}'
    keys = [f"u.j{n}" for n in range(messages)]
    revisions = {}
    with phase("kv_create"):
        for key in keys:
            revisions[key] = await kv.create(key, value)
    with phase("kv_update"):
        for start in range(0, messages, CONCURRENT):
            chunk = keys[start:start + CONCURRENT]
            await asyncio.gather(*(kv.update(key, value, last=revisions[key]) for key in chunk))
    with phase("kv_get"):
        for key in keys:
            await get_json(kv, key, dict)
    with phase("kv_write_many"):
        for start in range(0, messages, BATCH):
            await bus.kv_write_many(Bucket.JOB_STATUS, {key: value for key in keys[start:start + BATCH]})
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
            figures["nats_server_all_phases"] = round((cpu_seconds(nats.proc.pid) - server_before) / messages * 1e6, 1)
            return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=3000)
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
