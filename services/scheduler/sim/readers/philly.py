"""Microsoft Philly jobs (timestamp,duration,num_gpus,gpu_time,cluster) and VC capacities (vc,node num).

The job file as shipped with the Pollux and Sia artifacts is not sorted by time,
repeats some rows exactly and ends with an empty line; all of this is reported,
nothing is dropped without a line in the report. Timestamps carry no zone and are
read as UTC; only differences between them matter to the simulator.
"""

from __future__ import annotations

from pathlib import Path

from services.scheduler.sim.readers.rows import (
    RowError,
    cell,
    column_index,
    read_rows,
    seconds,
    timestamp,
    whole_number,
)
from services.scheduler.sim.trace import SkippedRow, Trace, TraceJob

JOB_COLUMNS = ["timestamp", "duration", "num_gpus", "cluster"]
VC_COLUMNS = ["vc", "node num"]


def is_philly_jobs(header: list[str]) -> bool:
    return all(name in header for name in JOB_COLUMNS)


def is_philly_vcs(header: list[str]) -> bool:
    return all(name in header for name in VC_COLUMNS)


def read_philly_jobs(path: Path, *, drop_duplicates: bool = False) -> Trace:
    rows = read_rows(path)
    _, header = next(rows, (1, []))
    header = [name.lower() for name in header]
    columns = column_index(header, JOB_COLUMNS, path)
    gpu_time_at = header.index("gpu_time") if "gpu_time" in header else None
    jobs: list[TraceJob] = []
    skipped: list[SkippedRow] = []
    first_seen: dict[tuple[str, ...], int] = {}
    duplicates: list[tuple[int, int]] = []
    gpu_time_mismatch = 0
    out_of_order = 0
    previous = float("-inf")
    for line, cells in rows:
        if not any(cells):
            skipped.append(SkippedRow(line=line, kind="empty-line", detail="empty line"))
            continue
        key = tuple(cells)
        earlier = first_seen.setdefault(key, line)
        if earlier != line:
            duplicates.append((line, earlier))
            if drop_duplicates:
                skipped.append(SkippedRow(line=line, kind="duplicate", detail=f"repeats line {earlier} exactly"))
                continue
        try:
            submit = timestamp(cell(cells, columns["timestamp"], "timestamp"), "timestamp")
            duration = seconds(cell(cells, columns["duration"], "duration"), "duration")
            gpus = whole_number(cell(cells, columns["num_gpus"], "num_gpus"), "num_gpus", minimum=1)
            vc = cell(cells, columns["cluster"], "cluster")
            if not vc:
                raise RowError("no-vc", "cluster (the VC) is empty")
        except RowError as error:
            skipped.append(SkippedRow(line=line, kind=error.kind, detail=error.detail))
            continue
        gpu_time = cell(cells, gpu_time_at, "gpu_time")
        if gpu_time and _differs(gpu_time, duration * gpus):
            gpu_time_mismatch += 1
        if submit < previous:
            out_of_order += 1
        previous = submit
        jobs.append(TraceJob(job_id=f"philly-{line}", submit_time=submit, duration=duration, num_gpus=gpus,
                             vc=vc, line=line))
    notes = []
    if out_of_order:
        notes.append(f"rows are not in time order ({out_of_order} arrive earlier than the row above them); "
                     "jobs are replayed in time order")
    if duplicates:
        shown = ", ".join(f"line {line} = line {earlier}" for line, earlier in duplicates[:5])
        what = "dropped (--drop-duplicates)" if drop_duplicates else (
            "kept as separate jobs, since the trace has no job ids to tell them apart (--drop-duplicates drops them)")
        notes.append(f"{len(duplicates)} rows repeat an earlier row exactly ({shown}, ...): {what}")
    if gpu_time_mismatch:
        notes.append(f"{gpu_time_mismatch} rows have gpu_time != duration * num_gpus; duration and num_gpus are used")
    return Trace(source=path.name, format="philly", jobs=jobs, skipped=skipped, notes=notes, epoch_times=True)


def _differs(text: str, expected: float) -> bool:
    try:
        return abs(float(text) - expected) > 0.5
    except ValueError:
        return True


def read_philly_vcs(path: Path) -> tuple[dict[str, int], list[SkippedRow]]:
    """VC name -> number of nodes, in file order, and the rows that could not be used."""
    rows = read_rows(path)
    _, header = next(rows, (1, []))
    header = [name.lower() for name in header]
    columns = column_index(header, VC_COLUMNS, path)
    nodes: dict[str, int] = {}
    skipped: list[SkippedRow] = []
    for line, cells in rows:
        if not any(cells):
            skipped.append(SkippedRow(line=line, kind="empty-line", detail="empty line"))
            continue
        try:
            vc = cell(cells, columns["vc"], "vc")
            count = whole_number(cell(cells, columns["node num"], "node num"), "node num", minimum=1)
            if not vc:
                raise RowError("no-vc", "vc is empty")
            if vc in nodes:
                raise RowError("duplicate-vc", f"VC {vc} appears again; the first row counts")
        except RowError as error:
            skipped.append(SkippedRow(line=line, kind=error.kind, detail=error.detail))
            continue
        nodes[vc] = count
    return nodes, skipped
