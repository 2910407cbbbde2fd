"""Trace readers: the file's header says which format it is; `format` overrides that."""

from __future__ import annotations

from pathlib import Path

from services.scheduler.sim.readers.alibaba import is_alibaba_pods, read_alibaba_nodes, read_alibaba_pods
from services.scheduler.sim.readers.jobs_csv import is_jobs_csv, read_jobs_csv
from services.scheduler.sim.readers.philly import is_philly_jobs, read_philly_jobs, read_philly_vcs
from services.scheduler.sim.readers.rows import read_header
from services.scheduler.sim.trace import Trace

TRACE_FORMATS = ("csv", "philly", "alibaba-pods")


class TraceFormatError(ValueError):
    """The file is not a trace this simulator can read; the message says what it expected."""


def detect_trace_format(path: Path) -> str:
    header = read_header(path)
    if is_jobs_csv(header):
        return "csv"
    if is_philly_jobs(header):
        return "philly"
    if is_alibaba_pods(header):
        return "alibaba-pods"
    raise TraceFormatError(
        f"{path.name}: not a known trace (header: {','.join(header) or 'none'}); expected PAI's CSV "
        "(job_id,submit_time,duration,num_gpus,vc[,priority][,tasks]), Philly (timestamp,duration,num_gpus,"
        "gpu_time,cluster) or Alibaba 2023 pods (name,...,num_gpu,gpu_milli,qos,pod_phase,creation_time,...)")


def read_trace(path: Path | str, *, format: str | None = None, drop_duplicates: bool = False) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such file")
    kind = format or detect_trace_format(path)
    try:
        if kind == "csv":
            return read_jobs_csv(path)
        if kind == "philly":
            return read_philly_jobs(path, drop_duplicates=drop_duplicates)
        if kind == "alibaba-pods":
            return read_alibaba_pods(path)
    except ValueError as error:  # a missing column
        raise TraceFormatError(str(error)) from error
    raise TraceFormatError(f"unknown trace format {kind!r} (known: {', '.join(TRACE_FORMATS)})")


__all__ = [
    "TRACE_FORMATS",
    "TraceFormatError",
    "detect_trace_format",
    "read_alibaba_nodes",
    "read_alibaba_pods",
    "read_jobs_csv",
    "read_philly_jobs",
    "read_philly_vcs",
    "read_trace",
]
