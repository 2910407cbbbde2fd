"""PAI's own trace format: one job a row (documented in docs/simulator.md, "Trace format").

    job_id,submit_time,duration,num_gpus,vc[,priority][,tasks]

`submit_time` is seconds (any origin) or an ISO date-time (UTC when no zone is
given; all rows must then use date-times). `priority` is a number (-1 =
opportunistic) or one of crit/prod/test/oppo; empty means the policy decides.
`tasks` is the gang size: num_gpus is split evenly over that many tasks, each on
one node, all started together; empty means as few tasks as fit on the nodes.
Other columns are ignored (and named in the report); lines starting with # are comments.
"""

from __future__ import annotations

from pathlib import Path

from libs.common.protocol.model import PRIORITY_CLASSES
from services.scheduler.sim.readers.rows import (
    RowError,
    cell,
    column_index,
    is_number,
    read_rows,
    seconds,
    timestamp,
    whole_number,
)
from services.scheduler.sim.trace import SkippedRow, Trace, TraceJob

REQUIRED = ["job_id", "submit_time", "duration", "num_gpus", "vc"]
OPTIONAL = ["priority", "tasks"]


def is_jobs_csv(header: list[str]) -> bool:
    return all(name in header for name in REQUIRED)


def read_jobs_csv(path: Path) -> Trace:
    rows = read_rows(path)
    _, header = next(rows, (1, []))
    header = [name.lower() for name in header]
    columns = column_index(header, REQUIRED, path)
    optional = {name: header.index(name) if name in header else None for name in OPTIONAL}
    jobs: list[TraceJob] = []
    skipped: list[SkippedRow] = []
    ids: dict[str, int] = {}
    time_kind: str | None = None  # "seconds" or "date-time", fixed by the first good row
    for line, cells in rows:
        if not any(cells):
            skipped.append(SkippedRow(line=line, kind="empty-line", detail="empty line"))
            continue
        try:
            job_id = cell(cells, columns["job_id"], "job_id")
            if not job_id:
                raise RowError("no-job_id", "job_id is empty")
            if job_id in ids:
                raise RowError("duplicate-job_id", f"job_id {job_id} already used at line {ids[job_id]}")
            submit_text = cell(cells, columns["submit_time"], "submit_time")
            kind = "seconds" if is_number(submit_text) else "date-time"
            if time_kind is not None and kind != time_kind:
                raise RowError("bad-submit_time", f"submit_time {submit_text!r} is a {kind} but earlier rows use {time_kind}s")
            submit = seconds(submit_text, "submit_time") if kind == "seconds" else timestamp(submit_text, "submit_time")
            duration = seconds(cell(cells, columns["duration"], "duration"), "duration")
            gpus = whole_number(cell(cells, columns["num_gpus"], "num_gpus"), "num_gpus", minimum=1)
            vc = cell(cells, columns["vc"], "vc")
            if not vc:
                raise RowError("no-vc", "vc is empty")
            priority = _priority(cell(cells, optional["priority"], "priority"))
            tasks = _tasks(cell(cells, optional["tasks"], "tasks"), gpus)
        except RowError as error:
            skipped.append(SkippedRow(line=line, kind=error.kind, detail=error.detail))
            continue
        time_kind = kind
        ids[job_id] = line
        jobs.append(TraceJob(job_id=job_id, submit_time=submit, duration=duration, num_gpus=gpus, vc=vc,
                             priority=priority, tasks=tasks, line=line))
    notes = []
    unknown = [name for name in header if name not in REQUIRED and name not in OPTIONAL]
    if unknown:
        notes.append(f"columns not used by the simulator: {', '.join(unknown)}")
    return Trace(source=path.name, format="csv", jobs=jobs, skipped=skipped, notes=notes,
                 epoch_times=time_kind == "date-time")


def _priority(text: str) -> int | None:
    if not text:
        return None
    if text.lower() in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[text.lower()]
    try:
        value = int(text)
    except ValueError:
        classes = "/".join(PRIORITY_CLASSES)
        raise RowError("bad-priority", f"priority {text!r} is neither a whole number nor one of {classes}") from None
    if value < -1:
        raise RowError("bad-priority", f"priority {value} is below -1 (opportunistic)")
    return value


def _tasks(text: str, gpus: int) -> int | None:
    if not text:
        return None
    tasks = whole_number(text, "tasks", minimum=1)
    if gpus % tasks:
        raise RowError("bad-tasks", f"num_gpus {gpus} cannot be split evenly over {tasks} tasks")
    return tasks
