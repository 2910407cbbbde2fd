"""The node agent's half of a job's utilisation over time: each task's history
(core/usage_history.py) carried on at every sample and stored in `pai_job_metrics`.

Crash-safe by storing every sample's histories: a restarted agent (or the agent of
the node a retried task moved to) reads a task's history the first time it sees the
task and carries on from it. Memory: only the histories of the tasks running on
this node, each at most `job_metrics_points` points.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from libs.common.usage_history import (
    Point,
    TaskHistory,
    add,
    decode_history,
    encode_history,
    history_key,
    new_history,
)
from services.monitor.core.samples import NodeSample, TaskUsage

log = logging.getLogger("pai.monitor.usage")

def point_of(usage: TaskUsage, at: float, *, node_reads_gpus: bool) -> Point:
    """One sample of a task: the mean busy percent and memory share over the GPUs
    it holds (those placed for it, or those it uses where more). A placed GPU none
    of its processes opened counts as 0%: that is the idle GPU people want to see.
    None where the node gives no GPU readings (no NVML): unknown, not idle."""
    held = max(usage.gpuCount, len(usage.gpus))
    if not node_reads_gpus or held == 0:
        return Point(t=at, n=1, cpu=usage.cpuPercent, mem=float(usage.memoryBytes))
    gpu = [g.gpuPercent for g in usage.gpus if g.gpuPercent is not None]
    gpu_mem = [g.gpuMemPercent for g in usage.gpus if g.gpuMemPercent is not None]
    unopened = held - len(usage.gpus)
    return Point(
        t=at, n=1, cpu=usage.cpuPercent, mem=float(usage.memoryBytes),
        gpu=sum(gpu) / (len(gpu) + unopened) if gpu or unopened else None,
        gpuMem=sum(gpu_mem) / (len(gpu_mem) + unopened) if gpu_mem or unopened else None,
        gpus=held,
    )


class UsageRecorder:
    def __init__(self, *, step: float, cap: int):
        self.step = step
        self.cap = cap
        self._live: dict[str, TaskHistory] = {}

    async def record(self, kv: KeyValue, sample: NodeSample) -> None:
        """Add the sample's tasks to their histories and store them; a task gone from
        the node leaves memory (its history stays in the bucket until it expires)."""
        updated: dict[str, TaskHistory] = {}
        for usage in sample.tasks:
            key = _key_of(usage)
            if key is None or key in updated:
                continue
            history = self._live.get(key) or await self._stored(kv, key, usage)
            point = point_of(usage, sample.at, node_reads_gpus=bool(sample.gpus))
            updated[key] = add(history, point, node=sample.node, cap=self.cap)
        self._live = updated
        results = await asyncio.gather(*(kv.put(key, encode_history(h)) for key, h in updated.items()),
                                       return_exceptions=True)
        for key, result in zip(updated, results, strict=True):
            if isinstance(result, nats.errors.Error):  # NATS away a moment; the next sample stores it
                log.warning("could not store the usage history %s: %r", key, result)
            elif isinstance(result, BaseException):
                raise result

    async def _stored(self, kv: KeyValue, key: str, usage: TaskUsage) -> TaskHistory:
        fresh = new_history(usage.jobName, usage.roleName, usage.taskIndex, self.step)
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return fresh
        except nats.errors.Error as exc:
            log.warning("could not read the usage history %s (%r); starting it again", key, exc)
            return fresh
        if not entry.value:
            return fresh
        try:
            return decode_history(entry.value)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("usage history %s does not decode (%s); starting it again", key, exc)
            return fresh


def _key_of(usage: TaskUsage) -> str | None:
    if not usage.jobName or not usage.roleName:
        return None  # a Pod whose environment could not be read: no job to file it under
    try:
        return history_key(usage.jobName, usage.roleName, usage.taskIndex)
    except ValueError:
        return None
