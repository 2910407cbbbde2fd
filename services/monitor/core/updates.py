"""What the monitor core asks the metrics layer to do.

Gauge updates carry absolute values, never deltas, so applying one twice is
harmless; counter and histogram updates are emitted once per fact by the core.
"""

from __future__ import annotations

import msgspec

from libs.common.ids import EventId, JobId


class JobsGauge(msgspec.Struct, frozen=True, kw_only=True):
    """pai_jobs{state,vc}: how many jobs of `vc` are in `state` now."""

    vc: str
    state: str
    count: int


class SubmitToRunning(msgspec.Struct, frozen=True, kw_only=True):
    """One job reached RUNNING for the first time, `seconds` after submission."""

    vc: str
    seconds: float


class EventCounted(msgspec.Struct, frozen=True, kw_only=True):
    kind: str


class TaskExitCounted(msgspec.Struct, frozen=True, kw_only=True):
    vc: str
    outcome: str  # "success" or the phrase of the runtime's verdict


class NodeUp(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    up: bool


class NodeCount(msgspec.Struct, frozen=True, kw_only=True):
    count: int


class RaiseAlert(msgspec.Struct, frozen=True, kw_only=True):
    """An alert the shell publishes as `AlertFiring` (not a metric)."""

    id: EventId  # deterministic: a redelivered cause raises the same alert, stored once
    job: JobId
    cause: EventId
    rule: str
    severity: str
    summary: str
    labels: dict[str, str]


Update = JobsGauge | SubmitToRunning | EventCounted | TaskExitCounted | NodeUp | NodeCount | RaiseAlert
