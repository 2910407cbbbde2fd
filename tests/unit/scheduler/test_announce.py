"""When a wait is announced (JobWaiting): once the attempt has waited ANNOUNCE_WAIT_AFTER_S
and still waits, once per attempt. Its reason is stored when it is queued all the same."""

from __future__ import annotations

import pytest

from services.scheduler.core import ANNOUNCE_WAIT_AFTER_S, RefreshReasons

from .builders import Announce, Harness, Place, Wait, only

AFTER = ANNOUNCE_WAIT_AFTER_S


def announced(decisions) -> list[str]:
    """Jobs whose wait these decisions announce (an Announce, or a Wait that is `first`)."""
    return [d.job for d in decisions if isinstance(d, Announce) or (isinstance(d, Wait) and d.first)]


def a_full_vc() -> Harness:
    """VC speech's 8 A100 cells all held by "big"; "next" waits for them."""
    h = Harness("two-racks")
    assert only(h.submit("big", vc="speech", gpus=4, instances=2), Place)
    [wait] = only(h.submit("next", vc="speech", gpus=4, instances=2), Wait)
    assert not wait.first and h.core.entry("alice~next").reason == wait.reason
    return h


@pytest.mark.parametrize(
    ("what_happens_first", "seconds_waited", "announced_then", "announced_later"),
    [
        ("nothing", AFTER - 0.1, [], ["alice~next"]),  # not yet; then once it has lasted
        ("nothing", AFTER, ["alice~next"], []),  # waited long enough, still waits; never twice
        ("placed", AFTER, [], []),  # placed first (a burst's jobs): never announced
        ("cancelled", AFTER, [], []),  # stopped while waiting: nothing to announce
    ],
)
def test_a_wait_is_announced_only_once_it_has_lasted(what_happens_first, seconds_waited, announced_then,
                                                     announced_later):
    h = a_full_vc()
    if what_happens_first == "placed":
        assert [p.job for p in only(h.release("big"), Place)] == ["alice~next"]
    elif what_happens_first == "cancelled":
        h.cancel("next")
    assert announced(h.tick(seconds_waited)) == announced_then
    assert announced(h.tick(AFTER)) == announced_later


def test_each_attempt_of_a_requeued_job_is_announced_for_itself():
    h = Harness("two-racks")
    only(h.submit("batch", vc="speech", priority="test", gpus=4, instances=2), Place)
    h.tick(AFTER)
    h.finish_preempted(h.submit("urgent", vc="speech", priority="prod", gpus=4, instances=2))
    assert h.attempts["alice~batch"] == 1 and "alice~urgent" in h.placed  # attempt 1 of "batch" waits
    assert announced(h.tick(AFTER - 0.1)) == []
    announcements = only(h.tick(0.1), Announce)
    assert [(a.job, a.attempt) for a in announcements] == [("alice~batch", 1)]


def test_a_wait_given_after_the_wait_has_lasted_announces_it_itself():
    """A Wait given to an attempt that has waited long enough and was not announced yet (here a
    reasons refresh before the next tick) is the announcement; no Announce follows it."""
    h = Harness("two-racks")
    h.submit("big", vc="speech", gpus=4, instances=2)
    h.submit("second", vc="speech", gpus=4, instances=2)
    h.submit("late", vc="speech", gpus=4, instances=2)
    h.cancel("second")  # one job fewer ahead of "late": its reason's text changed
    h.clock.advance(AFTER)
    [wait] = only(h.handle(RefreshReasons(older_than=AFTER)), Wait)
    assert (wait.job, wait.first) == ("alice~late", True)
    assert announced(h.tick()) == []
