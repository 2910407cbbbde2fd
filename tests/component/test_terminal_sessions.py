"""The launcher's side of browser terminals (services/launcher/terminals.py) on a real
nats-server with PAI's permissions: rest (logged in as `rest`) opens a session over
request/reply and talks on the session's subjects; the launcher (as `launcher`) relays
to a shell, here a stand-in that answers each line in capitals. Every session is
recorded (terminal.opened, terminal.closed with its length and why it ended); it ends
when rest says so, when nothing is typed for the idle limit, when the task ends; a
refusal comes back with the status rest answers with. A session a launcher could not
close (its NATS gone as it died) is closed by the next launcher, once however often it
restarts."""

from __future__ import annotations

import asyncio
import secrets

import msgspec
import pytest

from libs.common.bus import Bus, get_json
from libs.common.messages import (
    TerminalClosed,
    TerminalInput,
    TerminalOpen,
    TerminalOpened,
    TerminalOpenReply,
    TerminalOutput,
    decode,
)
from libs.common.subjects import STREAM, Bucket, Kind, job_subject, terminal_input_subject, terminal_output_subject
from services.launcher.core.tasks import TaskKey
from services.launcher.core.terminals import RESTARTED, HeldTerminal
from services.launcher.terminals import Located, TerminalSessions
from services.rest.terminal import _ask_launcher

JOB = "alice~shell"


class UpperShell:
    """A shell stand-in: each line written comes back in capitals; `exit` ends it."""

    mode = "process"

    def __init__(self):
        self.out: asyncio.Queue[bytes] = asyncio.Queue()
        self.sizes: list[tuple[int, int]] = []
        self.closed = False

    async def read(self) -> bytes:
        return await self.out.get()

    async def write(self, data: bytes) -> None:
        self.out.put_nowait(b"" if data.strip() == b"exit" else data.upper())

    async def resize(self, cols: int, rows: int) -> None:
        self.sizes.append((cols, rows))

    async def close(self) -> None:
        self.closed = True


class World:
    def __init__(self, rest: Bus, launcher: Bus, watcher: Bus):
        self.rest, self.launcher, self.watcher = rest, launcher, watcher
        self.shells: list[UpperShell] = []
        self.running = True
        self.events: list = []

    async def opener(self, key: TaskKey, *, cols: int, rows: int) -> UpperShell:
        shell = UpperShell()
        shell.sizes.append((cols, rows))
        self.shells.append(shell)
        return shell

    def locate(self, job: str, role: str, index: int) -> Located | TerminalOpenReply:
        if job != JOB or role != "main":
            return TerminalOpenReply(ok=False, status=404, error=f"{job} has no task {role}[{index}]")
        if not self.running:
            return TerminalOpenReply(ok=False, status=409, error="not running")
        return Located(TaskKey(job=job, attempt=1, role=role, index=index), "default")

    async def open(self, **fields) -> tuple[str, TerminalOpenReply, asyncio.Queue]:
        session = fields.pop("session", secrets.token_urlsafe(24))
        got: asyncio.Queue = asyncio.Queue()

        async def on_output(msg) -> None:
            got.put_nowait(msgspec.json.decode(msg.data, type=TerminalOutput))

        await self.rest.nc.subscribe(terminal_output_subject(session), cb=on_output)
        ask = TerminalOpen(**({"session": session, "job": JOB, "role": "main", "index": 0, "by": "alice"} | fields))
        msg = await _ask_launcher(self.rest.nc, msgspec.json.encode(ask))  # as rest asks
        return session, msgspec.json.decode(msg.data, type=TerminalOpenReply), got

    async def send(self, session: str, **fields) -> None:
        await self.rest.nc.publish(terminal_input_subject(session), msgspec.json.encode(TerminalInput(**fields)))

    async def closed_event(self, session: str) -> TerminalClosed:
        for _ in range(200):
            found = [e for e in self.events if isinstance(e, TerminalClosed) and e.session == session]
            if found:
                return found[0]
            await asyncio.sleep(0.05)
        raise AssertionError(f"no terminal.closed for {session}")


@pytest.fixture
async def world(nats_server):
    rest = await Bus.connect(nats_server.url, name="rest", **nats_server.login("rest"))
    launcher = await Bus.connect(nats_server.url, name="launcher", **nats_server.login("launcher"))
    watcher = await Bus.connect(nats_server.url, name="integrator", **nats_server.login("integrator"))
    w = World(rest, launcher, watcher)

    async def on_event(msg) -> None:
        w.events.append(decode(msg.data))

    await watcher.nc.subscribe("pai.v1.terminal.>", cb=on_event)
    try:
        yield w
    finally:
        for bus in (rest, launcher, watcher):
            await bus.close()


async def next_output(got: asyncio.Queue) -> TerminalOutput:
    while True:
        out = await asyncio.wait_for(got.get(), 10)
        if out.data or out.closed:
            return out  # (pings carry neither)


