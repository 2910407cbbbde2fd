"""The jobs one simulation replays: a trace cut to a time window, matched to a cluster.

Every policy gets the same `Workload`, so their results compare job for job.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import msgspec

from services.scheduler.sim.cluster import SimCluster
from services.scheduler.sim.readers.rows import is_number
from services.scheduler.sim.trace import Trace, TraceJob


class SimJob(msgspec.Struct, frozen=True, kw_only=True):
    index: int  # position in arrival order: the simulator's handle on the job
    job_id: str
    vc: str
    submit: float
    duration: float
    gpus: int
    tasks: int  # gang size: all tasks start together, each on one node
    gpus_per_task: int
    priority: int | None  # from the trace; None: the policy decides


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    jobs: list[SimJob]
    # VC -> jobs left out because the cluster has no such VC (reported, not silently dropped).
    excluded_vcs: dict[str, int]
    outside_window: int
    sampled_out: int
    window: dict[str, str | float | None]
    load_factor: float = 1.0


def task_shape(gpus: int, tasks: int | None, max_node_gpus: int) -> tuple[int, int]:
    """(tasks, GPUs per task). Without a gang size: as few tasks as fit on the largest node, all alike."""
    if tasks is not None:
        return tasks, gpus // tasks
    if max_node_gpus <= 0:
        return 1, gpus
    count = max(1, math.ceil(gpus / max_node_gpus))
    while gpus % count or gpus // count > max_node_gpus:
        count += 1
    return count, gpus // count


def parse_time(text: str | None, *, end_of_day: bool = False) -> float | None:
    """--from/--to: seconds (as in the trace) or a date / date-time (UTC); a date alone in --to means its end."""
    if text is None or text == "":
        return None
    if is_number(text):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither seconds nor a date like 2017-10-01 or 2017-10-01T08:00:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = moment.timestamp()
    if end_of_day and len(text.strip()) == 10:
        seconds += 86400
    return seconds


def prepare_workload(trace: Trace, cluster: SimCluster, *, start: float | None = None, end: float | None = None,
                     sample: float = 1.0, seed: int = 0, load_factor: float = 1.0,
                     window_text: tuple[str | None, str | None] = (None, None)) -> Workload:
    """Jobs submitted in [start, end), of VCs the cluster has, optionally a random sample (seeded).

    `load_factor` K > 1 replays the arrivals K times as fast (gaps between submissions
    divided by K, run times unchanged): the same jobs at K times the offered load.
    """
    if load_factor <= 0:
        raise ValueError(f"load factor must be > 0, got {load_factor}")
    if not 0 < sample <= 1:
        raise ValueError(f"sample must be a fraction in (0, 1], got {sample}")
    chosen: list[TraceJob] = []
    excluded: dict[str, int] = {}
    outside = 0
    for job in trace.sorted_jobs():
        if (start is not None and job.submit_time < start) or (end is not None and job.submit_time >= end):
            outside += 1
            continue
        if job.vc not in cluster.vc_quota:
            excluded[job.vc] = excluded.get(job.vc, 0) + 1
            continue
        chosen.append(job)
    sampled_out = 0
    if sample < 1.0:
        rng = random.Random(seed)
        kept = [job for job in chosen if rng.random() < sample]
        sampled_out = len(chosen) - len(kept)
        chosen = kept
    largest = cluster.max_node_gpus
    jobs = []
    first = chosen[0].submit_time if chosen else 0.0
    for index, job in enumerate(chosen):
        tasks, per_task = task_shape(job.num_gpus, job.tasks, largest)
        submit = first + (job.submit_time - first) / load_factor if load_factor != 1.0 else job.submit_time
        jobs.append(SimJob(index=index, job_id=job.job_id, vc=job.vc, submit=submit, duration=job.duration,
                           gpus=job.num_gpus, tasks=tasks, gpus_per_task=per_task, priority=job.priority))
    return Workload(jobs=jobs, excluded_vcs=dict(sorted(excluded.items())), outside_window=outside,
                    sampled_out=sampled_out, window={"from": window_text[0], "to": window_text[1]},
                    load_factor=load_factor)
