"""The core's side of the scheduler cycle (kueue's assume): a decision the shell could
not carry out comes back as NotSent and is given again, up to date, with the next event."""

from __future__ import annotations

from services.scheduler.core import ANNOUNCE_WAIT_AFTER_S, NotSent, RefreshReasons

from .builders import Announce, Harness, Place, Preempt, Wait, only


def test_a_place_not_sent_is_given_again_with_the_next_event_and_keeps_its_cells():
    h = Harness("two-racks")
    [place] = only(h.submit("a", vc="speech", gpus=2, instances=2), Place)
    cells = h.core.entry(place.job).tasks

    assert h.core.handle(NotSent(decision=place)) == []  # nothing at once: no retry loop
    [again] = only(h.tick(), Place)

    assert (again.job, again.attempt, again.tasks, again.partial) == (place.job, place.attempt, place.tasks, False)
    assert h.core.entry(place.job).tasks == cells
    assert only(h.tick(), Place) == []  # given once
    h.core.validate_state()


def test_a_place_not_sent_for_an_attempt_released_meanwhile_is_dropped():
    h = Harness("two-racks")
    [place] = only(h.submit("a", vc="speech"), Place)
    h.core.handle(NotSent(decision=place))
    h.release("a", requeue=True)  # attempt 2 is placed by this pass, attempt 1 is gone
    assert all(p.attempt != place.attempt for p in only(h.tick(), Place))


def test_a_wait_is_announced_once_old_enough_and_again_when_its_announcement_was_lost():
    h = Harness("two-racks")
    h.submit("big", vc="speech", gpus=4, instances=4)
    [wait] = only(h.submit("late", vc="speech", gpus=4, instances=4), Wait)
    assert not wait.first  # stored at once, announced only once it has waited

    h.clock.advance(ANNOUNCE_WAIT_AFTER_S - 0.5)
    assert only(h.tick(), Announce) == []
    h.clock.advance(0.5)
    announced = {a.job: a for a in only(h.tick(), Announce)}
    assert set(announced) == {"alice~big", "alice~late"}  # both still wait
    announce = announced[wait.job]
    assert announce.reason == wait.reason == h.core.entry(wait.job).reason

    h.core.handle(NotSent(decision=announce))
    assert only(h.tick(), Announce) == [announce]  # given again, up to date
    assert only(h.tick(), Announce) == []  # and once only


def test_announced_at_once_a_first_wait_lost_is_announced_again():
    h = Harness("two-racks", announce_wait_after_s=0.0)
    h.submit("big", vc="speech", gpus=4, instances=4)
    [first] = only(h.submit("late", vc="speech", gpus=4, instances=4), Wait)
    assert first.first

    h.core.handle(NotSent(decision=first))
    [again] = only(h.tick(), Wait)
    assert again.first and again.job == first.job


def test_a_preempt_not_sent_is_given_again_while_the_victim_is_still_being_preempted():
    h = Harness("two-racks")
    h.submit("batch", vc="speech", priority="test", gpus=4, instances=2)
    [preempt] = only(h.submit("urgent", vc="speech", priority="prod", gpus=4), Preempt)
    h.core.handle(NotSent(decision=preempt))
    assert only(h.tick(), Preempt) == [preempt]


def test_refresh_gives_a_quiet_wait_only_when_the_reason_text_changed():
    h = Harness("two-racks")
    h.submit("big", vc="speech", gpus=4, instances=4)
    h.submit("late", vc="speech", gpus=4, instances=4)
    assert h.core.handle(RefreshReasons()) == []
    h.submit("later", vc="speech", gpus=4, instances=4)  # changes no count in "late"'s reason
    for wait in only(h.core.handle(RefreshReasons()), Wait):
        assert not wait.first


def test_refresh_leaves_a_reason_younger_than_asked_and_gives_it_once_old_enough():
    h = Harness("two-racks", announce_wait_after_s=0.0)  # announced when queued: the refresh only stores
    h.submit("big", vc="speech", gpus=4, instances=2)
    h.submit("second", vc="speech", gpus=4, instances=2)
    [late] = only(h.submit("late", vc="speech", gpus=4, instances=2), Wait)
    h.cancel("second")  # "late" now has one job fewer ahead of it: its text changed, its kind did not
    changed = h.core.waiting_reason(late.job)
    assert changed != late.reason

    h.clock.advance(4.0)
    assert h.core.handle(RefreshReasons(older_than=5.0)) == []  # given 4 s ago: its entry is not rewritten
    h.clock.advance(1.0)
    [refreshed] = only(h.core.handle(RefreshReasons(older_than=5.0)), Wait)
    assert (refreshed.job, refreshed.reason, refreshed.first) == (late.job, changed, False)
    assert h.core.handle(RefreshReasons(older_than=5.0)) == []  # given now: young again


def test_the_entry_is_what_the_core_holds_for_the_current_attempt():
    h = Harness("two-racks")
    [place] = only(h.submit("a", vc="speech", gpus=2), Place)
    entry = h.core.entry(place.job)
    assert (entry.attempt, entry.placed, entry.reason, entry.tasks) == (place.attempt, True, "", place.tasks)
    h.release("a", requeue=True)
    assert h.core.entry(place.job).attempt == place.attempt + 1  # the core numbers attempts
    h.release("a")
    h.cancel("a")
    assert h.core.entry(place.job) is None or not h.core.entry(place.job).placed

