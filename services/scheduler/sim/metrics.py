"""Figures of one simulation run, overall and per VC, as plain JSON-ready dicts.

- queueing delay: first start - submission, over the jobs that started;
- JCT (job completion time): finish - submission, over the jobs that finished;
- percentiles are nearest-rank (an actual job's value, no interpolation);
- makespan: last finish - first submission of the group's jobs;
- GPU allocation ratio: GPUs held / GPUs owned (the cluster; a VC's quota), as a
  time-weighted average per interval and over the whole run. A VC's ratio can
  exceed 1 when its opportunistic jobs use other VCs' idle cells;
- preemptions and the GPU-hours of work they threw away.
Numbers are rounded (seconds to 0.1, ratios to 4 digits) so the JSON is stable and readable.
"""

from __future__ import annotations

import math

from services.scheduler.sim.policies.base import GUARANTEED, OPPORTUNISTIC
from services.scheduler.sim.simulator import OVERALL, JobOutcome, SimulationRun
from services.scheduler.sim.workload import SimJob

NEVER_STARTED_EXAMPLES = 10


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ratio(value: float) -> float:
    return round(value, 4)


def group_figures(jobs: list[SimJob], outcomes: list[JobOutcome]) -> dict:
    delays = sorted(o.first_start - j.submit for j, o in zip(jobs, outcomes, strict=True) if o.first_start is not None)
    jcts = sorted(o.finish - j.submit for j, o in zip(jobs, outcomes, strict=True) if o.finish is not None)
    finishes = [o.finish for o in outcomes if o.finish is not None]
    first_submit = min((j.submit for j in jobs), default=None)
    return {
        "jobs": len(jobs),
        "guaranteed": sum(1 for o in outcomes if o.job_class == GUARANTEED),
        "opportunistic": sum(1 for o in outcomes if o.job_class == OPPORTUNISTIC),
        "started": len(delays),
        "finished": len(jcts),
        "never_started": len(jobs) - len(delays),
        "queueing_delay_s": {
            "avg": _seconds(sum(delays) / len(delays)) if delays else None,
            "p50": _seconds(percentile(delays, 0.5)),
            "p99": _seconds(percentile(delays, 0.99)),
        },
        "jct_s": {
            "avg": _seconds(sum(jcts) / len(jcts)) if jcts else None,
            "p99": _seconds(percentile(jcts, 0.99)),
        },
        # Average queueing delay of the jobs of each class that started (None: no such job started).
        "avg_queueing_delay_by_class_s": {
            kind: _seconds(_average([o.first_start - j.submit for j, o in zip(jobs, outcomes, strict=True)
                                     if o.job_class == kind and o.first_start is not None]))
            for kind in (GUARANTEED, OPPORTUNISTIC)
        },
        "makespan_s": _seconds(max(finishes) - first_submit) if finishes and first_submit is not None else None,
        "preemptions": sum(o.preemptions for o in outcomes),
        "lost_gpu_hours": round(sum(o.lost_gpu_seconds for o in outcomes) / 3600, 1),
    }


def allocation_figures(run: SimulationRun, key: str, owned: int) -> tuple[float, list[float]]:
    """(average ratio over the run, ratio per interval); the last interval is averaged over the part that ran."""
    tracker = run.allocation
    span = run.end - run.origin
    if owned <= 0 or span <= 0:
        return 0.0, []
    buckets = math.ceil(span / tracker.interval)
    means = tracker.mean_gpus(key, buckets)
    last_length = span - (buckets - 1) * tracker.interval
    if means and last_length > 0:
        means[-1] *= tracker.interval / last_length
    average = tracker.gpu_seconds(key) / span / owned
    return _ratio(average), [_ratio(mean / owned) for mean in means]


