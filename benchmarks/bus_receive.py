"""The bus client's CPU per message received, in each of the ways PAI services receive them.

    python benchmarks/bus_receive.py [--messages 4000] [--repeat 3] [--profile]

Starts a nats-server (PAI's users and permissions, store bootstrapped), then a
client process of its own (`Bus`, as a service connects) that measures its own
CPU time (user + system) over these phases (the harness: bus_client_cpu.py):

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

Prints JSON per run: client CPU microseconds per message, per phase, and
nats-server's over all phases (`nats_server_all_phases`); `--profile` prints
where the client's time went.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bus_client_cpu import Backlog, Phases, main, stop_events
from libs.common.bus import Bus
from libs.common.messages import StopRequested
from libs.common.subjects import Bucket, Durable, Kind

BATCH = 200


async def receive(bus: Bus, phases: Phases) -> None:
    messages, phase = phases.messages, phases.phase
    events = stop_events(messages, "j")
    with phase("pubacks"):
        for start in range(0, messages, BATCH):
            await bus.publish_many(events[start:start + BATCH])

    backlog = Backlog(messages)
    with phase("deliveries"):
        await bus.consume_batches(Durable.MONITOR, [Kind.JOB_STOP_REQUESTED], [StopRequested], backlog.batch,
                                  stopping=backlog.stopping)

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
        bus.link.apply_on_arrival(sub, on_entry)
        await all_seen.wait()
    await sub.unsubscribe()

    with phase("requests"):
        for _ in range(0, messages, 100):
            await asyncio.gather(*(bus.nc.request("$JS.API.INFO", b"", timeout=10) for _ in range(100)))


if __name__ == "__main__":
    main(__file__, receive, default_messages=4000)
