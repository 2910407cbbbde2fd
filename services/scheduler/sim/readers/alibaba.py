"""Alibaba GPU cluster trace 2023 (openb): pods and the GPU nodes they ran on.

Pods -> jobs: one pod is one task; submitted at `creation_time`, running for
`deletion_time - scheduled_time` seconds. What does not become a job, each counted
in the report: pods that were never scheduled (`Pending`, so no run time is
known), pods asking for no GPU (the simulator places GPUs), rows with unusable
times. Kept but noted: pods still running when the trace ends (their run time is
cut there), pods asking for a fraction of a GPU (PAI gives them a whole one), pods
already there when the trace starts. Best-effort pods (`qos` BE) are submitted as
opportunistic; for the others the policy's rule decides. The trace has no VCs:
every pod goes to one VC (default "default").
"""

from __future__ import annotations

from pathlib import Path

from libs.common.protocol.model import OPPORTUNISTIC_PRIORITY
from services.scheduler.sim.readers.rows import RowError, cell, column_index, read_rows, seconds, whole_number
from services.scheduler.sim.trace import SkippedRow, Trace, TraceJob

POD_COLUMNS = ["name", "num_gpu", "gpu_milli", "qos", "pod_phase", "creation_time", "deletion_time",
               "scheduled_time"]
NODE_COLUMNS = ["sn", "gpu", "model"]
BEST_EFFORT_QOS = "BE"


def is_alibaba_pods(header: list[str]) -> bool:
    return all(name in header for name in POD_COLUMNS)


def is_alibaba_nodes(header: list[str]) -> bool:
    return all(name in header for name in NODE_COLUMNS)


def read_alibaba_pods(path: Path, *, vc: str = "default") -> Trace:
    rows = read_rows(path)
    _, header = next(rows, (1, []))
    header = [name.lower() for name in header]
    columns = column_index(header, POD_COLUMNS, path)
    skipped: list[SkippedRow] = []
    parsed: list[tuple[int, str, float, float, float, int, bool, str, bool]] = []
    seen: dict[str, int] = {}
    for line, cells in rows:
        if not any(cells):
            skipped.append(SkippedRow(line=line, kind="empty-line", detail="empty line"))
            continue
        try:
            name = cell(cells, columns["name"], "name")
            if not name:
                raise RowError("no-name", "name is empty")
            if name in seen:
                raise RowError("duplicate-name", f"pod {name} already at line {seen[name]}")
            phase = cell(cells, columns["pod_phase"], "pod_phase")
            scheduled_text = cell(cells, columns["scheduled_time"], "scheduled_time")
            if not scheduled_text:
                if phase == "Pending":
                    raise RowError("never-scheduled", f"pod {name} was never scheduled (Pending): its run time is unknown")
                raise RowError("bad-scheduled_time", f"pod {name} ({phase}) has no scheduled_time")
            gpus = whole_number(cell(cells, columns["num_gpu"], "num_gpu"), "num_gpu", minimum=0)
            if gpus == 0:
                raise RowError("no-gpu", f"pod {name} asks for no GPU")
            milli = whole_number(cell(cells, columns["gpu_milli"], "gpu_milli") or "0", "gpu_milli", minimum=0)
            created = seconds(cell(cells, columns["creation_time"], "creation_time"), "creation_time")
            scheduled = seconds(scheduled_text, "scheduled_time")
            deleted = seconds(cell(cells, columns["deletion_time"], "deletion_time"), "deletion_time")
            if deleted < scheduled:
                raise RowError("bad-times", f"pod {name} is deleted ({deleted:g}) before it is scheduled ({scheduled:g})")
            if scheduled < created:
                raise RowError("bad-times", f"pod {name} is scheduled ({scheduled:g}) before it is created ({created:g})")
        except RowError as error:
            skipped.append(SkippedRow(line=line, kind=error.kind, detail=error.detail))
            continue
        seen[name] = line
        qos = cell(cells, columns["qos"], "qos")
        parsed.append((line, name, created, deleted - scheduled, deleted, gpus, gpus == 1 and 0 < milli < 1000,
                       phase, qos == BEST_EFFORT_QOS))
    trace_end = max((row[4] for row in parsed), default=0.0)
    cut = sum(1 for row in parsed if row[4] == trace_end and row[7] == "Running")
    fractional = sum(1 for row in parsed if row[6])
    at_start = sum(1 for row in parsed if row[2] == 0)
    jobs = [TraceJob(job_id=name, submit_time=created, duration=duration, num_gpus=gpus, vc=vc,
                     priority=OPPORTUNISTIC_PRIORITY if best_effort else None, tasks=1, line=line)
            for line, name, created, duration, _, gpus, _, _, best_effort in parsed]
    notes = [f"every pod is one task in VC {vc} (the trace has no VCs); best-effort pods (qos BE) are opportunistic"]
    if cut:
        notes.append(f"{cut} pods still run when the trace ends (t={trace_end:.0f} s): their run time is cut there")
    if fractional:
        notes.append(f"{fractional} pods ask for a fraction of one GPU (gpu_milli < 1000): PAI gives each a whole GPU")
    if at_start:
        notes.append(f"{at_start} pods already exist when the trace starts (creation_time 0)")
    return Trace(source=path.name, format="alibaba-pods", jobs=jobs, skipped=skipped, notes=notes)


def read_alibaba_nodes(path: Path) -> tuple[list[tuple[str, int, str]], list[SkippedRow]]:
    """(node name, GPUs, GPU model) of every GPU node, in file order, and the rows that could not be used."""
    rows = read_rows(path)
    _, header = next(rows, (1, []))
    header = [name.lower() for name in header]
    columns = column_index(header, NODE_COLUMNS, path)
    nodes: list[tuple[str, int, str]] = []
    names: dict[str, int] = {}
    skipped: list[SkippedRow] = []
    for line, cells in rows:
        if not any(cells):
            skipped.append(SkippedRow(line=line, kind="empty-line", detail="empty line"))
            continue
        try:
            name = cell(cells, columns["sn"], "sn")
            gpus = whole_number(cell(cells, columns["gpu"], "gpu"), "gpu", minimum=0)
            model = cell(cells, columns["model"], "model")
            if not name:
                raise RowError("no-name", "sn (the node name) is empty")
            if name in names:
                raise RowError("duplicate-node", f"node {name} already at line {names[name]}")
            if gpus == 0:
                raise RowError("no-gpu", f"node {name} has no GPU")
            if not model:
                raise RowError("no-model", f"node {name} has no GPU model")
        except RowError as error:
            skipped.append(SkippedRow(line=line, kind=error.kind, detail=error.detail))
            continue
        names[name] = line
        nodes.append((name, gpus, model))
    return nodes, skipped