def run_figures(run: SimulationRun, jobs: list[SimJob], quotas: dict[str, int], total_gpus: int) -> dict:
    by_vc: dict[str, list[int]] = {vc: [] for vc in quotas}
    for job in jobs:
        by_vc[job.vc].append(job.index)
    overall = group_figures(jobs, run.outcomes)
    overall["gpus"] = total_gpus
    overall["gpu_allocation"], overall_series = allocation_figures(run, OVERALL, total_gpus)
    vcs: dict[str, dict] = {}
    vc_series: dict[str, list[float]] = {}
    for vc, indices in by_vc.items():
        figures = group_figures([jobs[i] for i in indices], [run.outcomes[i] for i in indices])
        figures["quota_gpus"] = quotas[vc]
        figures["gpu_allocation"], vc_series[vc] = allocation_figures(run, vc, quotas[vc])
        vcs[vc] = figures
    never = [(job, outcome) for job, outcome in zip(jobs, run.outcomes, strict=True) if outcome.first_start is None]
    unfinished = [(job, outcome) for job, outcome in zip(jobs, run.outcomes, strict=True)
                  if outcome.first_start is not None and outcome.finish is None]
    return {
        "overall": overall,
        "vcs": vcs,
        "never_started": {
            "count": len(never),
            "examples": [{"job": job.job_id, "vc": job.vc, "gpus": job.gpus, "reason": outcome.never_reason}
                         for job, outcome in never[:NEVER_STARTED_EXAMPLES]],
        },
        "preempted_never_finished": len(unfinished),
        "allocation_series": {
            "interval_s": run.allocation.interval,
            "overall": overall_series,
            "vcs": vc_series,
        },
    }


def sharing_anomaly(jobs: list[SimJob], shared: SimulationRun, private: SimulationRun, *,
                    tolerance_s: float = 1.0, tolerance_ratio: float = 0.01) -> dict:
    """Per VC: do its guaranteed jobs (as submitted in the shared run) wait longer shared than alone?

    The same jobs are compared in both runs. A VC is flagged when their average queueing
    delay in the shared cluster exceeds the private one by more than the tolerance
    (max of `tolerance_s` and `tolerance_ratio` of the private figure), or when some of
    them never started in the shared cluster but all did alone.
    """
    result: dict[str, dict] = {}
    by_vc: dict[str, list[SimJob]] = {}
    all_by_vc: dict[str, list[SimJob]] = {}
    for job in jobs:
        all_by_vc.setdefault(job.vc, []).append(job)
        if shared.outcomes[job.index].job_class == GUARANTEED:
            by_vc.setdefault(job.vc, []).append(job)
    for vc in sorted(by_vc):
        group = by_vc[vc]
        everyone = all_by_vc[vc]
        shared_delays = [_delay(job, shared) for job in group]
        private_delays = [_delay(job, private) for job in group]
        shared_avg = _average(shared_delays)
        private_avg = _average(private_delays)
        shared_never = sum(1 for d in shared_delays if d is None)
        private_never = sum(1 for d in private_delays if d is None)
        tolerance = max(tolerance_s, tolerance_ratio * (private_avg or 0.0))
        anomaly = shared_never > private_never or (
            shared_avg is not None and private_avg is not None and shared_avg > private_avg + tolerance)
        result[vc] = {
            "guaranteed_jobs": len(group),
            "avg_delay_shared_s": _seconds(shared_avg),
            "avg_delay_private_s": _seconds(private_avg),
            "never_started_shared": shared_never,
            "never_started_private": private_never,
            "anomaly": anomaly,
            "all_jobs": len(everyone),
            "avg_delay_all_jobs_shared_s": _seconds(_average([_delay(job, shared) for job in everyone])),
            "avg_delay_all_jobs_private_s": _seconds(_average([_delay(job, private) for job in everyone])),
        }
    flagged = [vc for vc, figures in result.items() if figures["anomaly"]]
    return {"shared_policy": shared.policy, "private_policy": private.policy, "vcs": result,
            "vcs_with_anomaly": flagged}


def _delay(job: SimJob, run: SimulationRun) -> float | None:
    start = run.outcomes[job.index].first_start
    return None if start is None else start - job.submit


def _average(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None
