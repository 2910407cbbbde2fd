"""Browser terminals in running tasks: the launcher's side (it owns the tasks).

rest authorises the caller and asks over `TERMINAL_OPEN_SUBJECT` (libs/common/subjects.py);
this module finds the task running, has the backend open a shell in it
(backends/terminals.py: a pty, the engine's exec or Kubernetes' exec), records
`terminal.opened`, and relays: what the shell writes goes out on the session's output
subject, keys and resizes come in on its input subject. The session ends, recorded by
`terminal.closed` with its length, when the shell exits, rest says the browser closed,
nothing was typed for `terminal_idle_seconds`, rest has not been heard from for
TERMINAL_LINK_SECONDS (its process died), or the task ended. A session's shell is the
launcher's child on a pty (or stream) it holds, which ends with it; each open session is
kept in the `pai_terminals` bucket, so a launcher killed -9 records the end of those it
held when it starts again (core/terminals.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable

import msgspec

from libs.common.bus import load_all
from libs.common.errors import NotFound, PaiError
from libs.common.ids import EventId, JobId, VcName
from libs.common.messages import (
    TerminalInput,
    TerminalOpen,
    TerminalOpened,
    TerminalOpenReply,
    TerminalOutput,
    terminal_event_id,
)
from libs.common.subjects import (
    TERMINAL_LINK_SECONDS,
    TERMINAL_OPEN_SUBJECT,
    TERMINAL_PING_SECONDS,
    Bucket,
    terminal_input_subject,
    terminal_output_subject,
)
from services.launcher.backends.terminals import TerminalChannel
from services.launcher.core.tasks import TaskKey
from services.launcher.core.terminals import TERMINAL_ALIVE_SECONDS, HeldTerminal, closed_by_restart, closed_event

log = logging.getLogger(__name__)

# rest's session ids (services/rest/terminal.py): random, safe as one subject token.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
_encode = msgspec.json.Encoder().encode
_open_decoder = msgspec.json.Decoder(TerminalOpen)
_input_decoder = msgspec.json.Decoder(TerminalInput)
# A record's delete marker in pai_terminals need not outlive a moment (a session id is never reused).
_MARKER_SECONDS = 60.0


class Located(msgspec.Struct, frozen=True):
    key: TaskKey
    vc: str


# (job, role, index) -> the running task, or the refusal to answer with.
Locate = Callable[[str, str, int], "Located | TerminalOpenReply"]
Opener = Callable[..., Awaitable[TerminalChannel]]


class _Session:
    def __init__(self, req: TerminalOpen, where: Located, channel: TerminalChannel, opened: TerminalOpened):
        self.req = req
        self.where = where
        self.channel = channel
        self.opened = opened
        now = time.monotonic()
        self.kept_at = now  # its record's aliveAt last written
        self.typed_at = now  # keys or a resize
        self.heard_at = now  # any word from rest, a ping included
        self.close_reason = ""
        self.wake = asyncio.Event()
        self.sub = None


class TerminalSessions:
    def __init__(self, bus, opener: Opener | None, locate: Locate, *, idle_seconds: float, most: int,
                 clock: Callable[[], float] = time.time):
        self.bus = bus
        self._opener = opener
        self._locate = locate
        self.idle_seconds = idle_seconds
        self.most = most
        self._clock = clock
        self._sessions: dict[str, _Session] = {}
        self._runs: set[asyncio.Task] = set()

    async def serve(self) -> None:
        await self.close_left_over()
        await self.bus.nc.subscribe(TERMINAL_OPEN_SUBJECT, queue="launcher", cb=self._on_open)
        await self.bus.round_trip()  # the server has it before the launcher says it is ready

    async def close_left_over(self) -> None:
        """Record the end of every session a previous launcher left open (killed -9, or
        its NATS gone as it stopped): at start-up this one holds none. Each opening is
        published again first (the same event: stored once), in case the crash came
        between its record and its publication; then its close, then the record goes."""
        held: dict[str, HeldTerminal] = await load_all(await self.bus.kv(Bucket.TERMINALS), HeldTerminal,
                                                       skip_undecodable=True)
        for key, record in held.items():
            await self.bus.publish(record.opened)
            await self.bus.publish(closed_by_restart(record))
            await self._forget(key)
            log.warning("terminal %s of %s in %s was cut by a launcher restart; its end is recorded",
                        key, record.opened.by, record.opened.job)

    async def _keep(self, session: _Session, alive_at: float) -> None:
        await self.bus.kv_write_many(Bucket.TERMINALS, {
            session.req.session: _encode(HeldTerminal(opened=session.opened, aliveAt=alive_at))})

    async def _forget(self, session_id: str) -> None:
        await self.bus.kv_write_many(Bucket.TERMINALS, {session_id: None}, gone_after=_MARKER_SECONDS)

    async def close(self) -> None:
        for session in self._sessions.values():
            session.close_reason = session.close_reason or "the launcher stopped"
            session.wake.set()
        if self._runs:
            await asyncio.wait(self._runs, timeout=10)

    async def _on_open(self, msg) -> None:
        try:
            req = _open_decoder.decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            reply = TerminalOpenReply(ok=False, status=400, error=f"bad terminal request: {exc}")
        else:
            try:
                reply = await self._open(req)
            except Exception as exc:  # noqa: BLE001 - answered (rest shows it), logged loudly
                log.exception("opening a terminal in %s %s[%d]", req.job, req.role, req.index)
                reply = TerminalOpenReply(ok=False, status=503, error=f"the launcher could not open a terminal: {exc}")
        await msg.respond(_encode(reply))

    async def _open(self, req: TerminalOpen) -> TerminalOpenReply:
        if not SESSION_ID.fullmatch(req.session) or req.session in self._sessions:
            return TerminalOpenReply(ok=False, status=400, error="bad terminal session id")
        if len(self._sessions) >= self.most:
            return TerminalOpenReply(ok=False, status=503, error=(
                f"{self.most} terminals are open on this launcher, the most it keeps (terminal_sessions_max); "
                "close one or try later"))
        if self._opener is None:
            return TerminalOpenReply(ok=False, status=503, error="this launcher's backend cannot open terminals")
        where = self._locate(req.job, req.role, req.index)
        if isinstance(where, TerminalOpenReply):
            return where
        try:
            channel = await self._opener(where.key, cols=req.cols, rows=req.rows)
        except NotFound as exc:
            return TerminalOpenReply(ok=False, status=409, error=exc.message)
        except (PaiError, OSError) as exc:
            return TerminalOpenReply(ok=False, status=503, error=f"the shell could not be started: {exc}")
        opened_at = self._clock()
        session = _Session(req, where, channel, TerminalOpened(
            id=terminal_event_id(req.job, req.session, "opened"), job=JobId(req.job), cause=EventId(""),
            at=opened_at, vc=VcName(where.vc), attempt=where.key.attempt, role=req.role, index=req.index,
            by=req.by, session=req.session, mode=channel.mode))
        try:
            # Kept, then recorded, before it is used: every session is in the job's
            # events, and a crash from here on still gets it its close (close_left_over).
            await self._keep(session, opened_at)
            await self.bus.publish(session.opened)

            async def on_input(msg) -> None:
                await self._on_input(session, msg)

            session.sub = await self.bus.nc.subscribe(terminal_input_subject(req.session), cb=on_input)
            await self.bus.round_trip()  # subscribed at the server before rest hears "ok" and sends keys
        except BaseException:
            await channel.close()
            with contextlib.suppress(Exception):  # never opened: no close to record for it
                await self._forget(req.session)
            raise
        self._sessions[req.session] = session
        run = asyncio.ensure_future(self._run(session))
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)
        log.info("terminal %s opened by %s in %s %s[%d] (%s)", req.session, req.by, req.job, req.role, req.index,
                 channel.mode)
        return TerminalOpenReply(ok=True, mode=channel.mode)

    async def _on_input(self, session: _Session, msg) -> None:
        try:
            got = _input_decoder.decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return  # only rest may send here (the bus's permissions): nothing to answer
        now = time.monotonic()
        session.heard_at = now
        if got.close:
            session.close_reason = session.close_reason or "closed by the browser"
            session.wake.set()
            return
        if got.cols and got.rows:
            session.typed_at = now
            await session.channel.resize(got.cols, got.rows)
        if got.data:
            session.typed_at = now
            await session.channel.write(got.data)

    async def _pump(self, session: _Session) -> None:
        subject = terminal_output_subject(session.req.session)
        while True:
            data = await session.channel.read()
            if not data:
                return
            await self.bus.nc.publish(subject, _encode(TerminalOutput(data=data)))

    async def _run(self, session: _Session) -> None:
        pump = asyncio.ensure_future(self._pump(session))
        subject = terminal_output_subject(session.req.session)
        reason = ""
        # Pings go at least every TERMINAL_PING_SECONDS; an idle limit shorter than that is kept too.
        tick = min(TERMINAL_PING_SECONDS, max(0.2, self.idle_seconds / 4))
        try:
            while not reason:
                waker = asyncio.ensure_future(session.wake.wait())
                await asyncio.wait({pump, waker}, timeout=tick, return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
                session.wake.clear()
                now = time.monotonic()
                if session.close_reason:
                    reason = session.close_reason
                elif pump.done():
                    failed = pump.exception()
                    reason = "the shell exited" if failed is None else f"the shell's output failed: {failed}"
                elif now - session.typed_at > self.idle_seconds:
                    reason = f"nothing typed for {self.idle_seconds:g}s (terminal_idle_seconds)"
                elif now - session.heard_at > TERMINAL_LINK_SECONDS:
                    reason = "rest stopped answering"
                elif isinstance(self._locate(session.req.job, session.req.role, session.req.index), TerminalOpenReply):
                    reason = "the task ended"
                else:
                    await self.bus.nc.publish(subject, _encode(TerminalOutput()))  # a ping
                    if now - session.kept_at >= TERMINAL_ALIVE_SECONDS:
                        session.kept_at = now
                        await self._keep_alive(session)
        except Exception as exc:  # noqa: BLE001 - the session ends, recorded; the launcher goes on
            log.exception("terminal %s", session.req.session)
            reason = f"the relay failed: {exc}"
        finally:
            pump.cancel()
            await self._end(session, reason or "the launcher stopped")

    async def _keep_alive(self, session: _Session) -> None:
        try:
            await self._keep(session, self._clock())
        except Exception:  # noqa: BLE001 - the session goes on; cut by a crash, it would count shorter
            log.warning("terminal %s: its record's aliveAt could not be written", session.req.session, exc_info=True)

    async def _end(self, session: _Session, reason: str) -> None:
        req = session.req
        self._sessions.pop(req.session, None)
        with contextlib.suppress(Exception):
            await session.channel.close()
        with contextlib.suppress(Exception):
            if session.sub is not None:
                await session.sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self.bus.nc.publish(terminal_output_subject(req.session),
                                      _encode(TerminalOutput(closed=True, reason=reason)))
        try:
            await self.bus.publish(closed_event(session.opened, self._clock(), reason))
        except Exception:  # noqa: BLE001 - the opening is recorded; its end is, by the next launcher
            log.exception("recording the end of terminal %s", req.session)
        else:
            # Only once its end is stored: a crash before leaves the record for the next launcher.
            try:
                await self._forget(req.session)
            except Exception:  # noqa: BLE001 - the next launcher publishes the same close (stored once)
                log.exception("removing the record of terminal %s", req.session)
        log.info("terminal %s of %s closed: %s", req.session, req.by, reason)
