"""A job's utilisation over time: per task a bounded, downsampled history of its
samples, and the shapes the API and the portal read. Pure; shared by the monitor
(which writes the histories) and rest (which answers GET /api/v2/jobs/{id}/metrics).

The node agent adds each task's usage (services/monitor/core/tasks.py) to the task's
`TaskHistory` at every sample and stores it in `pai_job_metrics` under
`history_key` (services/monitor/usage.py). A history holds at most
`cap` points: when one more would not fit, its step doubles and neighbouring
points merge (a mean weighted by how many samples each holds). So a history always
covers the task's whole life, at the finest resolution that fits: with the default
cap of 360 and 5 s samples, 5 s for the first 30 minutes, 10 s up to an hour, ...,
about 8 minutes a point after two days. Its size is bounded (about 15 KiB of JSON)
whatever the job's length.

A task retried (a new attempt, perhaps on another node) carries on in the same
history: its points simply resume after a gap.

A reading the node could not give (no GPU, NVML away) is None, never 0: "unknown"
and "idle" must not look alike on a chart; a series whose every point is None is
left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import msgspec

from libs.common.ids import job_key

DEFAULT_CAP = 360
# The portal's idle-GPU flag: a job holding GPUs whose utilisation stayed under this
# for the whole window (docs/monitoring.md, "A job's utilisation over time").
IDLE_GPU_PERCENT = 5.0
IDLE_WINDOW_SECONDS = 600.0


class Point(msgspec.Struct, frozen=True, array_like=True):
    """One step of a task: the mean of the `n` samples taken in [t, t + step)."""

    t: float  # the step's start, a multiple of the history's step
    n: int  # samples merged into it
    cpu: float  # percent of the whole node (as task_cpu_percent)
    mem: float  # resident bytes of all its processes
    gpu: float | None = None  # mean busy percent of the GPUs it holds
    gpuMem: float | None = None  # mean share of their memory its processes hold
    gpus: int = 0  # GPUs it held a context on (the most in the step)


class TaskHistory(msgspec.Struct, frozen=True, kw_only=True):
    job: str  # user~name
    role: str
    index: str
    node: str = ""  # where its latest sample came from
    step: float
    points: list[Point] = []


_KEY_FORBIDDEN = re.compile(r"[^-_=a-zA-Z0-9]")


def history_key(job: str, role: str, index: str) -> str:
    """`user.name.role.index`; raises ValueError for a job id that is not `user~name`."""
    return f"{job_key(job)}.{_KEY_FORBIDDEN.sub('_', role) or '_'}.{_KEY_FORBIDDEN.sub('_', index) or '_'}"


def job_prefix(job: str) -> str:
    """Every task key of a job starts with this (it ends in a dot)."""
    return f"{job_key(job)}."


def _mean(a: float | None, wa: int, b: float | None, wb: int) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return (a * wa + b * wb) / (wa + wb)


def merge(a: Point, b: Point, t: float) -> Point:
    return Point(
        t=t, n=a.n + b.n,
        cpu=_mean(a.cpu, a.n, b.cpu, b.n) or 0.0,
        mem=_mean(a.mem, a.n, b.mem, b.n) or 0.0,
        gpu=_mean(a.gpu, a.n, b.gpu, b.n),
        gpuMem=_mean(a.gpuMem, a.n, b.gpuMem, b.n),
        gpus=max(a.gpus, b.gpus),
    )


def _bucket(t: float, step: float) -> float:
    return math.floor(t / step) * step


def rebucket(points: Iterable[Point], step: float) -> list[Point]:
    """`points` (in time order) merged into steps of `step` seconds."""
    out: list[Point] = []
    for p in points:
        t = _bucket(p.t, step)
        if out and out[-1].t == t:
            out[-1] = merge(out[-1], p, t)
        else:
            out.append(msgspec.structs.replace(p, t=t))
    return out


def add(history: TaskHistory, point: Point, *, node: str, cap: int = DEFAULT_CAP) -> TaskHistory:
    """`history` with one more sample; coarser (step doubled, as often as needed)
    when it would hold more than `cap` points. A sample older than the last
    point (a clock stepped back) is dropped: points stay in time order."""
    points = list(history.points)
    t = _bucket(point.t, history.step)
    if points and t < points[-1].t:
        return history
    if points and points[-1].t == t:
        points[-1] = merge(points[-1], point, t)
    else:
        points.append(msgspec.structs.replace(point, t=t))
    step = history.step
    while len(points) > max(2, cap):
        step *= 2
        points = rebucket(points, step)
    return msgspec.structs.replace(history, node=node, step=step, points=points)


def new_history(job: str, role: str, index: str, step: float) -> TaskHistory:
    return TaskHistory(job=job, role=role, index=index, step=max(step, 0.001))


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TaskHistory)


def encode_history(history: TaskHistory) -> bytes:
    return _encoder.encode(history)


def decode_history(data: bytes) -> TaskHistory:
    """Raises msgspec.ValidationError/DecodeError on a value that is not a TaskHistory."""
    return _decoder.decode(data)


# --- what the API answers ---------------------------------------------------------------


def window(points: Sequence[Point], start: float | None, end: float | None) -> list[Point]:
    return [p for p in points if (start is None or p.t >= start) and (end is None or p.t <= end)]


def columns(points: Sequence[Point]) -> dict[str, list]:
    """Points as columns, the shape chart libraries draw (one x array, one array per
    series). A GPU series with no reading at all is left out."""
    out: dict[str, list] = {
        "t": [p.t for p in points],
        "cpuPercent": [round(p.cpu, 3) for p in points],
        "memoryBytes": [int(p.mem) for p in points],
    }
    if any(p.gpu is not None for p in points):
        out["gpuPercent"] = [None if p.gpu is None else round(p.gpu, 3) for p in points]
        out["gpus"] = [p.gpus for p in points]
    if any(p.gpuMem is not None for p in points):
        out["gpuMemoryPercent"] = [None if p.gpuMem is None else round(p.gpuMem, 3) for p in points]
    return out


def job_total(tasks: Sequence[Sequence[Point]], step: float) -> list[Point]:
    """The whole job at each step: CPU and memory summed over its tasks; GPU
    utilisation and memory share the mean over its GPUs (each task's weighted by
    the GPUs it holds), GPUs summed. Each task is first merged into `step`, so a
    task counts once per step."""
    by_t: dict[float, list[Point]] = {}
    for points in tasks:
        for p in rebucket(points, step):
            by_t.setdefault(p.t, []).append(p)
    out = []
    for t in sorted(by_t):
        ps = by_t[t]
        with_gpu = [p for p in ps if p.gpu is not None]
        with_gpu_mem = [p for p in ps if p.gpuMem is not None]
        out.append(Point(
            t=t, n=sum(p.n for p in ps),
            cpu=sum(p.cpu for p in ps),
            mem=sum(p.mem for p in ps),
            gpu=_weighted(with_gpu, "gpu"),
            gpuMem=_weighted(with_gpu_mem, "gpuMem"),
            gpus=sum(p.gpus for p in ps),
        ))
    return out


def _weighted(points: Sequence[Point], field: str) -> float | None:
    if not points:
        return None
    weights = [max(1, p.gpus) for p in points]
    return sum(getattr(p, field) * w for p, w in zip(points, weights, strict=True)) / sum(weights)


class IdleVerdict(msgspec.Struct, frozen=True, kw_only=True):
    idle: bool
    windowSeconds: float
    thresholdPercent: float
    # The job's mean GPU utilisation over the window (None: no GPU readings in it).
    meanGpuPercent: float | None = None
    gpus: int = 0  # GPUs it holds, at its latest point
    reason: str = ""  # why it is (or is not) flagged, in words


def gpu_idle(total: Sequence[Point], *, now: float, running: bool,
             window_seconds: float = IDLE_WINDOW_SECONDS, threshold: float = IDLE_GPU_PERCENT) -> IdleVerdict:
    """Whether a job holds GPUs idle: it runs, holds GPUs, and its GPU utilisation
    stayed under `threshold` at every point of the last `window_seconds`, which its
    samples cover (a job that started a minute ago is not judged on a minute)."""
    verdict = IdleVerdict(idle=False, windowSeconds=window_seconds, thresholdPercent=threshold)
    if not running:
        return msgspec.structs.replace(verdict, reason="not running")
    if not total:
        return msgspec.structs.replace(verdict, reason="no samples yet")
    gpus = total[-1].gpus
    recent = [p for p in total if p.t >= now - window_seconds and p.gpu is not None]
    mean = sum(p.gpu for p in recent if p.gpu is not None) / len(recent) if recent else None
    verdict = msgspec.structs.replace(verdict, gpus=gpus, meanGpuPercent=None if mean is None else round(mean, 3))
    if gpus == 0 or not recent:
        return msgspec.structs.replace(verdict, reason="holds no GPU with readings")
    if total[0].t > now - window_seconds:
        return msgspec.structs.replace(verdict, reason=f"sampled for less than {window_seconds:g}s")
    if any(p.gpu is not None and p.gpu >= threshold for p in recent):
        return msgspec.structs.replace(verdict, reason="its GPUs were busy in the window")
    return msgspec.structs.replace(
        verdict, idle=True,
        reason=f"holds {gpus} GPU(s) under {threshold:g}% utilisation for the last {window_seconds / 60:g} minutes")
