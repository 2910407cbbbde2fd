"""The JetStream bus: connection, idempotent bootstrap, deduplicated publish and a
durable pull consumer implementing PAI's ack rules.

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
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, NamedTuple

import msgspec
import nats
import nats.errors
import nats.js
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.kv import KV_PURGE, MSG_ROLLUP_SUBJECT, KeyValue

from libs.common import bus_wire, busauth, reconnect, telemetry
from libs.common.bus_wire import DirectSubscription, Inbox, Received
from libs.common.errors import BadInput, Transient
from libs.common.ids import EventId
from libs.common.jetstream_limits import StoreSettings
from libs.common.messages import AnyEvent, Event, EventDeadLettered, decoder_for, encode, subject_of
from libs.common.subjects import STREAM, STREAM_SUBJECTS, Bucket, Durable, Kind, kind_filter

log = logging.getLogger("pai.bus")
# rest's job index applies its watches' messages with it (bus_wire: nats-py's internals).
apply_on_arrival = bus_wire.apply_on_arrival

# Dead-server detection: a connection whose pings go unanswered this many times
# in a row is given up and the client reconnects to another server (4-6 s), well
# within the single-active services' 10 s lease.
PING_INTERVAL_SECONDS = 2.0
MAX_OUTSTANDING_PINGS = 2
# How long the platform's bootstrap waits for JetStream (a cluster electing its
# leader) before it gives up; JetStream's "temporarily unavailable" error code.
STORE_READY_SECONDS = 60.0
JS_TEMPORARILY_UNAVAILABLE = 10008
# A message not acked within this time is redelivered (the handler died); a
# handler that runs longer keeps its message with `in_progress()` heartbeats.
ACK_WAIT_SECONDS = 5.0
HEARTBEAT_SECONDS = 2.0
PARALLEL_MAX_ACK_PENDING = 10_000
# Events fetched and handled together at most: enough that a core's decision and
# a key's write are shared by many events under load, small enough that a batch's
# handling stays well inside the ack deadline.
BATCH_MAX = 256
# How long one pull request for the next event lingers in the server when none is
# waiting; the loop then checks whether the service is stopping and asks again.
PULL_WAIT_SECONDS = 5.0
# An answer to a pull request that never ends (the connection dropped under it).
PULL_ANSWER_SECONDS = 2.0
DRAIN_SECONDS = 2.0
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
# A publish stored with retries: subject, payload, headers, and what it is (for errors).
_Write = tuple[str, bytes, dict[str, str] | None, str]
BatchHandler = Callable[[list[AnyEvent]], Awaitable[None]]
# What a publish or KV write may meet that a retry can cure.
PUBLISH_TROUBLE = (
    nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,  # what nats-py makes of "no responders" to a JetStream publish
)
# How long a publish's ack may take before the publish is sent again.
PUBLISH_ACK_SECONDS = 5.0
# The header nats-py's KeyValue marks a delete with.
KV_OPERATION, KV_DELETE = "KV-Operation", "DEL"
# A message's own time to live (the buckets allow it): on a purge marker, how long it stays.
KV_TTL_HEADER = api.Header.MSG_TTL.value


def purge_marker(gone_after: float) -> dict[str, str]:
    """The headers of a KV purge whose marker expires after `gone_after` seconds (at
    least 1: JetStream counts whole seconds), as nats-py's `KeyValue.purge(key,
    msg_ttl=...)` sends them."""
    return {KV_OPERATION: KV_PURGE, api.Header.ROLLUP.value: MSG_ROLLUP_SUBJECT,
            KV_TTL_HEADER: str(max(1, int(gone_after)))}


class Bus:
    """One NATS connection with its JetStream context and opened KV buckets."""

    def __init__(self, nc: nats.NATS, name: str, *, user: str = ""):
        self.nc = nc
        self.name = name
        self.user = user  # the NATS user (busauth.ACCESS); "" on a server without auth
        self._kv: dict[Bucket, KeyValue] = {}
        # The bus's own receive path on the connection: fails here, at connect,
        # with a nats-py whose internals it does not know.
        bus_wire.install(nc)
        self._store_acks = _StoreAcks(nc)
        self.js = _JetStream(nc, self._store_acks)

    @classmethod
    async def connect(
        cls, url: str, *, name: str, user: str = "", nkey_seed: str = "", password: str = "",
        connect_timeout: float = 30.0,
    ) -> Bus:
        """Connect as NATS user `user`, retrying until NATS answers or `connect_timeout` passes.

        The user proves who it is with its nkey (`nkey_seed`: it signs the server's
        nonce; busauth), or with `password` on a NATS of your own that uses them.
        A wrong or unknown key raises PermissionError at once, without retrying.

        `url` may list the servers of a NATS cluster, comma-separated; the client
        picks one and, when it goes, moves to another (and to those the cluster
        announces). NATS may be restarting (chaos, `pai up` resuming); once
        connected the client reconnects by itself forever. Every try, first connect
        and reconnect, waits a jittered, growing delay (libs/common/reconnect.py), so
        a thousand clients cut off together do not come back in lockstep. Replies
        come under the user's own inbox prefix, the only one its permissions let it
        subscribe to.
        """
        deadline = time.monotonic() + connect_timeout
        servers = server_urls(url)
        login: dict[str, Any] = {}
        if user:
            login["inbox_prefix"] = busauth.inbox_prefix(user)
            if nkey_seed:
                login["nkeys_seed_str"] = busauth.user_seed(nkey_seed)
            else:
                login.update(user=user, password=password)
        rng = random.Random()
        attempt = 0
        last_error: list[Exception | None] = [None]  # what the server last answered a try

        async def on_error(exc: Exception) -> None:
            last_error[0] = exc
            await _log_nats_error(exc)

        while True:
            try:
                nc = await nats.connect(
                    servers=servers,
                    name=name,
                    **login,
                    # The first connect tries each server twice, then gives up to the
                    # jittered wait below; once connected, never give up (set after).
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.1,
                    reconnect_to_server_handler=reconnect.server_chooser(rng),
                    connect_timeout=2,
                    # A server cut off by the network sends no reset: only
                    # unanswered pings tell. nats-py's default (2 min x 2) would
                    # leave a service talking into the void for four minutes.
                    ping_interval=PING_INTERVAL_SECONDS,
                    max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                    error_cb=on_error,
                    disconnected_cb=_log_disconnected,
                )
                nc.options["max_reconnect_attempts"] = -1  # read by each reconnect
                bus = cls(nc, name, user=user)
                await bus_wire.take_request_answers(nc)
                return bus
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                refused = next((e for e in (last_error[0], exc) if reconnect.is_auth_refusal(e)), None)
                if refused is not None:
                    # A wrong or unknown key stays wrong: say so now, not after the timeout.
                    raise PermissionError(f"NATS at {url} refused the credentials of user {user or '(none)'!r}: "
                                          f"{refused}") from exc
                if time.monotonic() > deadline:
                    raise
                delay = reconnect.jittered_delay(attempt, rng)
                attempt += 1
                log.warning("NATS at %s not reachable yet (%s); retrying in %.2fs", url, last_error[0] or exc, delay)
                await asyncio.sleep(delay)

    async def bootstrap(self, settings: StoreSettings | None = None) -> None:
        """Create or update the event stream and every KV bucket with `settings`
        (replicas and limits, jetstream_limits), idempotently; or, as a service
        user, which may not create them (busauth), wait until they exist.

        On a NATS cluster just formed, JetStream answers "unavailable" until its
        nodes have elected a leader: the platform retries until `STORE_READY_SECONDS`.
        """
        if not busauth.may_create_store(self.user):
            await self._wait_for_store()
            return
        settings = settings or StoreSettings()
        deadline = time.monotonic() + STORE_READY_SECONDS
        retry: Exception
        while True:
            try:
                await _add_or_update(self.js, _event_stream_config(settings))
                for bucket in Bucket:
                    await _add_or_update(self.js, _bucket_stream_config(bucket, settings))
                return
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as exc:
                retry = exc
            except nats.js.errors.APIError as exc:
                if exc.err_code != JS_TEMPORARILY_UNAVAILABLE:
                    raise
                retry = exc
            if time.monotonic() > deadline:
                raise Transient(f"JetStream not ready after {STORE_READY_SECONDS:.0f}s: {retry!r}") from retry
            log.warning("JetStream not ready to create the store yet (%r); retrying", retry)
            await asyncio.sleep(0.5)

    async def _wait_for_store(self) -> None:
        """Until the platform's bootstrap (`pai up`, the chart's Job) made the stream
        and this user's buckets: a store still being created is not an empty one."""
        waited = 0.0
        while True:
            try:
                await self.js.stream_info(STREAM)
                for bucket in busauth.buckets_of(self.user):
                    await self.kv(bucket)
                return
            except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError) as exc:
                if waited % 10 < 0.5:
                    log.warning("waiting for the platform to create the event stream and buckets (%r)", exc)
                await asyncio.sleep(0.5)
                waited += 0.5

    async def kv(self, bucket: Bucket) -> KeyValue:
        if bucket not in self._kv:
            try:
                self._kv[bucket] = await self.js.key_value(bucket.value)
            except nats.js.errors.BucketNotFoundError:
                if not busauth.may_create_store(self.user):
                    raise
                try:
                    self._kv[bucket] = await self.js.create_key_value(
                        bucket=bucket.value, history=1, storage=api.StorageType.FILE
                    )
                except nats.js.errors.BadRequestError:  # another service created it first
                    self._kv[bucket] = await self.js.key_value(bucket.value)
        return self._kv[bucket]

    async def round_trip(self) -> None:
        """Return once the server has read everything sent before the call: a
        subscription just made is then served (`bus_wire.round_trip`; nats-py's
        own `flush()` does not promise it)."""
        await bus_wire.round_trip(self.nc)

    async def publish(self, event: Event, *, attempts: int = 5) -> None:
        """Publish with `Nats-Msg-Id = event.id`: a retried publish is stored once."""
        await self._store_one(*_outgoing(event), f"publish of {event.id}", attempts=attempts)

    async def publish_many(self, events: Sequence[Event], *, attempts: int = 5) -> None:
        """Publish every event, all in flight at once, and return once all are stored.

        Pipelined: the publishes leave in order, one after another, and their
        acks are awaited together. One that fails is retried by itself (so it may
        be stored after a later one); past `attempts` this raises `Transient`.
        Every event has its `Nats-Msg-Id`, so a publish retried after an answer
        was lost -- by this method, or by the redelivered batch -- is stored once.
        """
        if len(events) == 1:
            await self.publish(events[0], attempts=attempts)
            return
        writes: list[_Write] = [(*_outgoing(event), f"publish of {event.id}") for event in events]
        await self._store_together(writes, attempts=attempts)

    async def kv_write_many(self, bucket: Bucket, writes: dict[str, bytes | None], *, attempts: int = 5,
                            gone_after: float | None = None) -> None:
        """Put (or, for None, delete) every key of `writes`, all in flight at once;
        return once all are stored, raise `Transient` when one could not be.

        A KV put is a publish on the key's subject, a delete one with a delete
        marker header (as nats-py's KeyValue writes them). `gone_after`: a delete
        is a purge marker that expires after that many seconds (as `KeyValue.purge`
        with `msg_ttl`), so nothing of the key stays in the bucket's stream."""
        await self.kv(bucket)  # the bucket must exist: a write to a missing one has no responder
        prefix = f"$KV.{bucket.value}."
        deleted = {KV_OPERATION: KV_DELETE} if gone_after is None else purge_marker(gone_after)
        await self._store_together(
            [(prefix + key, value or b"", None if value is not None else deleted,
              f"writing {bucket.value}/{key}") for key, value in writes.items()],
            attempts=attempts,
        )

    async def publish_each(self, events: Sequence[Event], *, attempts: int = 5) -> list[Exception | None]:
        """Publish every event, all in flight at once, as `publish_many`; but one that
        cannot be stored fails alone: per event, None once it is stored, or the
        `Transient` saying why not (raised from JetStream's answer: `store_is_full`
        reads it). For callers that answer each event's sender on its own (rest's intake)."""
        writes: list[_Write] = [(*_outgoing(event), f"publish of {event.id}") for event in events]
        answers = await self._send_together(writes)
        return await asyncio.gather(
            *(self._retried(write, answer, attempts) for write, answer in zip(writes, answers, strict=True)))

    async def kv_create_each(self, bucket: Bucket, entries: Sequence[tuple[str, bytes]]) -> list[int | Exception]:
        """Create every `(key, value)` of `entries`, all in flight at once, each only if the key
        has no history (JetStream's expected last subject sequence 0, the header
        nats-py's `KeyValue.create` sends). Per key: its revision, or why it was not
        created: `KeyWrongLastSequenceError` when the key has a history (it exists,
        or it was deleted: `KeyValue.create` tells the two apart), a NATS timeout when
        not answered (it may be stored), or JetStream's refusal. Not retried: a
        create whose answer was lost would be refused by its own retry."""
        await self.kv(bucket)  # the bucket must exist: a write to a missing one has no responder
        prefix = f"$KV.{bucket.value}."
        answers = await self._store_acks.send(
            [(prefix + key, value, _CREATE_ONLY) for key, value in entries], _revision_of, PUBLISH_ACK_SECONDS)
        return [_created(answer) for answer in answers]

    async def _send_together(self, writes: list[_Write]) -> list[object]:
        """JetStream publishes `(subject, data, headers, what)`, sent one after another
        without waiting, their acks awaited together (`_StoreAcks.send`). Per publish:
        `_STORED`, the exception that refused it, or None when not answered within
        `PUBLISH_ACK_SECONDS`."""
        return await self._store_acks.send([write[:3] for write in writes], _store_outcome, PUBLISH_ACK_SECONDS)

    async def _retried(self, write: _Write, answer: object,
                       attempts: int) -> Exception | None:
        """A publish of `_send_together` once more by itself where a retry can cure
        its answer; None once stored, else the `Transient` naming it."""
        subject, data, headers, what = write
        if answer is _STORED:
            return None
        if answer is not None and not isinstance(answer, PUBLISH_TROUBLE):
            refused = Transient(f"{what} failed: {answer!r}")
            refused.__cause__ = answer if isinstance(answer, BaseException) else None
            return refused
        try:
            await self._store_one(subject, data, headers, what, attempts=attempts - 1)
        except Transient as exc:
            return exc
        return None

    async def _store_together(self, writes: list[_Write], *, attempts: int) -> None:
        """`_send_together`; what is refused, or not answered, is published again by
        itself, with retries; past `attempts` this raises `Transient` naming it."""
        answers = await self._send_together(writes)
        for write, answer in zip(writes, answers, strict=True):
            failed = await self._retried(write, answer, attempts)
            if failed is not None:
                raise failed

    async def _store_one(self, subject: str, data: bytes, headers: dict[str, str] | None, what: str, *, attempts: int) -> None:
        """One JetStream publish, retried on what a retry can cure; `Transient` naming `what` past `attempts`."""
        for attempt in range(max(attempts, 1)):
            try:
                await self.js.publish(subject, data, headers=headers, timeout=PUBLISH_ACK_SECONDS)
                return
            except PUBLISH_TROUBLE as exc:
                if attempt >= attempts - 1:
                    raise Transient(f"{what} failed: {exc!r}") from exc
                await asyncio.sleep(0.2 * (attempt + 1))

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
        puller = await _Puller.open(self.nc, STREAM, durable.value)
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
                    msgs.sort(key=lambda msg: _delivery(msg).stream_seq)
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
        decoder: msgspec.json.Decoder,
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
        with _kept_in_progress([msg for msg, _ in decoded]):
            # A redelivered event may be the one that failed before: it goes alone.
            if len(decoded) > 1 and all(_delivery(msg).delivered == 1 for msg, _ in decoded):
                spans = ((f"{durable.value} {msg.subject}", msg.headers, event.job) for msg, event in decoded)
                try:
                    with telemetry.spans_from_headers(spans):
                        await _within(deadline, handler([event for _, event in decoded]))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("a batch of %d events failed (%r); handling them one at a time", len(decoded), exc)
                else:
                    await bus_wire.ack_all(self.nc, [msg for msg, _ in decoded])
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
        deliveries = _delivery(msg).delivered
        while True:
            with telemetry.span_from_headers(f"{durable.value} {msg.subject}", msg.headers, job=event.job):
                try:
                    await _within(deadline, handler([event]))
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

    async def close(self) -> None:
        """Flush what is pending and disconnect, without waiting long.

        A subscription holding messages no one took makes nats-py's drain
        wait its full timeout.
        """
        try:
            await asyncio.wait_for(self.nc.drain(), DRAIN_SECONDS)
        except Exception:  # drain timed out, or NATS is gone: nothing left to flush
            await self.nc.close()


def server_urls(url: str) -> list[str]:
    """The servers of a comma-separated `nats_url` ("nats://a:4222, nats://b:4222")."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"no NATS server in {url!r}")
    return servers


def _event_stream_config(settings: StoreSettings) -> api.StreamConfig:
    limits = settings.events
    return api.StreamConfig(
        name=STREAM,
        subjects=STREAM_SUBJECTS,
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS,
        num_replicas=settings.replicas,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=limits.duplicate_window_seconds,
        max_age=limits.max_age_seconds or None,
        max_bytes=limits.max_bytes,
        max_msg_size=limits.max_message_bytes,
    )


def _bucket_stream_config(bucket: Bucket, settings: StoreSettings) -> api.StreamConfig:
    """The stream behind a KV bucket, as nats-py's `create_key_value` makes it (so
    `js.key_value` opens it), with PAI's limits; built here so an existing bucket
    is updated in place rather than refused as "already in use"."""
    limits = settings.bucket(bucket)
    return api.StreamConfig(
        name=f"KV_{bucket.value}",
        subjects=[f"$KV.{bucket.value}.>"],
        storage=api.StorageType.FILE,
        num_replicas=settings.replicas,
        allow_rollup_hdrs=True,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=limits.duplicate_window_seconds,
        max_age=limits.max_age_seconds or None,
        max_bytes=limits.max_bytes,
        max_consumers=-1,
        max_msg_size=limits.max_message_bytes,
        max_msgs=-1,
        max_msgs_per_subject=1,  # history 1: a bucket holds current state
    )


async def _add_or_update(js: Any, config: api.StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError:  # exists with other settings: apply ours
        await js.update_stream(config)


class HandlerStalled(Exception):
    """A handler ran past its deadline and was cancelled."""


async def _within(deadline: float, work: Awaitable[None]) -> None:
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
def _kept_in_progress(msgs: list[Received]) -> Iterator[None]:
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
        if msgs:
            await bus_wire.keep_in_progress(msgs[0]._nc, msgs)
        await asyncio.sleep(HEARTBEAT_SECONDS)


def _outgoing(event: Event) -> tuple[str, bytes, dict[str, str]]:
    """Subject, payload and headers of an event's publish: its id for dedupe, its job's trace."""
    headers: dict[str, str] = {"Nats-Msg-Id": event.id}
    telemetry.inject(headers, job=event.job)  # a job's events: one trace per job
    return subject_of(event), encode(event), headers


# A JetStream publish answered with a PubAck that carries no error.
_STORED = object()
# Stored only where the subject has no message yet: a KV create.
_CREATE_ONLY: dict[str, str] = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
# JetStream's "wrong last sequence" error codes (as nats-py's KeyValue reads them).
WRONG_LAST_SEQUENCE_CODES = frozenset({10071, 10164})


class _PubAck(msgspec.Struct):
    stream: str
    seq: int
    domain: str | None = None
    duplicate: bool | None = None


_PUB_ACK = msgspec.json.Decoder(_PubAck)
# What is kept of one request's answer (`_StoreAcks.send`), from its payload and raw headers.
AnswerReader = Callable[[bytes, "bytes | None"], object]


def _created(answer: object) -> int | Exception:
    """What `kv_create_each` says of one key: its revision or why it was not created."""
    if isinstance(answer, int):
        return answer
    if answer is None:
        return nats.errors.TimeoutError()
    if isinstance(answer, nats.js.errors.APIError) and answer.err_code in WRONG_LAST_SEQUENCE_CODES:
        return nats.js.errors.KeyWrongLastSequenceError(description=answer.description)
    return answer if isinstance(answer, Exception) else Transient(f"unexpected answer {answer!r}")


class _PendingStores:
    """Requests sent together (a batch of JetStream publishes, or one request),
    waiting for their answers: one future and, while they wait, one timer for
    them all."""

    __slots__ = ("all_answered", "answers", "number", "read", "replies", "unanswered")

    def __init__(self, number: int, prefix: str, count: int, read: AnswerReader):
        self.number = number
        self.read = read  # what is kept of an answer
        self.replies = [f"{prefix}{number}.{position}" for position in range(count)]
        # Per request: None until answered, then what `read` made of its answer
        # (for a publish: _STORED, or the exception that refused it).
        self.answers: list[object] = [None] * count
        self.unanswered = count
        self.all_answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def answer(self, position: int, outcome: object) -> None:
        if self.answers[position] is None:
            self.answers[position] = outcome
            self.unanswered -= 1
            if not self.unanswered and not self.all_answered.done():
                self.all_answered.set_result(None)

    async def answered(self, timeout: float) -> list[object]:
        """Each publish's answer, None for one not answered within `timeout`."""
        if self.unanswered:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.all_answered
        return self.answers


class _StoreAcks:
    """The answers to the bus's requests (the acks of JetStream publishes, answers
    of JetStream's API), on one reply subscription per connection.

    Each request of a batch gets the reply subject `<inbox>.<batch>.<position>`,
    so an answer finds its batch and its place by its subject alone. nats-py's
    own requests pay per request what here is paid per batch: a future, a timer,
    a random token (a system call) and a NUID each, then a `Msg` and a parsed
    PubAck object per answer. The answers are read straight off the wire
    (`bus_wire.DirectSubscription`): no `Msg`, no queue, no task step."""

    def __init__(self, nc: nats.NATS):
        self._nc = nc
        self._prefix = b""
        self._prefix_text = ""
        self._sub: DirectSubscription | None = None
        self._subscribing = asyncio.Lock()
        self._batches = 0
        self._waiting: dict[int, _PendingStores] = {}

    async def send(self, requests: Sequence[tuple[str, bytes, dict[str, str] | None]], read: AnswerReader,
                   timeout: float) -> list[object]:
        """Send `(subject, data, headers)` requests one after another without
        waiting, then await their answers together. Per request: what `read` made
        of its answer, the nats-py error that kept it from leaving (e.g. past the
        largest payload, a closed connection), or None when not answered within
        `timeout`."""
        pending = await self.expect(len(requests), read)
        try:
            nc = self._nc
            if "publish" in vars(nc):
                # A connection whose `publish` was replaced on the instance (the fault
                # tests break writes there: tests/component/rest_replica.py) gets
                # every request through it, as nats-py's own requests do.
                for position, ((subject, data, headers), reply) in enumerate(zip(requests, pending.replies, strict=True)):
                    await self._publish(pending, position, subject, data, reply, headers)
                return await pending.answered(timeout)
            formatted: list[bytes] = []  # commands not yet sent, of the requests at `positions`
            positions: list[int] = []
            payload_bytes = 0
            for position, ((subject, data, headers), reply) in enumerate(zip(requests, pending.replies, strict=True)):
                if len(data) > nc._max_payload:
                    pending.answer(position, nats.errors.MaxPayloadError())
                    continue
                command = bus_wire.publish_command(subject, reply, headers, data)
                if command is not None:
                    formatted.append(command)
                    positions.append(position)
                    payload_bytes += len(data)
                    continue
                # One nats-py would refuse or rewrite: its own publish, in order.
                await self._send(formatted, positions, payload_bytes, pending)
                formatted, positions, payload_bytes = [], [], 0
                await self._publish(pending, position, subject, data, reply, headers)
            await self._send(formatted, positions, payload_bytes, pending)
            return await pending.answered(timeout)
        finally:
            self.forget(pending)

    async def _publish(self, pending: _PendingStores, position: int, subject: str, data: bytes, reply: str,
                       headers: dict[str, str] | None) -> None:
        """One request through nats-py's own `publish`; what it refuses is the answer."""
        try:
            await self._nc.publish(subject, data, reply=reply, headers=headers)
        except nats.errors.Error as exc:
            pending.answer(position, exc)

    async def _send(self, commands: list[bytes], positions: list[int], payload_bytes: int,
                    pending: _PendingStores) -> None:
        if not commands:
            return
        try:
            await bus_wire.send_commands(self._nc, b"".join(commands), len(commands), payload_bytes)
        except nats.errors.Error as exc:  # not sent (a closed connection, no room to keep it while reconnecting)
            for position in positions:
                pending.answer(position, exc)

    async def expect(self, count: int, read: AnswerReader) -> _PendingStores:
        if self._sub is None:
            async with self._subscribing:  # two first batches at once: one subscription
                if self._sub is None:
                    inbox = self._nc.new_inbox()
                    self._prefix_text = inbox + "."
                    self._prefix = self._prefix_text.encode()
                    self._sub = await DirectSubscription.open(self._nc, inbox + ".>", self._on_answer)
        self._batches += 1
        pending = _PendingStores(self._batches, self._prefix_text, count, read)
        self._waiting[pending.number] = pending
        return pending

    def forget(self, pending: _PendingStores) -> None:
        """Answers that come for `pending` from now on are late: dropped."""
        self._waiting.pop(pending.number, None)

    def _on_answer(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        number, _, position = subject[len(self._prefix):].partition(b".")
        pending = self._waiting.get(int(number))
        if pending is not None:
            pending.answer(int(position), pending.read(data, headers))


def _store_outcome(data: bytes, headers: bytes | None = None) -> object:
    """What a JetStream publish's answer (its payload) says: `_STORED`, or why it was not."""
    if not data:  # a status without a body: no stream listens on the subject
        return nats.js.errors.NoStreamResponseError()
    if b'"error"' not in data:  # a PubAck: {"stream": ..., "seq": ...}
        return _STORED
    try:
        nats.js.errors.APIError.from_error(msgspec.json.decode(data)["error"])  # raises the error's class
    except nats.js.errors.APIError as exc:
        return exc
    return nats.js.errors.APIError(description=data.decode(errors="replace"))


def _revision_of(data: bytes, headers: bytes | None) -> object:
    """A KV create's answer: its revision (the stream sequence) once stored."""
    outcome = _store_outcome(data)
    return _PUB_ACK.decode(data).seq if outcome is _STORED else outcome


def _pub_ack_of(data: bytes, headers: bytes | None) -> object:
    """A single publish's answer: nats-py's `PubAck` once stored."""
    outcome = _store_outcome(data)
    if outcome is not _STORED:
        return outcome
    ack = _PUB_ACK.decode(data)
    return api.PubAck(stream=ack.stream, seq=ack.seq, domain=ack.domain, duplicate=ack.duplicate)


class _ApiAnswer(NamedTuple):
    """A JetStream API request's answer, decoded by the request (`_JetStream._api_request`)."""

    data: bytes
    no_responders: bool


def _api_answer_of(data: bytes, headers: bytes | None) -> object:
    return _ApiAnswer(data, bus_wire.status_of(data, headers) == 503)


class _JetStream(nats.js.JetStreamContext):
    """nats-py's JetStream context, whose single publishes (`Bus.publish`, every
    KeyValue put, create, update and delete) and API requests (KV reads, stream
    and consumer info) are answered on the bus's reply subscription (`_StoreAcks`)
    instead of as nats-py requests: per request, no random token (a `getrandom`
    system call), NUID, `wait_for` timer, `Msg` or headers dict. Raises what
    nats-py's own raise: the JetStream error's class (`APIError.from_error`), so
    `KeyValue.create`/`update` still tell a wrong last sequence; a NATS timeout;
    `NoStreamResponseError` for a publish no stream listens to,
    `ServiceUnavailableError` for an API request without a responder."""

    def __init__(self, nc: nats.NATS, answers: _StoreAcks):
        super().__init__(nc)
        self._answers = answers

    async def publish(self, subject: str, payload: bytes = b"", timeout: float | None = None,
                      stream: str | None = None, headers: dict[str, Any] | None = None,
                      msg_ttl: float | None = None) -> api.PubAck:
        if stream is not None or msg_ttl is not None:  # forms PAI does not send: nats-py's own
            return await super().publish(subject, payload, timeout=timeout, stream=stream, headers=headers,
                                         msg_ttl=msg_ttl)
        [answer] = await self._answers.send([(subject, payload, headers)], _pub_ack_of,
                                            self._timeout if timeout is None else timeout)
        if isinstance(answer, api.PubAck):
            return answer
        raise answer if isinstance(answer, Exception) else nats.errors.TimeoutError

    async def _api_request(self, req_subject: str, req: bytes = b"", timeout: float = 5) -> dict[str, Any]:
        [answer] = await self._answers.send([(req_subject, req, None)], _api_answer_of, timeout)
        if not isinstance(answer, _ApiAnswer):
            raise answer if isinstance(answer, Exception) else nats.errors.TimeoutError
        if answer.no_responders:
            raise nats.js.errors.ServiceUnavailableError
        resp = msgspec.json.decode(answer.data)
        if "error" in resp:
            raise nats.js.errors.APIError.from_error(resp["error"])
        return resp


class _Puller:
    """Pull requests of our own on a durable, answered on a private inbox.

    `next_batch` returns every event waiting, up to a bound, without lingering
    for more: a no-wait request is answered at once with what there is. When
    nothing waits, one request for a single event lingers in the server until
    it comes (`PULL_WAIT_SECONDS` at most). nats-py's own batched fetch keeps a
    batch open until its timeout once the first event is in, adding that wait
    to every hop.

    The answers are read straight off the wire (`bus_wire.DirectSubscription`)
    into an inbox of `Received` deliveries; the status that ends an answer (404
    no messages, 408 expired, 409) is told by its first header line alone. An
    answer that comes late (after its request timed out here) is not lost: it
    waits in the inbox and is the start of the next batch.
    """

    def __init__(self, nc: nats.NATS, stream: str, durable: str):
        self._nc = nc
        self._subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._sub: Any = None
        self._received = Inbox(asyncio.get_running_loop())

    @classmethod
    async def open(cls, nc: nats.NATS, stream: str, durable: str) -> _Puller:
        puller = cls(nc, stream, durable)
        puller._sub = await DirectSubscription.open(nc, puller._inbox, puller._on_message)
        return puller

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if bus_wire.status_of(data, headers) is not None:
            self._received.put(_ANSWER_ENDED)
        else:
            self._received.put(Received(self._nc, subject, reply.decode(), data, headers))

    async def next_batch(self, most: int) -> list[Received]:
        msgs = self._already_here(most)
        if not msgs:
            await self._request({"batch": 1, "expires": int(PULL_WAIT_SECONDS * 1e9)})
            msgs = await self._answer(1, PULL_WAIT_SECONDS + PULL_ANSWER_SECONDS)
        # Each delivery says how many more wait for this consumer: none (an idle
        # platform's lone event) costs no second request.
        more = min(most - len(msgs), _delivery(msgs[-1]).pending) if msgs else 0
        if more > 0:
            await self._request({"batch": more, "no_wait": True})
            msgs += await self._answer(more, PULL_ANSWER_SECONDS)
        return msgs

    def _already_here(self, most: int) -> list[Received]:
        msgs: list[Received] = []
        waiting = self._received.items
        while len(msgs) < most and waiting:
            msg = waiting.popleft()
            if msg is not _ANSWER_ENDED:
                msgs.append(msg)
        return msgs

    async def _request(self, request: dict[str, Any]) -> None:
        await self._nc.publish(self._subject, msgspec.json.encode(request), reply=self._inbox)

    async def _answer(self, most: int, timeout: float) -> list[Received]:
        """Events answering the request, until `most` came or a status ended it
        (no more waiting, the request expired), or `timeout` passed; under one
        timer for the whole answer (nats-py's `next_msg` makes a task, a uuid and
        a timer per message)."""
        msgs: list[Received] = []
        received = self._received
        waiting = received.items
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(msgs) < most:
                    msg = waiting.popleft() if waiting else await received.get()
                    if msg is _ANSWER_ENDED:
                        break
                    msgs.append(msg)
        return msgs


# What the inbox of a `_Puller` holds for the status that ended an answer.
_ANSWER_ENDED = object()


class _Delivery(NamedTuple):
    delivered: int  # times this event was delivered to the consumer, this one included
    stream_seq: int
    pending: int  # events still waiting for the consumer after this one


def _delivery(msg: Received | Msg) -> _Delivery:
    """What a JetStream delivery's reply subject says (nats-py's `msg.metadata`),
    without the dataclasses and datetime nats-py builds for every event.

    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`;
    newer servers put `<domain>.<account hash>` before the stream and a token after."""
    tokens = msg.reply.split(".")
    at = 4 if len(tokens) == 9 else 6
    return _Delivery(int(tokens[at]), int(tokens[at + 1]), int(tokens[at + 4]))


# JetStream's answers when a stream or bucket (or the server's whole store) has
# no room: 10077 maximum bytes, 10076 maximum messages, 10047 insufficient
# storage resources. A definite refusal: nothing was stored.
STORE_FULL_ERR_CODES = frozenset({10047, 10076, 10077})


def store_is_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it was raised from, e.g. a `Transient` of `Bus.publish`)
    says JetStream refused a write for want of room."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, nats.js.errors.APIError) and exc.err_code in STORE_FULL_ERR_CODES:
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


async def get_json(kv: KeyValue, key: str, type_: type[Any]) -> tuple[Any, int] | None:
    """Value and revision of a key, decoded as `type_`; None when absent or deleted."""
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    return msgspec.json.decode(entry.value, type=type_), entry.revision or 0


async def get_many(kv: KeyValue, keys: Sequence[str], type_: type[Any], *,
                   skip_undecodable: bool = False) -> dict[str, Any]:
    """The values of `keys` (those present), decoded as `type_`: a page of gets in
    flight at a time, so a restore that needs a few keys of a big bucket reads only
    those, never the whole bucket."""
    found: dict[str, Any] = {}
    for start in range(0, len(keys), RESTORE_PAGE_ENTRIES):
        page = keys[start:start + RESTORE_PAGE_ENTRIES]
        got = await asyncio.gather(*(_get_raw(kv, key) for key in page))
        for key, raw in zip(page, got, strict=True):
            if raw is not None and (value := _decoded(kv, key, raw, type_, skip_undecodable)) is not _UNDECODABLE:
                found[key] = value
        await asyncio.sleep(0)
    return found


async def _get_raw(kv: KeyValue, key: str) -> bytes | None:
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    return entry.value or None


# Restoring state: a bucket is read in pages of at most this many entries (and
# bytes), each a pull request of an ephemeral consumer of its own (flow control:
# nothing comes that was not asked for, so no read of any size overruns the
# connection), decoded and handed on a page at a time, the event loop (and the
# lease renewal with it) getting a turn between two pages.
RESTORE_PAGE_ENTRIES = 256
RESTORE_PAGE_BYTES = 2 * 1024 * 1024
# How long a store still coming back may keep a read from progressing (no page
# came) before the service gives up and its supervisor starts it again; a read
# that progresses, however long, is never cut.
RESTORE_TIMEOUT_SECONDS = 60.0
# How long one page's answer may take.
RESTORE_PAGE_SECONDS = 5.0
# How long a watch's stored entries may pause between two (readers that still watch).
RESTORE_ENTRY_TIMEOUT_SECONDS = 5.0
# The pager's consumer disappears this long after its reader died.
RESTORE_CONSUMER_IDLE_SECONDS = 30.0


class KvEntry(NamedTuple):
    key: str
    value: bytes | None  # None: deleted or purged (a marker)
    seq: int  # its sequence in the bucket's stream


async def read_pages(kv: KeyValue, *, prefix: str = "", headers_only: bool = False) -> AsyncIterator[list[KvEntry]]:
    """Every entry of a bucket (only keys starting with `prefix`, which ends in a
    dot, when given), delete markers included, in pages of at most
    `RESTORE_PAGE_ENTRIES`, in stream order; `headers_only`: keys alone (values b"").

    A bucket keeps one message per key (history 1), so its stream in order is
    its keys, each at its latest value: an ephemeral pull consumer (no acks)
    reads it, one page per request. A key written while the read goes on comes
    again later in it, at its newer value: a reader keeps the last it saw.

    Read only from a store that is ready (docs/architecture.md, "State and recovery"): the
    stream must answer, and a consumer made on it must find as many entries as
    the stream said it holds; an empty or short answer of a JetStream still
    recovering is retried, never taken for "nothing to restore". A read that
    fails half-way goes on after the last entry handed out. Past
    `RESTORE_TIMEOUT_SECONDS` without a page, raises `Transient`.
    """
    subjects = f"{kv._pre}{prefix}>"
    after = 0  # the stream sequence of the last entry handed out
    progress_at = time.monotonic()
    while True:
        try:
            consumer, pending = await _restore_consumer(kv, subjects, after, headers_only)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, _NotReady) as exc:
            problem = repr(exc)
        else:
            problem = ""
            puller = await _Puller.open(kv._js._nc, kv._stream, consumer)
            try:
                while pending > 0:
                    page, pending = await _next_page(puller, kv, pending, headers_only)
                    if not page:
                        problem = "a page came back empty"
                        break
                    after = page[-1].seq
                    progress_at = time.monotonic()
                    yield page
                    await asyncio.sleep(0)  # the event loop's turn: lease renewal, health checks
            except (TimeoutError, nats.errors.Error) as exc:
                problem = repr(exc)
            finally:
                await puller.close()
                with contextlib.suppress(Exception):
                    await kv._js.delete_consumer(kv._stream, consumer)
            if not problem:
                return
        if time.monotonic() - progress_at > RESTORE_TIMEOUT_SECONDS:
            raise Transient(f"bucket {kv._name} is not ready to restore from: {problem}")
        log.warning("bucket %s not ready to restore from (%s); trying again", kv._name, problem)
        await asyncio.sleep(0.5)


class _NotReady(Exception):
    """The bucket's stream answered with less than it holds (JetStream recovering)."""


