"""Browser terminal sessions across launcher restarts: what is kept of an open session
and how its end is recorded (the shell side is services/launcher/terminals.py).

A session's shell is the launcher's child on a pty (or an exec stream) it holds: a
launcher killed -9 takes its sessions with it, and its `terminal.opened` would never get
its `terminal.closed`. So each open session is kept in the `pai_terminals` bucket (key:
the session id) from before its opening is published until after its end is, with the
last moment the launcher was known to hold it (`aliveAt`, refreshed every
TERMINAL_ALIVE_SECONDS); a restarted launcher, which holds no session, closes each one
left there. Its close is built from the record alone (`at` is `aliveAt`, the length is
measured to it), so a restart repeated before the record is gone publishes the same
event with the same id, which the event stream stores once.
"""

from __future__ import annotations

import msgspec

from libs.common.messages import TerminalClosed, TerminalOpened, terminal_event_id

# How often an open session's `aliveAt` is written: a session cut by a crash is
# recorded as this much shorter than it was, at most.
TERMINAL_ALIVE_SECONDS = 10.0

RESTARTED = ("the launcher restarted: the session was cut when it stopped; its length is measured "
             "to the last moment the launcher was known to hold it open")


class HeldTerminal(msgspec.Struct, frozen=True, kw_only=True):
    """One open session in `pai_terminals`: its opening as published, and the last
    moment (seconds since the epoch) the launcher was known to hold it."""

    opened: TerminalOpened
    aliveAt: float


def closed_event(opened: TerminalOpened, at: float, reason: str) -> TerminalClosed:
    """The end of the session `opened` began, at `at`: the one `terminal.closed` it gets
    (its id is the session's, whoever publishes it)."""
    return TerminalClosed(
        id=terminal_event_id(opened.job, opened.session, "closed"), job=opened.job, cause=opened.cause, at=at,
        vc=opened.vc, attempt=opened.attempt, role=opened.role, index=opened.index, by=opened.by,
        session=opened.session, openedAt=opened.at, seconds=round(max(0.0, at - opened.at), 3), reason=reason)


def closed_by_restart(held: HeldTerminal) -> TerminalClosed:
    """The close a restarted launcher records for a session it no longer holds."""
    return closed_event(held.opened, max(held.aliveAt, held.opened.at), RESTARTED)
