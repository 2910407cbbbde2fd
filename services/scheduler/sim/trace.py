"""What every trace reader produces: jobs in one common shape, and a report of what was left out.

Times are seconds. Traces with calendar timestamps (Philly) give seconds since the
Unix epoch (UTC) and set `epoch_times`; traces with relative times (Alibaba, most
hand-made ones) start wherever they start.
"""

from __future__ import annotations

import msgspec


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str  # unique within the trace
    submit_time: float
    duration: float  # seconds of running once started (from scratch after a preemption)
    num_gpus: int  # all tasks together
    vc: str
    # None: the policy decides (see docs/simulator.md, "Priorities"); else an OpenPAI priority (-1 = opportunistic).
    priority: int | None = None
    # None: as few tasks as fit on the cluster's nodes; else the gang size (num_gpus split evenly).
    tasks: int | None = None
    line: int = 0  # where it came from in the file, for messages


class SkippedRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row that is not a job of the simulation, and why (kind: short and groupable; detail: for a person)."""

    line: int  # 1-based line number in the file, the header being line 1
    kind: str
    detail: str


class Trace(msgspec.Struct, kw_only=True):
    source: str  # file name, as shown in reports
    format: str  # "philly", "alibaba-pods", "csv"
    jobs: list[TraceJob]
    skipped: list[SkippedRow] = []
    # Things kept but worth knowing (duplicates, run times cut at the trace end, ...).
    notes: list[str] = []
    epoch_times: bool = False

    def sorted_jobs(self) -> list[TraceJob]:
        """Arrival order; rows arriving in the same second keep their file order."""
        return sorted(self.jobs, key=lambda job: (job.submit_time, job.line))


def skipped_summary(skipped: list[SkippedRow], *, examples: int = 20) -> dict:
    """Counts per kind plus the first rows of each kind, for the JSON report."""
    counts: dict[str, int] = {}
    shown: dict[str, list[dict]] = {}
    for row in skipped:
        counts[row.kind] = counts.get(row.kind, 0) + 1
        bucket = shown.setdefault(row.kind, [])
        if len(bucket) < examples:
            bucket.append({"line": row.line, "reason": row.detail})
    return {
        "count": len(skipped),
        "by_kind": {kind: {"rows": counts[kind], "examples": shown[kind]} for kind in sorted(counts)},
    }
