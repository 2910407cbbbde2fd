"""What the scheduler core is told (the service shell turns bus messages into these)."""

from __future__ import annotations

import msgspec

from libs.common.messages import TaskPlacement
from libs.common.protocol.model import JobSpec
from services.scheduler.core.decisions import Decision


class Submit(msgspec.Struct, frozen=True, kw_only=True, tag="submit"):
    """A job (id "user~name") wants cells for this attempt."""

    job: str
    attempt: int
    spec: JobSpec
    at: float | None = None  # when it was submitted (kept across restarts for queue order); None: now


class Release(msgspec.Struct, frozen=True, kw_only=True, tag="release"):
    """The launcher freed every cell of this attempt; with `requeue` the job waits again as attempt+1.
    With `tasks` ((role, index) pairs), only those tasks' cells: they ended for good while the attempt
    goes on (their role's gangReleaseEnable is false, HiveD's release per pod)."""

    job: str
    attempt: int
    requeue: bool = False
    tasks: list[tuple[str, int]] = []


class Cancel(msgspec.Struct, frozen=True, kw_only=True, tag="cancel"):
    """The user stopped the job: a waiting job leaves the queue; a placed one waits for its Release."""

    job: str


class NodeHealth(msgspec.Struct, frozen=True, kw_only=True, tag="node_health"):
    node: str
    healthy: bool
    reason: str = ""


class Restore(msgspec.Struct, frozen=True, kw_only=True, tag="restore"):
    """At start-up, before other events: this attempt already runs on exactly these cells."""

    job: str
    attempt: int
    spec: JobSpec
    tasks: list[TaskPlacement]
    borrowed: bool = False  # the entry says it ran as opportunistic work outside its VC's quota
    released: list[tuple[str, int]] = []  # tasks whose cells went back early (never placed again)


class Tick(msgspec.Struct, frozen=True, kw_only=True, tag="tick"):
    """Time passed (read from the injected clock): gangs that waited long enough start to hold back
    the backfill behind them. Send it periodically (e.g. every second)."""


class NotSent(msgspec.Struct, frozen=True, kw_only=True, tag="not_sent"):
    """The shell could not carry out this decision (its publish or its record failed).

    The core keeps what it decided (cells stay bound: kueue's "assume") and gives
    the decision again, brought up to date, with the next call that brings any
    other event (a redelivery, a Tick): so a lost publish never waits for a restart.
    A decision that no longer applies (the attempt was released meanwhile) is dropped."""

    decision: Decision


class RefreshReasons(msgspec.Struct, frozen=True, kw_only=True, tag="refresh_reasons"):
    """Give a `Wait` (not `first`) for every waiting attempt whose reason text changed
    since it was last given: its live counts (cells free, jobs ahead) moved.

    `older_than`: only reasons given at least this many seconds ago. A reason just
    given is still right in kind (a change of kind is given at once, not here); only
    its counts drift, and under a burst most jobs are placed before anyone reads them."""

    older_than: float = 0.0


SchedulerEvent = Submit | Release | Cancel | NodeHealth | Restore | Tick | NotSent | RefreshReasons
