"""rest's history projection: the durable pull consumer `history` on PAI_EVENTS.

Each batch of events is projected (pure, `projection`) and applied in one
transaction that also records the highest stream sequence applied (`store`); the
events are acked only after that transaction committed. A crash before the commit
leaves no row and no ack: the events come back and are applied then. A crash after
the commit and before the ack applies them again, which changes nothing (the
operations are idempotent). Rest replicas may share the durable: each batch goes
to one of them, and the sequence guards keep an older event from undoing a newer
one applied by another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors
import nats.js.errors
from nats.js import api
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from libs.common.bus import Bus, Puller, ack_all, delivery, kept_in_progress
from libs.common.errors import Transient
from libs.common.messages import decoder_for
from libs.common.subjects import STREAM, Durable, kind_filter
from services.rest.history import projection, store

log = logging.getLogger("pai.rest.history")

BATCH_MAX = 512
# After a batch that did not fill, how long events gather before the next one.
GATHER_SECONDS = 0.25
# Long enough for a batch's transaction on a busy database; the batch is kept in
# progress while it runs, so this bounds only a consumer that vanished.
ACK_WAIT_SECONDS = 10.0
# The database did not take a batch: its events come back after these (growing).
RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0)
# In flight at once across the replicas sharing the durable.
MAX_ACK_PENDING = 10_000

_decoder = decoder_for(*projection.TYPES)


async def ensure_durable(bus: Bus, *, ack_wait: float = ACK_WAIT_SECONDS) -> None:
    """Create the durable, or update it in place (its position is kept)."""
    filters = [kind_filter(kind) for kind in projection.KINDS]
    await bus.js.add_consumer(STREAM, api.ConsumerConfig(
        durable_name=Durable.HISTORY.value,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        deliver_policy=api.DeliverPolicy.ALL,
        max_ack_pending=MAX_ACK_PENDING,
        max_deliver=-1,  # a database away for a day must not cost an event: it waits
        filter_subjects=filters,
    ))


async def handle(bus: Bus, engine: AsyncEngine, msgs: list, *,
                 apply_batch: Callable[..., Awaitable[None]] = store.apply_batch) -> None:
    """Project and apply one batch, then ack it. A message that is no event of ours is
    terminated (it would fail the same way forever)."""
    batch: list[tuple[int, object]] = []
    good = []
    for msg in msgs:
        try:
            event = _decoder.decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.error("history: terminating undecodable message on %s: %s", msg.subject, exc)
            await msg.term()
            continue
        batch.append((delivery(msg).stream_seq, event))
        good.append(msg)
    if not batch:
        return
    batch.sort(key=lambda item: item[0])  # stream order within the batch
    ops = projection.project_batch(batch)  # type: ignore[arg-type]
    with kept_in_progress(good):
        await apply_batch(engine, ops, batch[-1][0], len(batch))
    await ack_all(good)


async def run(bus: Bus, engine: AsyncEngine, stopping: asyncio.Event, *, ack_wait: float = ACK_WAIT_SECONDS,
              apply_batch: Callable[..., Awaitable[None]] = store.apply_batch) -> None:
    """Project events into the database until `stopping`; NATS or database trouble
    is waited out (the events stay in the stream, unacked)."""
    failures = 0
    while not stopping.is_set():
        puller = None
        try:
            await ensure_durable(bus, ack_wait=ack_wait)
            puller = await Puller.open(bus.nc, STREAM, Durable.HISTORY.value)
            while not stopping.is_set():
                msgs = await puller.next_batch(BATCH_MAX)
                if not msgs:
                    continue
                try:
                    await handle(bus, engine, msgs, apply_batch=apply_batch)
                    failures = 0
                    if len(msgs) < BATCH_MAX:
                        # Let what arrives meanwhile gather: a burst's events go in a few
                        # large transactions, not one each (a commit costs far more than
                        # a row). The list overlays what the history has not yet.
                        await asyncio.sleep(GATHER_SECONDS)
                except (SQLAlchemyError, OSError) as exc:
                    delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                    failures += 1
                    log.warning("history: the database did not take %d events (%r); again in %.1fs",
                                len(msgs), exc, delay)
                    for msg in msgs:
                        with contextlib.suppress(Exception):
                            await msg.nak(delay=delay)
                    await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, Transient, nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("history: the consumer stopped (%r); starting it again", exc)
            await asyncio.sleep(1.0)
        finally:
            if puller is not None:
                await puller.close()


