"""What the scheduler core decides (the service shell publishes these as events)."""

from __future__ import annotations

import msgspec

from libs.common.messages import TaskPlacement


class Place(msgspec.Struct, frozen=True, kw_only=True, tag="place"):
    """Run these tasks of the attempt here. `partial`: more tasks of the attempt follow later."""

    job: str
    attempt: int
    vc: str
    tasks: list[TaskPlacement]
    partial: bool = False


class Preempt(msgspec.Struct, frozen=True, kw_only=True, tag="preempt"):
    """Kill this attempt to free its cells for job `by`; the launcher answers with Release(requeue=True)."""

    job: str
    attempt: int
    vc: str
    by: str
    reason: str


class Wait(msgspec.Struct, frozen=True, kw_only=True, tag="wait"):
    """The attempt waits, for a reason a person can act on (sent when the reason is new or changed).
    `first`: the wait is also to be announced (JobWaiting): the attempt's first announcement, given
    with a Wait when the attempt has already waited long enough (see Announce); other Waits only
    update the stored reason."""

    job: str
    attempt: int
    vc: str
    reason: str
    first: bool = False


class Announce(msgspec.Struct, frozen=True, kw_only=True, tag="announce"):
    """Announce (JobWaiting) that the attempt still waits, for `reason`, the one already stored.

    An attempt's wait is announced once it has waited SchedulerCore's `announce_wait_after_s`, not
    when it is queued: under a burst most queued jobs are placed within a second or two, and an
    announcement for each was an event stored and delivered per job that nobody acted on."""

    job: str
    attempt: int
    vc: str
    reason: str


Decision = Place | Preempt | Wait | Announce