async def _restore_consumer(kv: KeyValue, subjects: str, after: int, headers_only: bool) -> tuple[str, int]:
    """An ephemeral pull consumer reading the bucket after sequence `after`; its
    name and how many entries it has to deliver."""
    info = await kv._js.stream_info(kv._stream)
    held = info.state.messages
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after else api.DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
        filter_subject=subjects,
        headers_only=headers_only or None,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=RESTORE_CONSUMER_IDLE_SECONDS,
    )
    created = await kv._js.add_consumer(kv._stream, config)
    pending = created.num_pending or 0
    whole = not after and subjects == f"{kv._pre}>"
    if whole and pending < held:
        with contextlib.suppress(Exception):
            await kv._js.delete_consumer(kv._stream, created.name)
        raise _NotReady(f"its consumer found {pending} of the {held} entries its stream holds")
    return created.name, pending


async def _next_page(puller: _Puller, kv: KeyValue, pending: int, headers_only: bool) -> tuple[list[KvEntry], int]:
    """The next page, and how many entries wait after it."""
    most = min(RESTORE_PAGE_ENTRIES, pending)
    msgs: list[Received] = []
    # A full answer may still be followed by the status that ends its request,
    # which would end the next answer at once: that one is asked again.
    for _ in range(3):
        waiting = puller._received.items
        while waiting and waiting[0] is _ANSWER_ENDED:
            waiting.popleft()
        await puller._request({"batch": most, "no_wait": True, "max_bytes": RESTORE_PAGE_BYTES})
        msgs = await puller._answer(most, RESTORE_PAGE_SECONDS)
        if msgs:
            break
    if not msgs:
        return [], pending
    cut = len(kv._pre)
    page = []
    for msg in msgs:
        # A delete or purge carries KV-Operation; a value never does.
        deleted = msg._raw_headers is not None and b"KV-Operation" in msg._raw_headers
        value = None if deleted else (b"" if headers_only else msg.data)
        page.append(KvEntry(msg._subject[cut:].decode(), value, _delivery(msg).stream_seq))
    return page, _delivery(msgs[-1]).pending


