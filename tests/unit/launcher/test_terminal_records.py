"""What a restarted launcher records for a browser terminal session a crash cut
(services/launcher/core/terminals.py): one close, from the kept record alone."""

from __future__ import annotations

import msgspec

from libs.common.ids import EventId, JobId, VcName
from libs.common.messages import TerminalOpened, encode
from services.launcher.core.terminals import RESTARTED, HeldTerminal, closed_by_restart, closed_event

OPENED = TerminalOpened(id=EventId("alice~train/terminal/s1234567890abcdef/opened"), job=JobId("alice~train"),
                        at=1000.0, vc=VcName("default"), attempt=2, role="worker", index=1, by="bob",
                        session="s1234567890abcdef", mode="container")


def test_a_cut_session_is_closed_at_the_last_moment_it_was_known_alive():
    closed = closed_by_restart(HeldTerminal(opened=OPENED, aliveAt=1042.5))
    assert (closed.at, closed.seconds, closed.openedAt, closed.reason) == (1042.5, 42.5, 1000.0, RESTARTED)
    assert (closed.job, closed.vc, closed.attempt, closed.role, closed.index, closed.by, closed.session) == (
        "alice~train", "default", 2, "worker", 1, "bob", "s1234567890abcdef")
    # The same id as the close the session would have had: one close per session, whoever records it.
    assert closed.id == closed_event(OPENED, 1001.0, "the shell exited").id == (
        "alice~train/terminal/s1234567890abcdef/closed")


def test_the_close_is_the_same_event_however_often_the_launcher_restarts():
    kept = msgspec.json.encode(HeldTerminal(opened=OPENED, aliveAt=1010.0))
    once, twice = (closed_by_restart(msgspec.json.decode(kept, type=HeldTerminal)) for _ in range(2))
    assert encode(once) == encode(twice)
    # A record whose aliveAt is behind its opening (a clock stepped back) closes after 0 s, not before it opened.
    assert closed_by_restart(HeldTerminal(opened=OPENED, aliveAt=990.0)).seconds == 0