async def test_a_session_relays_both_ways_and_is_recorded_from_open_to_close(world: World):
    sessions = TerminalSessions(world.launcher, world.opener, world.locate, idle_seconds=60, most=4)
    await sessions.serve()
    session, reply, got = await world.open(cols=120, rows=40)
    assert reply == TerminalOpenReply(ok=True, mode="process")
    await world.send(session, data=b"whoami\n")
    assert (await next_output(got)).data == b"WHOAMI\n"
    await world.send(session, cols=100, rows=30)
    await world.send(session, close=True)
    closing = await next_output(got)
    assert closing.closed and closing.reason == "closed by the browser"
    shell = world.shells[0]
    assert shell.closed and shell.sizes == [(120, 40), (100, 30)]
    closed = await world.closed_event(session)
    opened = next(e for e in world.events if isinstance(e, TerminalOpened) and e.session == session)
    assert (opened.by, opened.role, opened.index, opened.mode, opened.vc) == ("alice", "main", 0, "process", "default")
    assert (closed.by, closed.reason, closed.openedAt) == ("alice", "closed by the browser", opened.at)
    assert closed.seconds >= 0 and closed.id == f"{JOB}/terminal/{session}/closed"
    await sessions.close()


async def test_the_shell_exiting_the_idle_limit_and_the_task_ending_each_end_a_session(world: World):
    sessions = TerminalSessions(world.launcher, world.opener, world.locate, idle_seconds=0.6, most=4)
    await sessions.serve()
    exiting, _, got = await world.open()
    await world.send(exiting, data=b"exit\n")
    assert (await next_output(got)).reason == "the shell exited"

    idle, _, got = await world.open()
    assert (await next_output(got)).reason == "nothing typed for 0.6s (terminal_idle_seconds)"
    assert (await world.closed_event(idle)).reason.startswith("nothing typed")

    sessions.idle_seconds = 3  # (the end of a task is checked every idle/4 seconds, 10 at most)
    ending, _, got = await world.open()
    world.running = False
    assert (await next_output(got)).reason == "the task ended"
    assert all(shell.closed for shell in world.shells)
    await sessions.close()


async def test_refusals_come_back_with_their_status(world: World):
    sessions = TerminalSessions(world.launcher, world.opener, world.locate, idle_seconds=60, most=1)
    await sessions.serve()
    assert (await world.open(role="nope"))[1].status == 404
    assert (await world.open(session="short"))[1].status == 400
    kept, reply, _ = await world.open()
    assert reply.ok
    refused = (await world.open())[1]
    assert (refused.ok, refused.status) == (False, 503) and "terminal_sessions_max" in refused.error
    world.running = False
    await world.send(kept, close=True)
    await world.closed_event(kept)
    assert (await world.open())[1].status == 409
    assert not [e for e in world.events if isinstance(e, TerminalOpened) and e.session != kept]  # refusals record nothing
    await sessions.close()


async def closes_stored(platform: Bus) -> int:
    """How many terminal.closed events of JOB the event stream holds (what JetStream
    stored, after its deduplication by event id)."""
    subject = job_subject(Kind.TERMINAL_CLOSED, "default", JOB)
    info = await platform.js.stream_info(STREAM, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def test_a_session_cut_by_a_dying_launcher_is_closed_once_by_the_next(world: World, nats_server):
    platform = await Bus.connect(nats_server.url, name="terminal-restarts", **nats_server.login("platform"))
    dying = await Bus.connect(nats_server.url, name="launcher", **nats_server.login("launcher"))
    try:
        first = TerminalSessions(dying, world.opener, world.locate, idle_seconds=60, most=4)
        await first.serve()
        session, reply, got = await world.open()
        assert reply.ok
        kept, _ = await get_json(await platform.kv(Bucket.TERMINALS), session, HeldTerminal)
        assert kept.opened.session == session and kept.aliveAt == kept.opened.at
        before = await closes_stored(platform)
        # Its connection gone before it could record the end (as a launcher killed -9):
        # the session's opening stands alone in the events.
        await dying.close()
        await first.close()
        await asyncio.sleep(0.3)
        assert not [e for e in world.events if isinstance(e, TerminalClosed) and e.session == session]

        restarted = TerminalSessions(world.launcher, world.opener, world.locate, idle_seconds=60, most=4)
        await restarted.serve()
        closed = await world.closed_event(session)
        opened = next(e for e in world.events if isinstance(e, TerminalOpened) and e.session == session)
        assert (closed.reason, closed.openedAt, closed.by) == (RESTARTED, opened.at, "alice")
        assert closed.at == kept.aliveAt and closed.seconds == 0  # measured to the last moment known alive
        assert await get_json(await platform.kv(Bucket.TERMINALS), session, HeldTerminal) is None
        assert await closes_stored(platform) == before + 1

        # Killed again after publishing the close but before removing the record: the
        # next launcher publishes the same close, stored once.
        await platform.kv_write_many(Bucket.TERMINALS, {session: msgspec.json.encode(kept)})
        again = TerminalSessions(world.launcher, world.opener, world.locate, idle_seconds=60, most=4)
        await again.serve()
        for _ in range(100):
            if await get_json(await platform.kv(Bucket.TERMINALS), session, HeldTerminal) is None:
                break
            await asyncio.sleep(0.05)
        assert await closes_stored(platform) == before + 1
        assert [e for e in world.events if isinstance(e, TerminalClosed) and e.session == session][-1] == closed
        for sessions in (restarted, again):
            await sessions.close()
    finally:
        await platform.close()