async def all_keys(kv: KeyValue, prefix: str = "") -> list[str]:
    """The live keys of a bucket (only those starting with `prefix`, which ends in
    a dot, when given: the server filters them), every one of them, read in pages
    (`read_pages`, headers only).

    Not nats-py's `KeyValue.keys()`: it ends its listing at a marker it decides
    from consumer info, and when the server has already sent every entry but the
    client has not read them yet, that marker comes first and the listing is
    empty or short (a test that purged a bucket of 300 keys this way left them
    all); nor a push watch, whose whole bucket at once overruns the connection."""
    live: dict[str, bool] = {}
    async for page in read_pages(kv, prefix=prefix, headers_only=True):
        for entry in page:
            live.pop(entry.key, None)  # a key written again meanwhile: its place is its last
            live[entry.key] = entry.value is not None
    return [key for key, alive in live.items() if alive]


async def stored_when_watch_began(watcher: KeyValue.KeyWatcher) -> int:
    """How many entries (deletes included) a new watch (not ignoring deletes)
    delivers before the changes made after it began: its consumer's delivered
    plus pending. nats-py's end-of-stored marker (None) is not to be trusted
    for this."""
    info = await watcher._sub.consumer_info()
    return info.num_pending + info.delivered.consumer_seq


async def load_all(kv: KeyValue, type_: type[Any], *, skip_undecodable: bool = False) -> dict[str, Any]:
    """Every live value of a bucket, decoded: `read_pages`, decoded a page at a time.

    For a bucket that stays small (nodes, rules, alerts); a service restoring
    from a bucket that grows with the jobs reads it with `read_pages` and keeps
    only what it needs. A value that does not decode as `type_` fails the load,
    unless `skip_undecodable` (for a bucket another service owns: its bad value
    must not stop this one), when it is left out with a warning."""
    values: dict[str, Any] = {}
    async for page in read_pages(kv):
        for entry in page:
            values.pop(entry.key, None)
            if entry.value:
                value = _decoded(kv, entry.key, entry.value, type_, skip_undecodable)
                if value is not _UNDECODABLE:
                    values[entry.key] = value
    return values


_UNDECODABLE = object()


def _decoded(kv: KeyValue, key: str, raw: bytes, type_: type[Any], skip_undecodable: bool) -> Any:
    try:
        return msgspec.json.decode(raw, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        if not skip_undecodable:
            raise
        log.warning("bucket %s: skipping %s, which does not decode: %s", kv._name, key, exc)
        return _UNDECODABLE


async def _log_nats_error(exc: Exception) -> None:
    log.warning("NATS error: %r", exc)


async def _log_disconnected() -> None:
    log.warning("disconnected from NATS; reconnecting")
