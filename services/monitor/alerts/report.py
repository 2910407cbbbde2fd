"""The usage report: GPU-hours per VC and per user, the top jobs, idle GPUs.

Pure: the launcher's job records (`pai_job_status`) and the latest node
readings in, a JSON-ready dict out. Built from the records, not from what the
monitor saw since it started, so a restart loses nothing.

GPU-hours of an attempt: the GPUs its spec asks for (instances x GPUs per
instance, summed over task roles) times the part of its running time
(`launchedTime` to `completedTime`, or now) inside the period. Idle GPUs:
GPUs whose latest reading is under IDLE_PERCENT, with whether a running job
holds them (allocated but idle is the costly kind).
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime

from libs.common.messages import JobState
from libs.common.records import JobRecord
from services.monitor.alerts.core import NodeReading

IDLE_PERCENT = 5.0
TOP_JOBS = 10


def gpus_of(record: JobRecord) -> int:
    return sum(role.instances * role.resources.gpu for role in record.spec.taskRoles)


def build_report(records: Iterable[JobRecord], readings: Iterable[NodeReading], *, start: float, end: float) -> dict:
    by_vc: dict[str, float] = defaultdict(float)
    by_user: dict[str, float] = defaultdict(float)
    jobs: list[tuple[float, JobRecord]] = []
    held: set[tuple[str, int]] = set()
    for record in records:
        gpus = gpus_of(record)
        hours = 0.0
        for attempt in record.attempts:
            if attempt.launchedTime is None or not gpus:
                continue
            finished = attempt.completedTime if attempt.completedTime is not None else end
            overlap = min(finished, end) - max(attempt.launchedTime, start)
            if overlap > 0:
                hours += gpus * overlap / 3600
        if record.state is JobState.RUNNING and record.attempts:
            for task in record.attempts[-1].tasks:
                held.update((task.node, gpu) for gpu in task.gpus if task.node)
        if hours > 0:
            by_vc[record.vc] += hours
            by_user[record.user] += hours
            jobs.append((hours, record))
    jobs.sort(key=lambda pair: (-pair[0], pair[1].job))
    idle = []
    total_gpus = 0
    for reading in readings:
        for gpu, percent in sorted(reading.gpuUtilization.items()):
            total_gpus += 1
            if percent < IDLE_PERCENT:
                idle.append({"node": reading.node, "gpu": gpu, "utilization": round(percent, 1),
                             "heldByRunningJob": (reading.node, gpu) in held})
    return {
        "from": _iso(start),
        "to": _iso(end),
        "gpuHours": round(sum(by_vc.values()), 2),
        "gpuHoursByVc": {vc: round(h, 2) for vc, h in sorted(by_vc.items(), key=lambda kv: -kv[1])},
        "gpuHoursByUser": {user: round(h, 2) for user, h in sorted(by_user.items(), key=lambda kv: -kv[1])},
        "topJobs": [
            {"job": r.job, "user": r.user, "vc": r.vc, "gpus": gpus_of(r), "gpuHours": round(h, 2), "state": r.state.value}
            for h, r in jobs[:TOP_JOBS]
        ],
        "gpus": total_gpus,
        "idleGpus": idle,
    }


REPORT_HOUR_UTC = 8


def weekly_report_due(now: float, weekday: int) -> str | None:
    """The ISO week ("2026-W48") whose report is due at `now`, or None: due from
    08:00 UTC on `weekday` (0 Monday .. 6 Sunday; -1 never) to the end of that day.
    The caller claims the week, so replicas and restarts mail it once."""
    day = datetime.fromtimestamp(now, tz=UTC)
    if weekday < 0 or day.weekday() != weekday or day.hour < REPORT_HOUR_UTC:
        return None
    year, week, _ = day.isocalendar()
    return f"{year}-W{week:02d}"


def report_text(report: dict) -> str:
    lines = [f"PAI usage from {report['from']} to {report['to']}: {report['gpuHours']} GPU-hours.", ""]
    lines.append("GPU-hours per virtual cluster:")
    lines += [f"  {vc}: {h}" for vc, h in report["gpuHoursByVc"].items()] or ["  (none)"]
    lines.append("GPU-hours per user:")
    lines += [f"  {user}: {h}" for user, h in report["gpuHoursByUser"].items()] or ["  (none)"]
    lines.append("Top jobs:")
    lines += [f"  {j['job']} ({j['vc']}, {j['gpus']} GPUs, {j['state']}): {j['gpuHours']}"
              for j in report["topJobs"]] or ["  (none)"]
    lines.append(f"Idle GPUs now (under {IDLE_PERCENT:g}% busy), of {report['gpus']}:")
    lines += [f"  {g['node']} GPU {g['gpu']}: {g['utilization']}%" + (" (held by a running job)" if g["heldByRunningJob"] else "")
              for g in report["idleGpus"]] or ["  (none)"]
    return "\n".join(lines) + "\n"


def report_html(report: dict) -> str:
    def table(headers: list[str], rows: list[list[object]]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table border='1' cellpadding='4'><tr>{head}</tr>{body}</table>"

    return (
        f"<html><body><h2>PAI usage from {html.escape(report['from'])} to {html.escape(report['to'])}</h2>"
        f"<p>{report['gpuHours']} GPU-hours in all.</p>"
        "<h3>Per virtual cluster</h3>" + table(["VC", "GPU-hours"], [[k, v] for k, v in report["gpuHoursByVc"].items()])
        + "<h3>Per user</h3>" + table(["user", "GPU-hours"], [[k, v] for k, v in report["gpuHoursByUser"].items()])
        + "<h3>Top jobs</h3>" + table(["job", "VC", "GPUs", "state", "GPU-hours"],
                                      [[j["job"], j["vc"], j["gpus"], j["state"], j["gpuHours"]] for j in report["topJobs"]])
        + f"<h3>Idle GPUs now (of {report['gpus']})</h3>"
        + table(["node", "GPU", "busy %", "held by a running job"],
                [[g["node"], g["gpu"], g["utilization"], "yes" if g["heldByRunningJob"] else "no"] for g in report["idleGpus"]])
        + "</body></html>"
    )


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="seconds")
