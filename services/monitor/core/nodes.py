"""Node health: agents' samples, admins' cordons and the clock in; `NodeStatus` out.

The cluster monitor owns this decision. A node is unhealthy while it has at
least one condition (libs.common.messages.NodeCondition):

- `lost`: no sample from its agent for `lost_after_seconds` (the sample is the
  heartbeat). Only a node heard from at least once can be lost: a cluster-file
  node without an agent (e.g. the extra nodes of a local cluster file that all
  map onto one machine) is never judged;
- `gpu_ecc_error`: a GPU counts uncorrectable (double-bit) ECC errors since the
  driver loaded (OpenPAI's `volatile_double`);
- `disk_pressure` / `memory_pressure`: the data disk / memory is at least the
  configured percent full;
- `cordoned`: an admin took it out of scheduling, with a reason.

Contracts:
- a `NodeStatus` is published only when a node's health or its set of
  conditions changes, and once when a node is first heard (healthy), so the
  scheduler and the metrics learn of it; the reason's words alone (seconds
  silent, percent full) change nothing;
- recovery needs nothing from a person: the next sample without the
  condition makes the node healthy again (a cordon is lifted by uncordon);
- time comes from the caller (`at`, `now`): the monitor's own clock, never the
  agent's, so a node whose clock is off is judged by when it was heard;
- restoring from stored records gives every node a full `lost_after_seconds`
  from the restart before it can be lost: a monitor that was down has not
  heard anyone, which says nothing about the nodes;
- likewise silence counts only from when the monitor was last able to listen
  (`Tick.listeningSince`, the shell's last reconnect to NATS): while NATS was
  away no agent could be heard, and declaring every node lost the moment it
  came back would stop every running task.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from libs.common.messages import NodeCondition
from libs.common.nodes import (  # re-exported
    NodeHealthRecord as NodeHealthRecord,
    decode_health as decode_health,
    encode_health as encode_health,
)
from services.monitor.core.samples import NodeSample
from services.monitor.core.updates import NodeUp

# Condition order in reasons and events: the one that ends tasks first.
_ORDER = [
    NodeCondition.LOST,
    NodeCondition.GPU_ECC_ERROR,
    NodeCondition.DISK_PRESSURE,
    NodeCondition.MEMORY_PRESSURE,
    NodeCondition.CORDONED,
]


class HealthSettings(msgspec.Struct, frozen=True, kw_only=True):
    lost_after_seconds: float = 30.0
    disk_full_percent: float = 95.0
    memory_full_percent: float = 98.0


# --- inputs -----------------------------------------------------------------------


class Heard(msgspec.Struct, frozen=True, kw_only=True):
    """A sample of `sample.node` reached the monitor at `at` (monitor clock)."""

    sample: NodeSample
    at: float


class Cordon(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    cordoned: bool
    reason: str
    by: str
    at: float
    cause: str = ""


class Tick(msgspec.Struct, frozen=True, kw_only=True):
    now: float
    # Since when the monitor could hear agents without a break (its last
    # connection to NATS); silence before it is no evidence.
    listeningSince: float = 0.0


HealthInput = Heard | Cordon | Tick


# --- outputs ----------------------------------------------------------------------


class StatusChanged(msgspec.Struct, frozen=True, kw_only=True):
    """Publish `NodeStatus` (id: `status_id`)."""

    node: str
    healthy: bool
    conditions: list[str]
    reason: str
    at: float
    cause: str = ""

    @property
    def status_id(self) -> str:
        return f"node/{self.node}/{'healthy' if self.healthy else 'unhealthy'}/{int(self.at * 1000)}"


class SaveHealth(msgspec.Struct, frozen=True, kw_only=True):
    record: NodeHealthRecord


class NodeConditionCounts(msgspec.Struct, frozen=True, kw_only=True):
    """pai_node_count{ready,disk_pressure,memory_pressure,unschedulable}: absolute
    counts for every label set ever seen (0 once no node has it)."""

    counts: dict[tuple[str, str, str, str], int]


HealthOutput = StatusChanged | SaveHealth | NodeConditionCounts | NodeUp


def count_labels(record: NodeHealthRecord) -> tuple[str, str, str, str]:
    """(ready, disk_pressure, memory_pressure, unschedulable), as OpenPAI's pai_node_count:
    a lost node or one with a broken GPU is not ready; a cordoned one is unschedulable."""
    conditions = set(record.conditions)

    def flag(value: bool) -> str:
        return "true" if value else "false"

    return (
        flag(not conditions & {NodeCondition.LOST, NodeCondition.GPU_ECC_ERROR}),
        flag(NodeCondition.DISK_PRESSURE in conditions),
        flag(NodeCondition.MEMORY_PRESSURE in conditions),
        flag(record.cordoned),
    )


class NodeHealthCore:
    def __init__(self, settings: HealthSettings = HealthSettings()):
        self.settings = settings
        self._nodes: dict[str, NodeHealthRecord] = {}
        self._samples: dict[str, NodeSample] = {}
        self._count_keys: set[tuple[str, str, str, str]] = set()
        self._listening_since = 0.0

    # --- inputs -------------------------------------------------------------------

    def restore(self, records: Iterable[NodeHealthRecord], now: float) -> list[NodeUp | NodeConditionCounts]:
        for record in records:
            if record.heard:
                record = msgspec.structs.replace(record, lastHeard=now)
            self._nodes[record.node] = record
        outputs: list[NodeUp | NodeConditionCounts] = [
            NodeUp(node=r.node, up=r.healthy) for r in self._nodes.values() if r.heard or not r.healthy]
        return outputs + [self._counts()]

    def handle(self, event: HealthInput) -> list[HealthOutput]:
        match event:
            case Heard(sample=sample, at=at):
                self._samples[sample.node] = sample
                record = self._record(sample.node)
                first = not record.heard
                record = msgspec.structs.replace(record, heard=True, lastHeard=max(record.lastHeard, at))
                return self._judge(record, at, cause="", announce=first)
            case Cordon(node=node, cordoned=cordoned, reason=reason, by=by, at=at, cause=cause):
                record = msgspec.structs.replace(
                    self._record(node),
                    cordoned=cordoned,
                    cordonReason=reason if cordoned else "",
                    cordonedBy=by if cordoned else "",
                )
                return self._judge(record, at, cause=cause, announce=False)
            case Tick(now=now, listeningSince=listening_since):
                self._listening_since = max(self._listening_since, listening_since)
                out: list[HealthOutput] = []
                for node in sorted(self._nodes):
                    record = self._nodes[node]
                    if record.heard and now - self._heard_or_listening(record) > self.settings.lost_after_seconds:
                        out.extend(self._judge(record, now, cause="", announce=False))
                return out
        raise TypeError(f"not a node health input: {event!r}")

    # --- queries ------------------------------------------------------------------

    def record(self, node: str) -> NodeHealthRecord | None:
        return self._nodes.get(node)

    def records(self) -> list[NodeHealthRecord]:
        return [self._nodes[n] for n in sorted(self._nodes)]

    def validate_state(self) -> None:
        for node, record in self._nodes.items():
            assert record.node == node, f"record of {node} names {record.node}"
            assert record.healthy == (not record.conditions), f"{node}: healthy={record.healthy} with {record.conditions}"
            assert (NodeCondition.CORDONED in record.conditions) == record.cordoned, f"{node}: cordon and conditions disagree"
            assert record.heard or NodeCondition.LOST not in record.conditions, f"{node} lost but never heard"

    # --- deciding -----------------------------------------------------------------

    def _record(self, node: str) -> NodeHealthRecord:
        return self._nodes.get(node) or NodeHealthRecord(node=node)

    def _judge(self, record: NodeHealthRecord, at: float, *, cause: str, announce: bool) -> list[HealthOutput]:
        found = self._conditions(record, at)
        conditions = [str(c) for c in _ORDER if c in found]
        reason = "; ".join(found[NodeCondition(c)] for c in conditions)
        previous = self._nodes.get(record.node)
        changed = previous is None or previous.healthy != (not conditions) or previous.conditions != conditions
        decided = msgspec.structs.replace(
            record,
            healthy=not conditions,
            conditions=conditions,
            reason=reason,
            since=at if changed else record.since,
        )
        self._nodes[record.node] = decided
        out: list[HealthOutput] = []
        # Saved on a change only: seconds silent or percent full moving on are
        # words for a person, not worth a write per sample.
        if changed or announce or decided.cordoned != (previous.cordoned if previous else False):
            out.append(SaveHealth(record=decided))
        if changed or announce:
            out.append(StatusChanged(node=decided.node, healthy=decided.healthy, conditions=conditions, reason=reason,
                                     at=at, cause=cause))
            out.append(NodeUp(node=decided.node, up=decided.healthy))
            out.append(self._counts())
        return out

    def _heard_or_listening(self, record: NodeHealthRecord) -> float:
        return max(record.lastHeard, self._listening_since)

    def _conditions(self, record: NodeHealthRecord, at: float) -> dict[NodeCondition, str]:
        settings = self.settings
        found: dict[NodeCondition, str] = {}
        silent = at - self._heard_or_listening(record)
        if record.heard and silent > settings.lost_after_seconds:
            found[NodeCondition.LOST] = (
                f"lost: no sample from its agent for {silent:.0f} s (limit {settings.lost_after_seconds:g} s)"
            )
        sample = self._samples.get(record.node)
        if sample is not None and NodeCondition.LOST not in found:
            broken = [
                f"GPU {gpu.minorNumber if gpu.minorNumber is not None else gpu.index} "
                f"({gpu.eccErrors['volatile_double']} uncorrectable)"
                for gpu in sample.gpus
                if gpu.eccErrors.get("volatile_double", 0) > 0
            ]
            if broken:
                found[NodeCondition.GPU_ECC_ERROR] = f"gpu_ecc_error: double-bit ECC errors on {', '.join(broken)}"
            disk = _percent(sample.diskUsedBytes, sample.diskTotalBytes)
            if disk is not None and disk >= settings.disk_full_percent:
                found[NodeCondition.DISK_PRESSURE] = (
                    f"disk_pressure: {sample.diskPath or 'data disk'} {disk:.1f}% full (limit {settings.disk_full_percent:g}%)"
                )
            memory = _percent(sample.memoryUsedBytes, sample.memoryTotalBytes)
            if memory is not None and memory >= settings.memory_full_percent:
                found[NodeCondition.MEMORY_PRESSURE] = (
                    f"memory_pressure: memory {memory:.1f}% used (limit {settings.memory_full_percent:g}%)"
                )
        elif sample is None and record.heard:
            # Restored: keep what was decided from the last sample until a new one comes.
            for condition in record.conditions:
                if condition not in (NodeCondition.LOST, NodeCondition.CORDONED) and NodeCondition.LOST not in found:
                    found[NodeCondition(condition)] = _reason_part(record.reason, condition)
        if record.cordoned:
            by = f" by {record.cordonedBy}" if record.cordonedBy else ""
            found[NodeCondition.CORDONED] = f"cordoned{by}: {record.cordonReason or 'no reason given'}"
        return found

    def _counts(self) -> NodeConditionCounts:
        counts: dict[tuple[str, str, str, str], int] = {key: 0 for key in self._count_keys}
        for record in self._nodes.values():
            if record.heard or record.cordoned:
                key = count_labels(record)
                counts[key] = counts.get(key, 0) + 1
        self._count_keys.update(counts)
        return NodeConditionCounts(counts=dict(sorted(counts.items())))


def _percent(used: int, total: int) -> float | None:
    return 100.0 * used / total if total > 0 else None


def _reason_part(reason: str, condition: str) -> str:
    for part in reason.split("; "):
        if part.startswith(condition):
            return part
    return f"{condition}: (from before the monitor restarted)"
