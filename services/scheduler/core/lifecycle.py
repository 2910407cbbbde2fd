"""The states of one job attempt in the scheduler and the moves between them.

As HiveD's affinity-group states and dask's transition table: an attempt is in
exactly one state, every change goes through `move()`, and a move the table does
not list raises with the attempt's history. `check_state()` holds what each state
promises about cells, reservations and the queue (called by `validate_state()`).

    QUEUED ──place──> PARTLY_PLACED ──place──> PLACED
      │  ╲               │    ▲                  │
      │   ╲ victims      │    │ reserved cells   │ Preempt
      │    ╰──────> PREEMPTING  lost / taken     ▼
      │                  │               BEING_PREEMPTED ──Cancel──╮
      │                  ╰──Cancel──> CANCELLED ──Preempt──> BEING_PREEMPTED_CANCELLED
      ╰──────── Release, Cancel, a newer attempt (from any state) ──> RELEASED

- QUEUED: waits for cells, holds none, no reservation; in the queue.
- PARTLY_PLACED: holds the cells of some tasks (incremental job, or some of its
  affinity groups), waits for the rest; in the queue.
- PREEMPTING: cells are reserved for it while the victims it preempted stop; in
  the queue, tried again when the victims' Release arrives. May hold cells of
  groups placed before.
- PLACED: every task holds its cells; out of the queue.
- BEING_PREEMPTED: a Preempt was given; it holds its cells until its Release, which
  queues the next attempt. Its cells no longer count as work others may take.
- CANCELLED: cancelled while holding cells; the launcher stops it and its Release
  queues nothing.
- BEING_PREEMPTED_CANCELLED: both; neither stop undoes the other (no next attempt,
  and its cells stay promised to the preemptor).
- RELEASED: forgotten; holds nothing. No move leaves it.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.scheduler.core.jobs import JobRecord


class AttemptState(Enum):
    QUEUED = "queued"
    PARTLY_PLACED = "partly placed"
    PREEMPTING = "preempting"
    PLACED = "placed"
    BEING_PREEMPTED = "being preempted"
    CANCELLED = "cancelled"
    BEING_PREEMPTED_CANCELLED = "being preempted, cancelled"
    RELEASED = "released"


S = AttemptState

# Legal moves: state -> the states it may go to. RELEASED is reachable from everywhere
# (a Release, a Cancel of an attempt holding nothing, or a newer attempt replacing it).
TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    S.QUEUED: frozenset({S.PARTLY_PLACED, S.PLACED, S.PREEMPTING, S.RELEASED}),
    S.PARTLY_PLACED: frozenset({S.PLACED, S.PREEMPTING, S.BEING_PREEMPTED, S.CANCELLED, S.RELEASED}),
    # Reserved cells taken (placed, partly placed) or lost to a bad node with nothing new found (queued).
    S.PREEMPTING: frozenset({S.QUEUED, S.PARTLY_PLACED, S.PLACED, S.BEING_PREEMPTED, S.CANCELLED, S.RELEASED}),
    S.PLACED: frozenset({S.BEING_PREEMPTED, S.CANCELLED, S.RELEASED}),
    S.BEING_PREEMPTED: frozenset({S.BEING_PREEMPTED_CANCELLED, S.RELEASED}),
    # A cancelled opportunistic job still runs on cells a guaranteed job may take.
    S.CANCELLED: frozenset({S.BEING_PREEMPTED_CANCELLED, S.RELEASED}),
    S.BEING_PREEMPTED_CANCELLED: frozenset({S.RELEASED}),
    S.RELEASED: frozenset(),
}

# What a Cancel of an attempt that holds cells moves it to (one that holds none is released).
CANCELLED_FROM: dict[AttemptState, AttemptState] = {
    S.PARTLY_PLACED: S.CANCELLED,
    S.PREEMPTING: S.CANCELLED,
    S.PLACED: S.CANCELLED,
    S.BEING_PREEMPTED: S.BEING_PREEMPTED_CANCELLED,
    S.CANCELLED: S.CANCELLED,
    S.BEING_PREEMPTED_CANCELLED: S.BEING_PREEMPTED_CANCELLED,
}

# What a Preempt moves a victim to.
PREEMPTED_FROM: dict[AttemptState, AttemptState] = {
    S.PARTLY_PLACED: S.BEING_PREEMPTED,
    S.PREEMPTING: S.BEING_PREEMPTED,
    S.PLACED: S.BEING_PREEMPTED,
    S.CANCELLED: S.BEING_PREEMPTED_CANCELLED,
}

BEING_PREEMPTED_STATES = frozenset({S.BEING_PREEMPTED, S.BEING_PREEMPTED_CANCELLED})
CANCELLED_STATES = frozenset({S.CANCELLED, S.BEING_PREEMPTED_CANCELLED})
QUEUED_STATES = frozenset({S.QUEUED, S.PARTLY_PLACED, S.PREEMPTING})  # the attempts the queues hold


class IllegalTransition(RuntimeError):
    """A move the table does not allow: a fault in the scheduler, not in its input."""


def move(record: JobRecord, to: AttemptState, why: str) -> None:
    """The one way an attempt's state changes; `why` goes into its history."""
    if to not in TRANSITIONS[record.state]:
        history = " -> ".join(f"{state.value} ({reason})" for state, reason in record.history)
        raise IllegalTransition(
            f"{record.id}#{record.attempt}: {record.state.value} -> {to.value} ({why}) is not a legal move; "
            f"history: {history} -> {to.value} ({why})?")
    record.state = to
    record.history.append((to, why))


def waiting_state(record: JobRecord) -> AttemptState:
    """Which of the waiting-or-placed states the attempt's cells and reservations put it in."""
    if record.victims or record.reserved:
        return S.PREEMPTING
    if not record.pending_groups:
        return S.PLACED
    return S.PARTLY_PLACED if record.placed else S.QUEUED


def check_state(record: JobRecord, queued: bool) -> str | None:
    """What is wrong with the attempt for its state (None: nothing); `queued`: whether the queues hold it."""
    state = record.state
    holds = bool(record.placed)
    if state is S.RELEASED:
        return "is released but still recorded"
    if (state in QUEUED_STATES) != queued:
        return "is queued" if queued else "is not queued"
    if state is S.QUEUED and (holds or record.reserved or record.victims or not record.pending_groups):
        return "holds cells, reservations or victims, or has nothing left to place"
    if state is S.PARTLY_PLACED and (not holds or record.reserved or record.victims or not record.pending_groups):
        return "holds no cells, has reservations or victims, or has nothing left to place"
    if state is S.PREEMPTING and (not (record.reserved or record.victims) or not record.pending_groups):
        return "has neither reserved cells nor victims, or nothing left to place"
    if state is S.PLACED and (not holds or record.reserved or record.victims or record.pending_groups):
        return "does not hold every task's cells, or still has reservations or victims"
    if state in (S.BEING_PREEMPTED, S.CANCELLED, S.BEING_PREEMPTED_CANCELLED) and not holds:
        return "holds no cells"
    if state in CANCELLED_STATES and record.reserved:
        return "keeps reserved cells"
    return None
