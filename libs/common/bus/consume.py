"""Consuming on the bus: a durable pull consumer implementing PAI's ack rules.

Ack rules (docs/architecture.md, "The bus"):
- a handler returns normally        -> ack (its effect is durable by then);
- it raises `errors.BadInput`, or the message does not decode -> term, reason logged;
- it raises `errors.Transient` or a NATS timeout -> nak with a growing delay;
- anything else is a bug: logged loudly, then re-raised so the process exits and
  is restarted; the message is redelivered to the next incarnation.

No poison message: an event whose handler fails on its `DEAD_LETTER_AFTER`-th
delivery (a bug that repeats, or a transient failure that never clears) is
terminated and announced as `EventDeadLettered`, so the service goes on and
the events behind it flow again; the launcher ends the event's job FAILED with
an exit spec saying why, and the monitor raises an alert. JetStream's own
`max_deliver` is the backstop for a handler that kills its process outright.

Batches (`consume_batches`): every event waiting, up to a bound, is fetched with
one pull request and handed to the handler at once, so a core decides once per
batch and writes each key once; the batch is acked only after the handler
returned, i.e. after every effect of every event in it is durable. A crash
before the acks redelivers the whole batch, which idempotent handlers apply as
nothing new. A batch whose handler raises is handed again one event at a time
under the per-event rules above, so one bad event never takes its neighbours
with it. When idle a batch is one event: batching adds no latency.

Ordered consumers (the single-active scheduler and launcher) must see events in
stream order, across crashes too. They allow a batch's worth of unacked events
(`max_ack_pending`), never give one back while running (a failing event is
retried in place, the events behind it waiting, instead of nak'ed: a nak'ed
event would come back after newer ones), and at start-up, while events of the
previous incarnation are still unacked, allow only as many as are still out,
taken one by one, until every one of them came back and was handled
(`consume_batches`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js import api

from libs.common import telemetry
from libs.common.bus.link import Received, ack_all, keep_in_progress
from libs.common.bus.publish import Publisher
from libs.common.bus.pull import Puller, delivery
from libs.common.errors import BadInput, Transient
from libs.common.ids import EventId
from libs.common.messages import AnyEvent, Event, EventDeadLettered, decoder_for
from libs.common.subjects import STREAM, Durable, Kind, kind_filter

log = logging.getLogger("pai.bus")

# A message not acked within this time is redelivered (the handler died); a
# handler that runs longer keeps its message with `in_progress()` heartbeats.
ACK_WAIT_SECONDS = 5.0
HEARTBEAT_SECONDS = 2.0
PARALLEL_MAX_ACK_PENDING = 10_000
# Events fetched and handled together at most: enough that a core's decision and
# a key's write are shared by many events under load, small enough that a batch's
# handling stays well inside the ack deadline.
BATCH_MAX = 256
NAK_DELAYS = (0.2, 1.0, 5.0, 15.0, 60.0)
# An ordered consumer retries a failing event in place while the events behind
# it wait, so its retries come quickly and end at the dead-letter limit.
ORDERED_NAK_DELAYS = (0.2, 0.5, 1.0)
# The delivery on which a handler that still fails gives up (see module doc):
# five crashes and restarts, or about a minute and a half of retries.
DEAD_LETTER_AFTER = 5
TRANSIENT_DEAD_LETTER_AFTER = 12
# JetStream stops delivering after this many; above both limits, it only acts
# when the process died before it could dead-letter the event itself.
MAX_DELIVER = TRANSIENT_DEAD_LETTER_AFTER + 3
# A handler still at work after this long is stuck (a call that never returns, a
# lock never released): heartbeats would keep its event, and the events behind
# it, forever. It is cancelled -- the same as a crash mid-way, which handlers
# survive (idempotent, effects recorded before the ack) -- and its event is
# retried; on its `STALLED_DEAD_LETTER_AFTER`-th stall it is dead-lettered, so
# the events behind it wait at most about that many deadlines.
HANDLER_DEADLINE_SECONDS = 300.0
STALLED_DEAD_LETTER_AFTER = 3

Handler = Callable[[AnyEvent], Awaitable[None]]
BatchHandler = Callable[[list[AnyEvent]], Awaitable[None]]


class Consumer(Publisher):
    """The connection's durable consumers (module doc); a dead letter is published."""


    async def consume(
        self,
        durable: Durable,
        kinds: Sequence[Kind],
        types: Sequence[type[Event]],
        handler: Handler,
        *,
        stopping: asyncio.Event | None = None,
        ordered: bool = False,
        deadline: float = HANDLER_DEADLINE_SECONDS,
    ) -> None:
        """Run `handler` on every event of `kinds`, one at a time, until `stopping` is set."""

        async def one_at_a_time(events: list[AnyEvent]) -> None:
            for event in events:
                await handler(event)

        await self.consume_batches(
            durable, kinds, types, one_at_a_time, stopping=stopping, ordered=ordered, deadline=deadline, max_batch=1
        )

    async def consume_batches(
        self,
        durable: Durable,
        kinds: Sequence[Kind],
        types: Sequence[type[Event]],
        handler: BatchHandler,
        *,
        stopping: asyncio.Event | None = None,
        ordered: bool = False,
        max_batch: int = BATCH_MAX,
        deadline: float = HANDLER_DEADLINE_SECONDS,
        gather_seconds: float = 0.0,
    ) -> None:
        """Run `handler` on batches of the events of `kinds` until `stopping` is set.

        `handler(events)` gets every event waiting, up to `max_batch`, in stream
        order, and returns once all their effects are durable; then they are
        acked. If it raises, the same events are handed again one at a time
        (`handler([event])`) under the per-event rules (module doc). `ordered`
        keeps stream order across failures and crashes.

        `gather_seconds`, for a consumer no one waits on: after a batch that was
        not full, wait this long before asking for the next, so that under load
        the events of that time come as one batch rather than one or two at a
        time, each paying a pull, a dispatch and the handler's per-batch work.
        The first event after a quiet spell is handed over at once.
        """
        most_pending = max_batch if ordered else PARALLEL_MAX_ACK_PENDING
        # Events the previous run left unacked: while any is, the durable allows
        # exactly that many, so only they can be delivered (module doc).
        left_by_last_run = await self._unacked(durable) if ordered else 0
        await self._pull_subscription(durable, kinds, max_ack_pending=left_by_last_run or most_pending)
        puller = await Puller.open(self.nc, STREAM, durable.value)
        decoder = decoder_for(*types)
        stopping = stopping or asyncio.Event()
        try:
            while not stopping.is_set():
                # The previous run's events one by one: a pull the durable's bound keeps
                # from being answered in full stays open in the server, and would take
                # the first newer event once these are acked.
                msgs = await puller.next_batch(1 if left_by_last_run else max_batch)
                if not msgs:
                    continue
                if ordered and len(msgs) > 1:
                    msgs.sort(key=lambda msg: delivery(msg).stream_seq)
                await self._dispatch_batch(msgs, decoder, handler, durable, ordered, deadline)
                if left_by_last_run:
                    # Each was acked or terminated. Those still out may come back later
                    # than these (their ack wait began later): allow only them, so that
                    # no newer event overtakes them; none left, back to whole batches.
                    left_by_last_run = max(left_by_last_run - len(msgs), 0)
                    await self._pull_subscription(durable, kinds, max_ack_pending=left_by_last_run or most_pending)
                elif gather_seconds and len(msgs) < max_batch:
                    await asyncio.sleep(gather_seconds)
        finally:
            await puller.close()

    async def _unacked(self, durable: Durable) -> int:
        """Events of `durable` delivered and not yet acked (0 for a new durable)."""
        try:
            info = await self.js.consumer_info(STREAM, durable.value)
        except nats.js.errors.NotFoundError:
            return 0
        return info.num_ack_pending or 0

    async def _pull_subscription(self, durable: Durable, kinds: Sequence[Kind], *, max_ack_pending: int) -> None:
        """Create the durable, or update it in place (filters an upgrade added,
        its unacked bound): its position in the stream is kept, never replayed.

        An ordered consumer whose previous run left events unacked is allowed
        just that many until they are handled: they come back (after the ack
        wait) before anything newer, so the order holds across a crash."""
        filters = [kind_filter(k) for k in kinds]
        config = api.ConsumerConfig(
            durable_name=durable.value,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT_SECONDS,
            deliver_policy=api.DeliverPolicy.ALL,
            max_ack_pending=max_ack_pending,
            max_deliver=MAX_DELIVER,
            filter_subjects=filters if len(filters) > 1 else None,
            filter_subject=filters[0] if len(filters) == 1 else None,
        )
        await self.js.add_consumer(STREAM, config)

    async def _dispatch_batch(
        self,
        msgs: list[Received],
        decoder: msgspec.json.Decoder[Any],
        handler: BatchHandler,
        durable: Durable,
        ordered: bool,
        deadline: float,
    ) -> None:
        """Handle the batch whole and ack it; if that fails, event by event."""
        decoded: list[tuple[Received, AnyEvent]] = []
        for msg in msgs:
            try:
                decoded.append((msg, decoder.decode(msg.data)))
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                log.error(
                    "terminating undecodable message",
                    extra={"subject": msg.subject, "consumer": durable.value, "error": str(exc)},
                )
                await msg.term()
        if not decoded:
            return
        with kept_in_progress([msg for msg, _ in decoded]):
            # A redelivered event may be the one that failed before: it goes alone.
            if len(decoded) > 1 and all(delivery(msg).delivered == 1 for msg, _ in decoded):
                spans = ((f"{durable.value} {msg.subject}", msg.headers, event.job) for msg, event in decoded)
                try:
                    with telemetry.spans_from_headers(spans):
                        await within(deadline, handler([event for _, event in decoded]))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("a batch of %d events failed (%r); handling them one at a time", len(decoded), exc)
                else:
                    await ack_all([msg for msg, _ in decoded])
                    return
            for position, (msg, event) in enumerate(decoded):
                try:
                    await self._dispatch(msg, event, handler, durable, ordered, deadline)
                except BaseException:
                    if ordered:
                        # The process restarts; the events behind go back with it.
                        for later, _ in decoded[position + 1 :]:
                            with contextlib.suppress(Exception):
                                await later.nak()
                    raise

    async def _dispatch(
        self,
        msg: Received,
        event: AnyEvent,
        handler: BatchHandler,
        durable: Durable,
        ordered: bool,
        deadline: float,
    ) -> None:
        """One event under the ack rules (module doc). An ordered consumer retries
        in place what a parallel one gives back with a delay."""
        delays = ORDERED_NAK_DELAYS if ordered else NAK_DELAYS
        deliveries = delivery(msg).delivered
        while True:
            with telemetry.span_from_headers(f"{durable.value} {msg.subject}", msg.headers, job=event.job):
                try:
                    await within(deadline, handler([event]))
                except HandlerStalled as exc:
                    if deliveries >= STALLED_DEAD_LETTER_AFTER:
                        await self._dead_letter(msg, event, durable, deliveries, f"stalled {deliveries} times: {exc}")
                        return
                    problem = str(exc)
                except BadInput as exc:
                    log.error("terminating bad event %s: %s", event.id, exc.message, extra={"job": event.job})
                    await msg.term()
                    return
                except (Transient, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
                    if deliveries >= TRANSIENT_DEAD_LETTER_AFTER:
                        await self._dead_letter(msg, event, durable, deliveries,
                                                f"still failing after {deliveries} tries: {exc!r}")
                        return
                    problem = repr(exc)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if deliveries >= DEAD_LETTER_AFTER:
                        log.exception("bug while handling %s, for the %d. time; giving up on it", event.id, deliveries,
                                      extra={"job": event.job})
                        await self._dead_letter(msg, event, durable, deliveries, f"{type(exc).__name__}: {exc}")
                        return
                    log.exception("bug while handling %s; exiting so the service restarts", event.id, extra={"job": event.job})
                    # Back to the stream at once, so the next incarnation need not
                    # wait out the ack deadline to meet it again.
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=delays[0])
                    raise
                else:
                    await msg.ack()
                    return
            delay = delays[min(deliveries - 1, len(delays) - 1)]
            log.warning("retrying %s in %.1fs: %s", event.id, delay, problem, extra={"job": event.job})
            if not ordered:
                await msg.nak(delay=delay)
                return
            await asyncio.sleep(delay)
            deliveries += 1

    async def _dead_letter(self, msg: Received, event: Event, durable: Durable, deliveries: int, reason: str) -> None:
        """Announce, then terminate: a crash in between redelivers the event, and the
        announcement's id makes the second one a duplicate JetStream drops."""
        if not isinstance(event, EventDeadLettered):  # never announce the announcement
            await self.publish(
                EventDeadLettered(
                    id=EventId(f"{event.id}/dead-lettered/{durable.value}"),
                    job=event.job,
                    cause=event.id,
                    at=time.time(),
                    consumer=durable.value,
                    eventId=event.id,
                    eventKind=str(event.__struct_config__.tag),
                    subject=msg.subject,
                    deliveries=deliveries,
                    reason=reason[:2000],
                )
            )
        log.error("dead-lettered %s after %d deliveries: %s", event.id, deliveries, reason, extra={"job": event.job})
        await msg.term()


