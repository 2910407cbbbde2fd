"""GET /api/v2/events: job state changes as Server-Sent Events.

Each SSE event is one `JobStateChanged` from the event stream, and its `id:` is the
event's JetStream sequence. A client that reconnects with `Last-Event-ID` (or
`?lastEventId=`) gets every later event of its jobs, in order, none twice: the
stream is read by sequence (`STREAM.MSG.GET` with `next_by_subj`), never from a
buffer in this process, so a rest restart between two connections loses nothing.

The caller sees their own jobs (admins: every job), filtered by subject, so the
server never reads another user's events on their behalf; `?job=user~name` narrows
to one job. A live subscription on the job-state subjects only wakes the readers;
they poll as well, in case a wake-up came before the stream had stored the event.
While nothing happens a comment line goes out every heartbeat, so proxies keep the
connection and a client notices a dead one. The subscription stands only while a
stream is open: without one, rest does not receive the job-state events at all
(three per job, each a message nats-server sends and rest parses for nobody).
"""

from __future__ import annotations

import asyncio
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

# How often an idle reader looks at the stream without being woken.
POLL_SECONDS = 2.0
RETRY_MILLISECONDS = 3000  # the reconnect delay EventSource clients are told
_decode = msgspec.json.Decoder(JobStateChanged)


class EventHub:
    """Wakes every open event stream of this process when a job state event is published.

    Subscribed while at least one stream is open (`reading`), not for the life of
    the process: under a burst of submissions with no one watching, each event
    would cost rest and nats-server a delivery."""

    def __init__(self, bus: Bus):
        self.bus = bus
        self._published = asyncio.Event()
        self._subscription: Any = None
        self._readers = 0
        self._subscribing = asyncio.Lock()  # a first reader and a last one leaving at once: one subscription
        self.closing = False  # rest is shutting down: every stream ends (clients resume elsewhere)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """While one event stream is open. Subscribed before it returns, so an event
        published after it is entered wakes the stream (the stream's reads, sent
        afterwards on the same connection, reach NATS after the subscription)."""
        async with self._subscribing:
            if self._subscription is None:
                self._subscription = await self.bus.nc.subscribe(kind_filter(Kind.JOB_STATE), cb=self._on_event)
            self._readers += 1
        try:
            yield
        finally:
            async with self._subscribing:
                self._readers -= 1
                if self._readers == 0:
                    await self.stop()

    async def stop(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            try:
                await subscription.unsubscribe()
            except Exception:  # the connection is gone already
                pass

    async def _on_event(self, _msg) -> None:
        self._wake()

    def _wake(self) -> None:
        woken, self._published = self._published, asyncio.Event()
        woken.set()

    async def close_streams(self, _app: web.Application) -> None:
        self.closing = True
        self._wake()

    def next_publication(self) -> asyncio.Event:
        """Set when the next job state event is published after this call."""
        return self._published


HUB = web.AppKey("event_hub", EventHub)


async def _hub_ctx(app: web.Application) -> AsyncIterator[None]:
    hub = EventHub(app[CTX].bus)
    app[HUB] = hub
    app.on_shutdown.append(hub.close_streams)
    yield
    await hub.stop()


def setup(app: web.Application) -> None:
    app.cleanup_ctx.append(_hub_ctx)
    app.add_routes([web.get("/api/v2/events", stream_events)])


def subject_filter(caller: core.Principal, job: str | None) -> str:
    """The job-state subjects `caller` may read: `pai.v1.job.state.<vc>.<user>.<job>`."""
    base = f"{PREFIX}.{Kind.JOB_STATE.value}"
    if job:
        user, name = ids.split_job_id(job)
        core.require(caller, core.Action.WATCH_EVENTS, user, what=job)
        return f"{base}.*.{user}.{name}"
    return f"{base}.>" if caller.admin else f"{base}.*.{caller.username}.>"


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
    subject = subject_filter(caller, job)
    cursor = _start_sequence(request)
    info = await ctx.bus.js.stream_info(STREAM)
    if cursor is None:  # from now on
        cursor = info.state.last_seq + 1
    hub: EventHub = request.app[HUB]
    async with hub.reading():
        return await _stream(request, ctx, hub, subject, cursor, info)


async def _stream(request: web.Request, ctx, hub: EventHub, subject: str, cursor: int, info) -> web.StreamResponse:
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
        idle = 0.0
        while not hub.closing and not _gone(request):
            woken = hub.next_publication()  # before reading, so a publication meanwhile is not missed
            sent = 0
            while (msg := await _next(ctx.bus, cursor, subject)) is not None:
                cursor = msg.seq + 1
                try:
                    event = _decode.decode(msg.data)
                except msgspec.DecodeError:
                    log.warning("event %d on %s is not a JobStateChanged; skipped", msg.seq, msg.subject)
                    continue
                data = json.dumps(event_view(event))
                await response.write(f"id: {msg.seq}\nevent: job.state\ndata: {data}\n\n".encode())
                sent += 1
            if sent:
                idle = 0.0
            wait = min(POLL_SECONDS, max(0.0, heartbeat - idle))
            try:
                await asyncio.wait_for(woken.wait(), wait)
            except asyncio.TimeoutError:
                idle += wait
                if idle >= heartbeat:
                    await response.write(b": heartbeat\n\n")
                    idle = 0.0
    except (ConnectionResetError, ConnectionError):
        pass  # the client went away; it resumes with Last-Event-ID
    return response


def _gone(request: web.Request) -> bool:
    """The client hung up (noticed at the next poll rather than the next heartbeat)."""
    return request.transport is None or request.transport.is_closing()


async def _next(bus: Bus, sequence: int, subject: str):
    """The first stored message at or after `sequence` on `subject`, or None."""
    try:
        return await bus.js.get_msg(STREAM, seq=sequence, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    except (nats.errors.Error, asyncio.TimeoutError) as exc:
        # NATS restarting: the response is under way, so no error body can be sent;
        # keep the connection, and read again at the next poll.
        log.warning("reading events after %d failed: %r", sequence, exc)
        return None
