"""GET /api/v2/events: job state changes as Server-Sent Events.

Each SSE event is one `JobStateChanged` from the event stream, and its `id:` is the
event's JetStream sequence. A client that reconnects with `Last-Event-ID` (or
`?lastEventId=`) gets every later event of its jobs, in order, none twice, so a
rest restart between two connections loses nothing.

One reader per rest process (`EventHub`), not one per stream: while at least one
stream is open, the hub holds one subscription on the job-state subjects, which
wakes it, and reads each new job-state event once, in sequence order, from the
stream (`STREAM.MSG.GET` with `next_by_subj`: the sequence is what makes the SSE id,
and a live message does not carry it). It encodes the event once and hands it to
every open stream whose filter matches, from memory, into that stream's bounded
queue. With 1,000 streams open an event costs one read, not 1,000.

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
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from aiohttp import web

from libs.common import ids
from libs.common.bus import Bus
from libs.common.errors import BadInput
from libs.common.messages import JobStateChanged
from libs.common.protocol.limits import MAX_JOB_NAME_LENGTH, MAX_USERNAME_LENGTH
from libs.common.subjects import PREFIX, STREAM, Kind, kind_filter
from services.rest.identity import core
from services.rest.request import CTX, USER, ctx_of

log = logging.getLogger("pai.rest.events")

# How often the hub looks at the stream without being woken (a wake-up may come
# before the stream has stored the event, or a live message may have been dropped).
POLL_SECONDS = 2.0
# After a wake-up that found nothing stored yet, how soon to look again.
RECHECK_SECONDS = 0.05
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


class EventHub:
    """The one reader of job state events in this rest process, and its fan-out.

    Runs while at least one stream is open (`watching`), not for the life of the
    process: under a burst of submissions with no one watching, each event would
    cost rest and nats-server a delivery and a read."""

    def __init__(self, bus: Bus, *, queue_limit: int = STREAM_QUEUE_EVENTS):
        self.bus = bus
        self.queue_limit = queue_limit
        self.cursor = 0  # the next sequence the hub reads; every earlier event is handed out
        self._admins: set[Watcher] = set()  # every job
        self._by_user: dict[str, set[Watcher]] = {}  # every job of one user
        self._by_job: dict[tuple[str, str], set[Watcher]] = {}  # one job
        self._watchers = 0
        self._woken = asyncio.Event()
        self._subscription: Any = None
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
        # Subscribed before the stream's last sequence is read: an event stored after
        # that read wakes the reader, and one stored before it is not the hub's.
        self._subscription = await self.bus.nc.subscribe(kind_filter(Kind.JOB_STATE), cb=self._on_event)
        try:
            info = await self.bus.js.stream_info(STREAM)
        except BaseException:
            await self.stop()
            raise
        self.cursor = info.state.last_seq + 1
        self._reader = asyncio.create_task(self._read(), name="event-hub")

    async def stop(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            try:
                await subscription.unsubscribe()
            except Exception:  # the connection is gone already
                pass

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

    async def _on_event(self, _msg) -> None:
        self._woken.set()

    async def _read(self) -> None:
        """Read every job-state event from `cursor` on, once, and hand each out."""
        while True:
            try:
                await asyncio.wait_for(self._woken.wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass
            self._woken.clear()  # before reading: a wake-up during the read is kept
            try:
                if not await self._read_stored() and not self._woken.is_set():
                    # Woken by a publication the stream had not stored yet: look again soon.
                    await asyncio.sleep(RECHECK_SECONDS)
                    await self._read_stored()
            except _Unavailable:
                pass  # read again from the same sequence at the next wake-up or poll
            except Exception:
                # A bug; the streams stay open and the reader goes on at the next poll
                # rather than leave every stream of this process silent.
                log.exception("the event hub failed reading after %d", self.cursor)

    async def _read_stored(self) -> int:
        handed = 0
        while (msg := await _next(self.bus, self.cursor, f"{_STATE_SUBJECT}.>")) is not None:
            self.hand_out(msg.seq, msg.subject, msg.data)
            handed += 1
        return handed

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
                except asyncio.TimeoutError:
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
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        # NATS restarting: the responses are under way, so no error body can be sent;
        # the streams stay open, and the read is tried again from the same sequence.
        log.warning("reading events after %d failed: %r", sequence, exc)
        raise _Unavailable from exc
