"""The bus client's CPU per message sent, in each of the ways PAI services send them.

    python benchmarks/bus_send.py [--messages 3000] [--repeat 3] [--profile] [--only PHASE]

Starts a nats-server (PAI's users and permissions, store bootstrapped), then a
client process of its own (`Bus`, as a service connects) that measures its own
CPU time (user + system) per message over these phases (the harness:
bus_client_cpu.py):

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
from libs.common.bus import Bus, get_json
from libs.common.messages import StopRequested
from libs.common.subjects import Bucket, Durable, Kind

BATCH = 200
CONCURRENT = 100


async def send(bus: Bus, phases: Phases) -> None:
    messages, phase = phases.messages, phases.phase

    async def consume_backlog(durable: Durable, one_by_one: bool) -> None:
        backlog = Backlog(messages)
        if one_by_one:
            await bus.consume(durable, [Kind.JOB_STOP_REQUESTED], [StopRequested], backlog.one,
                              stopping=backlog.stopping)
        else:
            await bus.consume_batches(durable, [Kind.JOB_STOP_REQUESTED], [StopRequested], backlog.batch,
                                      stopping=backlog.stopping)

    events = stop_events(messages, "a")
    with phase("publish_many"):
        for start in range(0, messages, BATCH):
            await bus.publish_many(events[start:start + BATCH])
    with phase("acks_batched"):
        await consume_backlog(Durable.MONITOR, one_by_one=False)
    with phase("acks_one_by_one"):
        await consume_backlog(Durable.RUNTIME, one_by_one=True)

    events = stop_events(messages, "p")
    with phase("publish"):
        for event in events:
            await bus.publish(event)
    events = stop_events(messages, "q")
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


if __name__ == "__main__":
    main(__file__, send, default_messages=3000)
