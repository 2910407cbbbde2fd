"""One call from files to the JSON report: read, prepare, run each policy, compute the figures.

The report holds nothing that depends on when or where it ran (no wall time, no
absolute paths), so the same input and seed give byte-identical JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from services.scheduler.sim.cluster import (
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_RACK_NODES,
    DEFAULT_SKU,
    SimCluster,
    load_sim_cluster,
)
from services.scheduler.sim.metrics import run_figures, sharing_anomaly
from services.scheduler.sim.policies.base import Policy
from services.scheduler.sim.policies.core import CorePolicy
from services.scheduler.sim.policies.fifo_quota import QuotaFifoPolicy
from services.scheduler.sim.policies.helios import HeliosPolicy
from services.scheduler.sim.policies.sjf import ShortestFirstPolicy
from services.scheduler.sim.readers import read_trace
from services.scheduler.sim.simulator import SimulationRun, simulate
from services.scheduler.sim.trace import Trace, skipped_summary
from services.scheduler.sim.workload import Workload, parse_time, prepare_workload

REPORT_VERSION = 1
POLICIES = ("hived", "private", "fifo-quota", "sjf", "helios-fifo", "helios-sjf")
SHARED_POLICIES = ("hived", "fifo-quota")  # the VCs share one cluster
POLICY_SUMMARY = {
    "hived": "PAI's scheduler core on the shared cluster: guaranteed jobs within VC quota, the rest opportunistic",
    "private": "PAI's scheduler core, every job guaranteed: each VC alone on its quota (a private cluster)",
    "fifo-quota": "shared nodes, GPU-count quotas, FIFO per VC, elastic beyond quota, no preemption (YARN-CS-like)",
    "sjf": "each VC alone on its quota, shortest job first with known durations (a reference)",
    "helios-fifo": "HeliosArtifact's method (Hu et al., SC'21): each VC private, FIFO, strict head of line, "
                   "consolidated placement",
    "helios-sjf": "HeliosArtifact's method (Hu et al., SC'21): each VC private, SJF with known durations, strict "
                  "head of line, consolidated placement",
}


class SimOptions(msgspec.Struct, frozen=True, kw_only=True):
    policies: tuple[str, ...] = ("hived",)
    priority_rule: str = "quota"  # for hived: "quota" or "guaranteed"
    interval_s: float = 3600.0  # allocation series resolution
    seed: int = 0
    sample: float = 1.0  # fraction of the jobs to keep (random, seeded)
    load_factor: float = 1.0  # replay arrivals this many times as fast
    start: str | None = None  # --from: seconds or a date(-time)
    end: str | None = None  # --to: seconds or a date(-time); a date alone means its end
    trace_format: str | None = None  # None: detected from the header
    drop_duplicates: bool = False
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE  # for VC-capacity cluster files
    rack_nodes: int = DEFAULT_RACK_NODES
    sku: str = DEFAULT_SKU


class SimulationResult(msgspec.Struct, frozen=True, kw_only=True):
    report: dict
    trace: Trace
    cluster: SimCluster
    workload: Workload
    runs: dict[str, SimulationRun]


def simulate_files(trace_path: Path | str, cluster_path: Path | str, options: SimOptions | None = None,
                   progress: Callable[[str, int], None] | None = None,
                   on_workload: Callable[[Workload], None] | None = None) -> SimulationResult:
    """Read both files, run every policy of `options`, and build the report.

    Raises TraceFormatError / ClusterFileError / ClusterConfigError / ValueError with a
    message for a person when an input cannot be used.
    """
    options = options or SimOptions()
    for name in options.policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    trace = read_trace(trace_path, format=options.trace_format, drop_duplicates=options.drop_duplicates)
    cluster = load_sim_cluster(cluster_path, gpus_per_node=options.gpus_per_node, sku=options.sku,
                               rack_nodes=options.rack_nodes)
    workload = prepare_workload(trace, cluster, start=parse_time(options.start),
                                end=parse_time(options.end, end_of_day=True), sample=options.sample, seed=options.seed,
                                load_factor=options.load_factor, window_text=(options.start, options.end))
    if on_workload is not None:
        on_workload(workload)
    runs = run_policies(workload, cluster, options, progress)
    report = build_report(trace, cluster, workload, runs, options)
    return SimulationResult(report=report, trace=trace, cluster=cluster, workload=workload, runs=runs)


def make_policy(name: str, cluster: SimCluster, options: SimOptions) -> Policy:
    if name == "hived":
        return CorePolicy("hived", cluster, priority_rule=options.priority_rule)
    if name == "private":
        return CorePolicy("private", cluster, priority_rule="guaranteed")
    if name == "fifo-quota":
        return QuotaFifoPolicy(cluster)
    if name == "sjf":
        return ShortestFirstPolicy(cluster)
    if name in ("helios-fifo", "helios-sjf"):
        return HeliosPolicy(cluster, order=name.removeprefix("helios-"))
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")


def run_policies(workload: Workload, cluster: SimCluster, options: SimOptions,
                 progress: Callable[[str, int], None] | None = None) -> dict[str, SimulationRun]:
    runs: dict[str, SimulationRun] = {}
    vcs = list(cluster.vc_quota)
    for name in options.policies:
        policy = make_policy(name, cluster, options)
        report = (lambda settled, name=name: progress(name, settled)) if progress is not None else None
        runs[name] = simulate(workload.jobs, policy, interval=options.interval_s, vcs=vcs, progress=report)
    return runs


def build_report(trace: Trace, cluster: SimCluster, workload: Workload, runs: dict[str, SimulationRun],
                 options: SimOptions) -> dict:
    jobs = workload.jobs
    report: dict = {
        "report_version": REPORT_VERSION,
        "input": {
            "trace": {"file": trace.source, "format": trace.format, "rows_read": len(trace.jobs) + len(trace.skipped),
                      "jobs_read": len(trace.jobs), "skipped": skipped_summary(trace.skipped), "notes": trace.notes},
            "cluster": {"file": cluster.source, "kind": cluster.kind, "gpus": cluster.total_gpus,
                        "nodes": len(cluster.node_gpus), "vc_quota_gpus": cluster.vc_quota,
                        "skipped": skipped_summary(cluster.skipped), "notes": cluster.notes},
            "window": workload.window,
            "jobs_outside_window": workload.outside_window,
            "jobs_of_vcs_without_capacity": workload.excluded_vcs,
            "load_factor": workload.load_factor,
            "seed": options.seed,
            "sample": options.sample,
            "jobs_sampled_out": workload.sampled_out,
            "jobs_simulated": len(jobs),
            "first_submission": _moment(jobs[0].submit, trace.epoch_times) if jobs else None,
            "last_submission": _moment(jobs[-1].submit, trace.epoch_times) if jobs else None,
        },
        "policies": {},
    }
    if workload.excluded_vcs:
        missing = ", ".join(f"{vc} ({count} jobs)" for vc, count in workload.excluded_vcs.items())
        report["input"]["notes"] = [f"not simulated, the cluster has no such VC: {missing}"]
    for name, run in runs.items():
        figures = run_figures(run, jobs, cluster.vc_quota, cluster.total_gpus)
        rule = options.priority_rule if name == "hived" else None
        report["policies"][name] = {"summary": POLICY_SUMMARY.get(name, ""),
                                    **({"priority_rule": rule} if rule else {}), **figures}
    if "private" in runs:
        # Each shared-cluster policy against every VC alone on its quota, job for job.
        shared = [name for name in SHARED_POLICIES if name in runs]
        if shared:
            report["sharing_anomaly"] = {name: sharing_anomaly(jobs, runs[name], runs["private"]) for name in shared}
    return report


def _moment(seconds: float, epoch: bool) -> str | float:
    if not epoch:
        return round(seconds, 3)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def report_json(report: dict) -> str:
    """The report as text: sorted nowhere (key order is meaningful), fixed separators, one trailing newline."""
    return json.dumps(report, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
