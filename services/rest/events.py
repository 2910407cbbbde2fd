"""GET /api/v2/events: job state changes as Server-Sent Events.

Each SSE event is one `JobStateChanged` from the event stream, and its `id:` is the
event's JetStream sequence. A client that reconnects with `Last-Event-ID` (or
`?lastEventId=`) gets every later event of its jobs, in order, none twice, so a
rest restart between two connections loses nothing.

One reader per rest process (`EventHub`), not one per stream: while at least one
stream is open, the hub holds one JetStream consumer on the job-state subjects of
the event stream, an ephemeral push consumer in memory that delivers each new
job-state event to rest once, in sequence order, body and stream sequence (the SSE
id) together: no stored read per event. The hub encodes the event once and hands
it to every open stream whose filter matches, from memory, into that stream's
bounded queue. With 1,000 streams open an event costs one delivery, not 1,000, and
no read.

The consumer is an ordered one, kept by the hub: each delivery carries its consumer
sequence, so a delivery lost on the way (a dropped connection, a NATS restart that
took the consumer with it) shows as a gap, or as heartbeats that say more was sent,
or as silence where heartbeats were due. The hub then drops that consumer and makes
a new one starting at its cursor, the first sequence it has not handed out: every
event reaches the streams once, in order, whatever was lost between.

Stored reads per stream are only for resuming: a stream that starts before the
hub's position (`Last-Event-ID`, or a hub that is a moment behind) reads its own
jobs' stored events up to the sequence where it joined the hub (`handover`), then
takes the hub's events from that sequence on: no gap, no repeat. A stream whose
client reads too slowly, so that its queue fills, is sent what was queued and then
`event: reconnect` and closed; the client's EventSource comes back with the last
id it saw and catches up from the stream, rather than rest holding an unbounded
backlog for it.

The caller sees their own jobs (admins: every job), filtered by subject as nats
filters it (`subject_filter`), so neither the stored reads nor the hub's hand-out
give anyone another user's events; `?job=user~name` narrows to one job. While
nothing happens a comment line goes out every heartbeat, so proxies keep the
connection and a client notices a dead one. Without an open stream rest does not
receive the job-state events at all (three per job, each a message nats-server
sends and rest parses for nobody).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from aiohttp import web
from nats.js import api

from libs.common import ids
from libs.common.bus import Bus
from libs.common.bus.link import DirectSubscription, parse_headers, status_of
from libs.common.errors import BadInput
from libs.common.messages import JobStateChanged
from libs.common.protocol.limits import MAX_JOB_NAME_LENGTH, MAX_USERNAME_LENGTH
from libs.common.subjects import PREFIX, STREAM, Kind
from services.rest.identity import core
from services.rest.request import CTX, USER, ctx_of

log = logging.getLogger("pai.rest.events")

# How long a stream's own stored reads (resuming) wait for NATS to come back.
POLL_SECONDS = 2.0
# The hub's consumer sends a heartbeat whenever it has had nothing to deliver for
# this long; a hub that hears nothing for HEARTBEAT_MISSES of them has lost its
# consumer (NATS restarted) and makes a new one from its cursor.
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_MISSES = 3
RETRY_SECONDS = 1.0  # after a consumer could not be made (NATS away), try again
# nats-server removes a consumer of the hub's nobody receives any more (the hub
# stopped, or moved to a new one) after this long.
CONSUMER_IDLE_SECONDS = 10.0
RETRY_MILLISECONDS = 3000  # the reconnect delay EventSource clients are told
# Events queued for one stream whose client has not read them yet; past this it is
# told to reconnect (its queue is dropped, its client resumes from the stream).
STREAM_QUEUE_EVENTS = 1000
_decode = msgspec.json.Decoder(JobStateChanged)
_STATE_SUBJECT = f"{PREFIX}.{Kind.JOB_STATE.value}"
_STATE_TOKENS = _STATE_SUBJECT.count(".") + 1  # pai.v1.job.state: then <vc>.<user>.<job>


class Watcher:
    """One open event stream, as the hub sees it: what it may see and what is queued
    for it. `handover`: the first sequence the hub hands it; earlier events it reads
    from the stream itself."""

    def __init__(self, user: str | None, name: str | None, limit: int):
        self.user, self.name = user, name  # None: every user / every job of the user
        self.limit = limit
        self.queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self.ready = asyncio.Event()  # set when something was queued (or it must end)
        self.handover = 0
        self.behind = False  # its queue filled: it ends, and its client resumes

    def offer(self, seq: int, data: bytes) -> bool:
        """Queue one event; False when the queue is full (the stream is too far behind)."""
        if len(self.queue) >= self.limit:
            self.behind = True
            self.ready.set()
            return False
        self.queue.append((seq, data))
        self.ready.set()
        return True


def _subject_parts(subject: str) -> tuple[str, str] | None:
    """(user, job name) of a job-state subject `pai.v1.job.state.<vc>.<user>.<job>`."""
    tokens = subject.split(".")
    if len(tokens) != _STATE_TOKENS + 3:
        return None
    return tokens[-2], tokens[-1]


def sse_event(seq: int, event: JobStateChanged) -> bytes:
    return f"id: {seq}\nevent: job.state\ndata: {json.dumps(event_view(event))}\n\n".encode()


class _Feed:
    """One consumer of the hub's and the subscription it delivers to: what came
    from it so far, and whether it can still be trusted to have lost nothing."""

    def __init__(self, heard: float):
        self.subscription: Any = None
        self.name = ""
        self.delivered = 0  # the consumer sequence of the last delivery handed out
        self.heard = heard  # when it last sent anything (a delivery, a heartbeat)
        self.broken = False  # a delivery went missing: done with, a new one follows
        self.replies: list[bytes] = []  # flow-control answers to send
        self.attention = asyncio.Event()  # broken, or replies to send

    def break_off(self) -> None:
        self.broken = True
        self.attention.set()

    async def close(self) -> None:
        subscription, self.subscription = self.subscription, None
        if subscription is not None:
            try:
                await subscription.unsubscribe()
            except Exception:  # the connection is gone already
                pass


def _sequences(reply: bytes) -> tuple[int, int] | None:
    """(stream sequence, consumer sequence) of a delivery's reply subject
    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`
    (newer servers put `<domain>.<account hash>` before the stream and a token after)."""
    tokens = reply.split(b".")
    if len(tokens) < 9 or tokens[0] != b"$JS" or tokens[1] != b"ACK":
        return None
    at = 5 if len(tokens) == 9 else 7
    try:
        return int(tokens[at]), int(tokens[at + 1])
    except ValueError:
        return None


class EventHub:
    """The one reader of job state events in this rest process, and its fan-out.

    Runs while at least one stream is open (`watching`), not for the life of the
    process: under a burst of submissions with no one watching, each event would
    cost rest and nats-server a delivery for nobody."""

    def __init__(self, bus: Bus, *, queue_limit: int = STREAM_QUEUE_EVENTS,
                 subscribe=DirectSubscription.open):
        self.bus = bus
        self.queue_limit = queue_limit
        self.cursor = 0  # the next sequence the hub hands out; every earlier event is handed out
        self._admins: set[Watcher] = set()  # every job
        self._by_user: dict[str, set[Watcher]] = {}  # every job of one user
        self._by_job: dict[tuple[str, str], set[Watcher]] = {}  # one job
        self._watchers = 0
        self._subscribe = subscribe  # (connection, subject, handler): a subscription handing messages to handler
        self._feed: _Feed | None = None  # the consumer deliveries are taken from now
        self._reader: asyncio.Task | None = None
        self._starting = asyncio.Lock()  # a first stream and a last one leaving at once: one reader
        self.closing = False  # rest is shutting down: every stream ends (clients resume elsewhere)

    @contextlib.asynccontextmanager
    async def watching(self, user: str | None, name: str | None) -> AsyncIterator[Watcher]:
        """A stream's place in the fan-out: every event from `watcher.handover` on that
        matches (`user` None: all; `name` None: all of the user's) is queued for it."""
        watcher = Watcher(user, name, self.queue_limit)
        async with self._starting:
            if self._reader is None:
                await self._start()
            watcher.handover = self.cursor  # no await between this and joining: nothing handed out between
            self._join(watcher)
        try:
            yield watcher
        finally:
            self._leave(watcher)
            async with self._starting:
                if self._watchers == 0:
                    await self.stop()

    async def _start(self) -> None:
        # From the stream's next sequence on: the hub's consumer starts there, so
        # an event stored after this read is the hub's, one stored before it is not.
        info = await self.bus.js.stream_info(STREAM)
        self.cursor = info.state.last_seq + 1
        try:
            feed = await self._open_feed()
        except _Unavailable:
            feed = None  # the reader makes it once NATS answers; the streams wait meanwhile
        self._reader = asyncio.create_task(self._follow(feed), name="event-hub")

    async def stop(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.close()  # nats-server removes the consumer once nobody receives it

    def _join(self, watcher: Watcher) -> None:
        self._watchers += 1
        if watcher.user is None:
            self._admins.add(watcher)
        elif watcher.name is None:
            self._by_user.setdefault(watcher.user, set()).add(watcher)
        else:
            self._by_job.setdefault((watcher.user, watcher.name), set()).add(watcher)

    def _leave(self, watcher: Watcher) -> None:
        self._watchers -= 1
        if watcher.user is None:
            self._admins.discard(watcher)
            return
        table, key = (self._by_user, watcher.user) if watcher.name is None else (self._by_job, (watcher.user, watcher.name))
        group = table.get(key)  # type: ignore[call-overload]
        if group is not None:
            group.discard(watcher)
            if not group:
                del table[key]  # type: ignore[arg-type]

    async def _open_feed(self) -> _Feed:
        """A consumer delivering every job-state event from `cursor` on, and the
        subscription it delivers to (made first: nothing is delivered before it)."""
        loop = asyncio.get_running_loop()
        feed = _Feed(loop.time())
        feed.name = f"pai_rest_events_{secrets.token_hex(8)}"
        inbox = self.bus.nc.new_inbox()
        feed.subscription = await self._subscribe(self.bus.nc, inbox, functools.partial(self._on_delivery, feed))
        self._feed = feed
        config = api.ConsumerConfig(
            name=feed.name, deliver_subject=inbox, filter_subject=f"{_STATE_SUBJECT}.>",
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.cursor,
            ack_policy=api.AckPolicy.NONE, max_deliver=1, flow_control=True, idle_heartbeat=HEARTBEAT_SECONDS,
            mem_storage=True, num_replicas=1, inactive_threshold=CONSUMER_IDLE_SECONDS,
        )
        try:
            await self.bus.js.add_consumer(STREAM, config=config)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            self._feed = None
            await feed.close()
            log.warning("the event hub could not follow events from %d: %r", self.cursor, exc)
            raise _Unavailable from exc
        except BaseException:
            self._feed = None
            await feed.close()
            raise
        feed.heard = max(feed.heard, loop.time())  # its heartbeats are due from now, not from the request
        return feed

    def _on_delivery(self, feed: _Feed, subject: bytes, reply: bytes, payload: bytes, headers: bytes | None) -> None:
        """One message from the hub's consumer, as it is read off the connection
        (in order; synchronous, so a stream joining sees a whole hand-out or none)."""
        if feed is not self._feed or feed.broken:
            return  # from a consumer given up on: its successor delivers it again
        feed.heard = asyncio.get_running_loop().time()
        status = status_of(payload, headers)
        if status is not None:
            fields = parse_headers(headers) or {}
            if status != 100:  # e.g. 409: the consumer was deleted
                feed.break_off()
                return
            if reply:  # a flow-control request: every delivery before it is handed out
                feed.replies.append(reply)
                feed.attention.set()
            if stalled := fields.get("Nats-Consumer-Stalled"):
                feed.replies.append(stalled.encode())
                feed.attention.set()
            last = fields.get("Nats-Last-Consumer")  # a heartbeat: what it has delivered so far
            if last is not None and last.isdigit() and int(last) != feed.delivered:
                feed.break_off()  # it sent more than arrived
            return
        sequences = _sequences(reply)
        if sequences is None:
            return  # not a delivery (nothing else is sent to this inbox)
        stream_seq, consumer_seq = sequences
        if consumer_seq != feed.delivered + 1:
            feed.break_off()  # one went missing: a new consumer from the cursor delivers it
            return
        feed.delivered = consumer_seq
        if stream_seq >= self.cursor:
            self.hand_out(stream_seq, subject.decode(), payload)

    async def _follow(self, feed: _Feed | None) -> None:
        """Keep a consumer that has lost nothing: answer its flow control, and
        replace it from the cursor when a delivery went missing or it went silent."""
        while True:
            if feed is None:
                try:
                    feed = await self._open_feed()
                except _Unavailable:
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
            try:
                await self._tend(feed)
            except Exception:
                # A bug; the streams stay open and the hub goes on with a new consumer
                # rather than leave every stream of this process silent.
                log.exception("the event hub failed following events after %d", self.cursor)
            self._feed = None
            await feed.close()
            feed = None

    async def _tend(self, feed: _Feed) -> None:
        loop = asyncio.get_running_loop()
        while not feed.broken:
            feed.attention.clear()
            replies, feed.replies = feed.replies, []
            for reply in replies:
                with contextlib.suppress(nats.errors.Error):  # gone: the consumer's silence replaces it
                    await self.bus.nc.publish(reply.decode())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(feed.attention.wait(), HEARTBEAT_SECONDS)
            if loop.time() - feed.heard > HEARTBEAT_SECONDS * HEARTBEAT_MISSES:
                log.info("the event hub's consumer went silent after %d; following anew", self.cursor)
                return
        log.info("a delivery to the event hub went missing after %d; following anew", self.cursor)

    def hand_out(self, seq: int, subject: str, data: bytes) -> None:
        """One stored event to every stream that may see it (synchronous: a stream
        joining meanwhile has `handover` either before this sequence or after it)."""
        self.cursor = seq + 1
        parts = _subject_parts(subject)
        if parts is None:
            return
        groups = [self._admins, self._by_user.get(parts[0], ()), self._by_job.get(parts, ())]
        if not any(groups):
            return
        try:
            encoded = sse_event(seq, _decode.decode(data))
        except msgspec.DecodeError:
            log.warning("event %d on %s is not a JobStateChanged; skipped", seq, subject)
            return
        for group in groups:
            for watcher in group:
                if seq >= watcher.handover and not watcher.behind:
                    watcher.offer(seq, encoded)

    def close_streams(self) -> None:
        self.closing = True
        for watcher in self._everyone():
            watcher.ready.set()

    def _everyone(self) -> list[Watcher]:
        out = list(self._admins)
        for group in (*self._by_user.values(), *self._by_job.values()):
            out.extend(group)
        return out

    async def _close_streams(self, _app: web.Application) -> None:
        self.close_streams()


HUB = web.AppKey("event_hub", EventHub)


async def _hub_ctx(app: web.Application) -> AsyncIterator[None]:
    hub = EventHub(app[CTX].bus)
    app[HUB] = hub
    app.on_shutdown.append(hub._close_streams)
    yield
    await hub.stop()


def setup(app: web.Application) -> None:
    app.cleanup_ctx.append(_hub_ctx)
    app.add_routes([web.get("/api/v2/events", stream_events)])


def _scope(caller: core.Principal, job: str | None) -> tuple[str | None, str | None]:
    """(user, job name) whose events `caller` may read here; None: any (authorized here)."""
    if job:
        user, name = ids.split_job_id(job)
        core.require(caller, core.Action.WATCH_EVENTS, user, what=job)
        return user, name
    return (None, None) if caller.admin else (caller.username, None)


def subject_filter(caller: core.Principal, job: str | None) -> str:
    """The job-state subjects `caller` may read: `pai.v1.job.state.<vc>.<user>.<job>`."""
    user, name = _scope(caller, job)
    if user is None:
        return f"{_STATE_SUBJECT}.>"
    return f"{_STATE_SUBJECT}.*.{user}.{name}" if name else f"{_STATE_SUBJECT}.*.{user}.>"


def event_view(event: JobStateChanged) -> dict[str, Any]:
    return {
        "job": event.job,
        "user": event.user,
        "virtualCluster": event.vc,
        "attempt": event.attempt,
        "state": event.state.value,
        "previous": event.previous.value if event.previous else None,
        "time": int(event.at * 1000),
        "exitCode": event.exitCode,
        "exitPhrase": event.exitSpec.phrase if event.exitSpec else None,
    }


def _start_sequence(request: web.Request) -> int | None:
    given = request.headers.get("Last-Event-ID") or request.query.get("lastEventId")
    if given is None:
        return None
    try:
        last = int(given)
    except ValueError:
        raise BadInput(f"Last-Event-ID must be an event id (a number) this API sent, got {given[:40]!r}") from None
    if last < 0:
        raise BadInput(f"Last-Event-ID must be >= 0, got {last}")
    return last + 1


async def stream_events(request: web.Request) -> web.StreamResponse:
    ctx = ctx_of(request)
    caller: core.Principal = request[USER]
    job = request.query.get("job")
    if job is not None:
        try:
            ids.split_job_id(job)
        except ValueError:
            raise BadInput(f"job must be a job id user~name, got {job[:80]!r}") from None
        if len(job) > MAX_USERNAME_LENGTH + 1 + MAX_JOB_NAME_LENGTH:
            raise BadInput(f"job: no job id is longer than {MAX_USERNAME_LENGTH + 1 + MAX_JOB_NAME_LENGTH} characters")
    user, name = _scope(caller, job)
    subject = subject_filter(caller, job)
    cursor = _start_sequence(request)
    info = await ctx.bus.js.stream_info(STREAM)
    if cursor is None:  # from now on
        cursor = info.state.last_seq + 1
    hub: EventHub = request.app[HUB]
    async with hub.watching(user, name) as watcher:
        return await _stream(request, ctx, hub, watcher, subject, cursor, info)


async def _stream(request: web.Request, ctx, hub: EventHub, watcher: Watcher, subject: str, cursor: int,
                  info) -> web.StreamResponse:
    heartbeat = ctx.config.rest_events_heartbeat_seconds
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    try:
        await response.write(f"retry: {RETRY_MILLISECONDS}\n\n".encode())
        if cursor < info.state.first_seq:
            # Older events have aged out of the stream: say so rather than pretend nothing happened.
            note = {"message": f"events {cursor} to {info.state.first_seq - 1} are no longer kept; "
                               "read the jobs' current state with GET /api/v2/jobs"}
            await response.write(f"event: gap\ndata: {json.dumps(note)}\n\n".encode())
            cursor = info.state.first_seq
        cursor = await _catch_up(request, response, hub, subject, cursor, watcher.handover)
        while not hub.closing and not _gone(request):
            if not watcher.queue:
                watcher.ready.clear()
                if watcher.behind:
                    await _tell_to_reconnect(response, cursor)
                    break
                try:
                    await asyncio.wait_for(watcher.ready.wait(), heartbeat)
                except TimeoutError:
                    await response.write(b": heartbeat\n\n")
                continue
            chunk = []
            while watcher.queue:
                seq, data = watcher.queue.popleft()
                if seq >= cursor:  # a stream that started after the hub's position skips the earlier ones
                    chunk.append(data)
                    cursor = seq + 1
            if chunk:
                await response.write(b"".join(chunk))
    except (ConnectionResetError, ConnectionError):
        pass  # the client went away; it resumes with Last-Event-ID
    return response


async def _catch_up(request: web.Request, response: web.StreamResponse, hub: EventHub, subject: str,
                    cursor: int, handover: int) -> int:
    """The caller's stored events from `cursor` up to (not including) `handover`, where
    the hub's hand-out to this stream begins; returns the cursor after them."""
    while cursor < handover and not hub.closing and not _gone(request):
        try:
            msg = await _next(hub.bus, cursor, subject)
        except _Unavailable:
            await asyncio.sleep(POLL_SECONDS)  # NATS is coming back: read again, skipping nothing
            continue
        if msg is None or msg.seq >= handover:
            return handover  # nothing more of the caller's before it: the queue goes on from there
        cursor = msg.seq + 1
        try:
            event = _decode.decode(msg.data)
        except msgspec.DecodeError:
            log.warning("event %d on %s is not a JobStateChanged; skipped", msg.seq, msg.subject)
            continue
        await response.write(sse_event(msg.seq, event))
    return cursor


async def _tell_to_reconnect(response: web.StreamResponse, cursor: int) -> None:
    note = {"message": "this stream fell too far behind; reconnect with the last event id you received",
            "lastEventId": cursor - 1}
    # With the id, an EventSource (and the portal, and `pai watch`) resumes from it by itself.
    await response.write(f"id: {cursor - 1}\nevent: reconnect\ndata: {json.dumps(note)}\n\n".encode())


def _gone(request: web.Request) -> bool:
    """The client hung up (noticed at the next wake-up or heartbeat)."""
    return request.transport is None or request.transport.is_closing()


class _Unavailable(Exception):
    """The stream did not answer (NATS restarting); read again later from the same place."""


async def _next(bus: Bus, sequence: int, subject: str):
    """The first stored message at or after `sequence` on `subject`, or None when there
    is none yet; raises _Unavailable when NATS does not answer."""
    try:
        return await bus.js.get_msg(STREAM, seq=sequence, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
        # NATS restarting: the responses are under way, so no error body can be sent;
        # the streams stay open, and the read is tried again from the same sequence.
        log.warning("reading events after %d failed: %r", sequence, exc)
        raise _Unavailable from exc
