"""Where a burst job's time goes between its events, for benchmarks/e2e_throughput.py.

Reads every event the burst's jobs left in the event stream with the time
JetStream stored it (one clock: nats-server's), adds each job's launch and
completion times from its status document (the same machine's clock), and
reports per step the p50/p99 over the jobs:

- `submitted_to_placed`: rest stored JobSubmitted -> the scheduler stored
  JobPlaced (the job's wait for a cell and the scheduler's reaction);
- `placed_to_launched`: -> the shim saw the task running (the launcher's
  transaction, the job's record written, the shim's start);
- `launched_to_completed`: -> the launcher applied the task's end (the task,
  its shim's report, the launcher's group commit);
- `completed_to_released`: -> the launcher stored JobReleased (the record
  written, then the events);
- `placed_to_started`, `started_to_exited`, `exited_to_released`,
  `placed_to_released`: the same span by stored events alone (a trivial task's
  TaskStarted waits for its end, so the three are stored together);
- `released_to_next_placed`: from a JobReleased to the first JobPlaced stored
  after it, while some job was waiting (the scheduler's reaction to a freed cell).

A cell is held from the placement to the scheduler's handling of the release, so
on a cluster whose cells are all taken the jobs finish at most
cells / (placed_to_released + released_to_next_placed) per second.
"""

from __future__ import annotations

import bisect
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig

from benchmarks.stats import percentile
from libs.common.subjects import STREAM

STAGES = (("submitted_to_placed", "job.submitted", "job.placed"),
          ("placed_to_started", "job.placed", "task.started"),
          ("started_to_exited", "task.started", "task.exited"),
          ("exited_to_released", "task.exited", "job.released"),
          ("placed_to_released", "job.placed", "job.released"),
          ("placed_to_launched", "job.placed", "launched"),
          ("launched_to_completed", "launched", "completed"),
          ("completed_to_released", "completed", "job.released"))
FETCH = 1000


async def stored_times(js: Any, prefix: str) -> dict[str, dict[str, float]]:
    """Per job whose name starts with `prefix`: kind -> first time stored (s, server clock)."""
    # No acks: nothing of the platform's changes, and no bound on unacked deliveries stops the read.
    sub = await js.pull_subscribe("pai.v1.>", stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    times: dict[str, dict[str, float]] = {}
    try:
        while True:
            try:
                msgs = await sub.fetch(FETCH, timeout=2.0)
            except TimeoutError:
                break
            for msg in msgs:
                parts = msg.subject.split(".")
                if len(parts) < 7 or not parts[-1].startswith(prefix):
                    continue
                kind = f"{parts[2]}.{parts[3]}"
                at = msg.metadata.timestamp.timestamp()
                times.setdefault(parts[-1], {}).setdefault(kind, at)
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return times


def stages(times: dict[str, dict[str, float]], details: dict[str, dict] | None = None) -> dict[str, dict[str, float | None]]:
    """p50/p99 (ms) of each stage over the jobs that have both its ends. Pure.

    `details`: the jobs' status documents (rest's), whose launch time (the shim
    saw the task running) and completion time (the launcher applied its end)
    split a placement's time further."""
    report: dict[str, dict[str, float | None]] = {}
    times = {job: {**kinds, **_launch_and_completion((details or {}).get(job, {}))} for job, kinds in times.items()}
    for name, start, end in STAGES:
        spans = [(kinds[end] - kinds[start]) * 1000 for kinds in times.values() if start in kinds and end in kinds]
        report[name] = _summary(spans)
    placed = sorted(kinds["job.placed"] for kinds in times.values() if "job.placed" in kinds)
    submitted = sorted(kinds["job.submitted"] for kinds in times.values() if "job.submitted" in kinds)
    reactions = []
    for kinds in times.values():
        released = kinds.get("job.released")
        if released is None:
            continue
        waiting = bisect.bisect_right(submitted, released) - bisect.bisect_right(placed, released)
        following = bisect.bisect_right(placed, released)
        if waiting > 0 and following < len(placed):
            reactions.append((placed[following] - released) * 1000)
    report["released_to_next_placed"] = _summary(reactions)
    return report


def _launch_and_completion(doc: dict) -> dict[str, float]:
    """A job status document's launch and completion times (s), when it has both."""
    if doc.get("appLaunchedTime") and doc.get("completedTime"):
        return {"launched": doc["appLaunchedTime"] / 1000, "completed": doc["completedTime"] / 1000}
    return {}


def _summary(spans: list[float]) -> dict[str, float | None]:
    return {"p50_ms": _round(percentile(spans, 50)), "p99_ms": _round(percentile(spans, 99)), "count": len(spans)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