class HandlerStalled(Exception):
    """A handler ran past its deadline and was cancelled."""


async def within(deadline: float, work: Awaitable[None]) -> None:
    """Await `work`, cancelling it after `deadline` seconds (HandlerStalled).

    In the caller's task, under one timer (no task of its own per batch). Not
    `asyncio.wait_for`: its TimeoutError could not be told apart from a NATS
    timeout the handler itself raised, which is retried as transient; the
    timeout's own `expired()` can.

    A consumer cancelled while its handler finished (the service stopping, a
    test's stand-in for a crash) stops here, before any ack: the cancellation
    would otherwise land only after the acks, which never wait."""
    limit = asyncio.timeout(deadline)
    try:
        async with limit:
            await work
    except Exception:
        if not limit.expired():
            raise
    else:
        if not limit.expired():
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            return
    raise HandlerStalled(f"handler still running after its {deadline:g}s deadline; cancelled")


@contextlib.contextmanager
def kept_in_progress(msgs: list[Received]) -> Iterator[None]:
    """While the block runs, tell JetStream every `HEARTBEAT_SECONDS` that the handler
    is still at work on `msgs`, so it does not redeliver them. Most batches end
    long before the first beat: a timer until then, a task only after."""
    beating: list[asyncio.Task[None]] = []
    first_beat = asyncio.get_running_loop().call_later(
        HEARTBEAT_SECONDS, lambda: beating.append(asyncio.ensure_future(_keep_in_progress(msgs)))
    )
    try:
        yield
    finally:
        first_beat.cancel()
        for task in beating:
            task.cancel()


async def _keep_in_progress(msgs: list[Received]) -> None:
    while True:
        await keep_in_progress(msgs)
        await asyncio.sleep(HEARTBEAT_SECONDS)

