"""Simulator speed on the whole Philly trace, and the quality figures of docs/simulator.md.

Default (speed): replays every job of `philly.csv` whose VC has a capacity row in
`philly_vc.csv` (82,229 jobs on 11 VCs, 2,816 GPUs) through the hived policy, PAI's
scheduler core with a virtual clock, and prints one JSON object:

    jobs, wall_s (reading + simulating + figures), simulate_s, cpu_s,
    jobs_per_second (jobs / simulate_s), and the run's overall figures.

--quality: every policy (hived, private, fifo-quota, sjf, helios-fifo, helios-sjf) on the
window 2017-10-01 .. 2017-11-30 at each of --loads (default 1,3,5,8: arrivals that many
times as fast), then on the Alibaba GPU trace 2023 (openb pods on its 6,212-GPU node
list) unless --no-alibaba; each replay timed on its own. Prints the figures as JSON (and
a markdown table on stderr) and, with --plot PATH, writes the queueing-delay CDF figure
used in the README.

The traces are not part of PAI: they are read from ../shared/data/traces (or --data).

Usage: python benchmarks/simulate_philly.py [--policy hived] [--quality [--loads 1,3,5,8] [--plot PNG]] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from services.scheduler.sim.runner import POLICIES, SimOptions, simulate_files  # noqa: E402

DEFAULT_DATA = ROOT / ".." / "shared" / "data" / "traces"
WINDOW = ("2017-10-01", "2017-11-30")
ALIBABA = ("openb_pod_list_default.csv", "openb_node_list_gpu_node.csv")  # Weng et al., USENIX ATC'23
PUBLISHED = {  # HeliosArtifact (SC'21): each VC a private cluster, same window and capacities
    "fifo": {"avg_queueing_delay_s": 56_531, "avg_jct_s": 86_072},
    "sjf": {"avg_queueing_delay_s": 4_731, "avg_jct_s": 34_272},
}


def _files(data: Path) -> tuple[Path, Path]:
    trace, vcs = data / "philly.csv", data / "philly_vc.csv"
    missing = [path for path in (trace, vcs) if not path.exists()]
    if missing:
        sys.exit(f"trace files not found: {', '.join(map(str, missing))} (the Philly trace lives in "
                 "shared/data/traces/; pass --data DIR)")
    return trace, vcs


def speed(data: Path, policy: str) -> dict:
    trace, vcs = _files(data)
    started, cpu_started = time.perf_counter(), time.process_time()
    simulate_seconds = [0.0]
    marks: dict[str, float] = {}

    def on_workload(_workload) -> None:
        marks["simulate"] = time.perf_counter()

    def on_progress(_policy: str, _settled: int) -> None:
        simulate_seconds[0] = time.perf_counter() - marks["simulate"]

    result = simulate_files(trace, vcs, SimOptions(policies=(policy,)), on_progress, on_workload)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    overall = result.report["policies"][policy]["overall"]
    return {
        "policy": policy,
        "jobs": overall["jobs"],
        "gpus": result.cluster.total_gpus,
        "vcs": len(result.cluster.vc_quota),
        "wall_s": round(wall, 2),
        "simulate_s": round(simulate_seconds[0], 2),
        "cpu_s": round(cpu, 2),
        "jobs_per_second": round(overall["jobs"] / simulate_seconds[0]) if simulate_seconds[0] else None,
        "avg_queueing_delay_s": overall["queueing_delay_s"]["avg"],
        "p99_queueing_delay_s": overall["queueing_delay_s"]["p99"],
        "avg_jct_s": overall["jct_s"]["avg"],
        "gpu_allocation": overall["gpu_allocation"],
        "preemptions": overall["preemptions"],
        "never_started": overall["never_started"],
        "simulated_days": round((result.runs[policy].end - result.runs[policy].origin) / 86400, 1),
    }


def _row(report: dict, served_gpu_hours: float, seconds: float) -> dict:
    overall = report["overall"]
    worst = max(((vc["queueing_delay_s"]["avg"] or 0.0, name) for name, vc in report["vcs"].items()),
                key=lambda pair: pair[0])
    return {
        "avg_queueing_delay_s": overall["queueing_delay_s"]["avg"],
        "p50_queueing_delay_s": overall["queueing_delay_s"]["p50"],
        "p99_queueing_delay_s": overall["queueing_delay_s"]["p99"],
        "avg_jct_s": overall["jct_s"]["avg"],
        "p99_jct_s": overall["jct_s"]["p99"],
        "gpu_allocation": overall["gpu_allocation"],
        "preemptions": overall["preemptions"],
        "lost_gpu_hours": overall["lost_gpu_hours"],
        "lost_share_of_served": round(overall["lost_gpu_hours"] / served_gpu_hours, 4) if served_gpu_hours else 0.0,
        "never_started": overall["never_started"],
        "avg_queueing_delay_by_class_s": overall["avg_queueing_delay_by_class_s"],
        "worst_vc_avg_delay_s": list(worst),
        "seconds": round(seconds, 1),
    }


def replay(trace, cluster, workload, policies: tuple[str, ...], options: SimOptions) -> tuple[dict, dict]:
    """Every policy on one workload, each timed on its own: (figures, runs)."""
    from services.scheduler.sim.runner import build_report, run_policies

    runs, seconds = {}, {}
    for name in policies:
        started = time.perf_counter()
        runs.update(run_policies(workload, cluster, msgspec.structs.replace(options, policies=(name,))))
        seconds[name] = time.perf_counter() - started
    report = build_report(trace, cluster, workload, runs, msgspec.structs.replace(options, policies=policies))
    served = sum(job.duration * job.gpus for job, outcome in zip(workload.jobs, runs[policies[0]].outcomes, strict=True)) / 3600
    rows = {name: _row(report["policies"][name], served, seconds[name]) for name in policies}
    anomalies = report.get("sharing_anomaly", {})
    for name, row in rows.items():
        # Policies that keep each VC on its own quota share nothing: no anomaly is possible.
        row["vcs_with_sharing_anomaly"] = anomalies[name]["vcs_with_anomaly"] if name in anomalies else None
    figures = {"jobs": report["input"]["jobs_simulated"], "gpus": cluster.total_gpus,
               "served_gpu_hours": round(served, 1), "policies": rows,
               "trace_notes": report["input"]["trace"]["notes"],
               "skipped": report["input"]["trace"]["skipped"]}
    if "hived" in anomalies:
        # VC -> average delay of hived's guaranteed jobs: [shared (hived), alone (private)]
        figures["guaranteed_delay_by_vc"] = {vc: [v["avg_delay_shared_s"], v["avg_delay_private_s"]]
                                             for vc, v in anomalies["hived"]["vcs"].items()}
    return figures, runs


def quality(data: Path, loads: list[float], plot: Path | None, policies: tuple[str, ...], alibaba: bool) -> dict:
    from services.scheduler.sim.cluster import load_sim_cluster
    from services.scheduler.sim.readers import read_trace
    from services.scheduler.sim.workload import parse_time, prepare_workload

    trace_path, vcs_path = _files(data)
    figures: dict = {"window": list(WINDOW), "published_private_clusters": PUBLISHED,
                     "machine_load_average": [round(x, 1) for x in os.getloadavg()], "loads": {}}
    trace = read_trace(trace_path)
    cluster = load_sim_cluster(vcs_path)
    panels = []
    for load in loads:
        options = SimOptions(policies=policies, start=WINDOW[0], end=WINDOW[1], load_factor=load)
        workload = prepare_workload(trace, cluster, start=parse_time(WINDOW[0]),
                                    end=parse_time(WINDOW[1], end_of_day=True), load_factor=load,
                                    window_text=WINDOW)
        figures["loads"][f"{load:g}"], runs = replay(trace, cluster, workload, policies, options)
        print(f"philly {load:g}x done", file=sys.stderr, flush=True)
        label = "trace load" if load == 1.0 else f"arrivals {load:g}x as fast"
        panels.append((f"Philly, {label}", workload.jobs, runs))
    if alibaba:
        pods, nodes = data / ALIBABA[0], data / ALIBABA[1]
        if pods.exists() and nodes.exists():
            ali_trace = read_trace(pods)
            ali_cluster = load_sim_cluster(nodes)
            workload = prepare_workload(ali_trace, ali_cluster)
            figures["alibaba_2023"], runs = replay(ali_trace, ali_cluster, workload, policies, SimOptions(policies=policies))
            figures["alibaba_2023"]["cluster_notes"] = ali_cluster.notes
            panels.append(("Alibaba GPU trace 2023 (openb)", workload.jobs, runs))
    if plot is not None:
        from services.scheduler.sim.plots import delay_cdf_panels

        delay_cdf_panels(plot, panels)
    return figures


def markdown_table(figures: dict) -> str:
    header = ("| trace | policy | avg delay (s) | p99 delay (s) | avg JCT (s) | GPU alloc | preemptions (GPU-h lost, "
              "% of served) | worst VC avg delay (s) | VCs in sharing anomaly | replay (s) |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---|---|---:|"]
    sections = [(f"Philly {float(load):g}x", info) for load, info in figures["loads"].items()]
    if "alibaba_2023" in figures:
        sections.append(("Alibaba 2023", figures["alibaba_2023"]))
    for label, info in sections:
        for name, row in info["policies"].items():
            worst, vc = row["worst_vc_avg_delay_s"]
            worst_text = f"{worst:,.0f} ({vc})" if worst else "0"
            anomaly = row["vcs_with_sharing_anomaly"]
            anomaly_text = "n/a (private)" if anomaly is None else (", ".join(anomaly) or "none")
            name_text = f"**{name}** (PAI)" if name == "hived" else name
            lines.append(f"| {label} | {name_text} | {row['avg_queueing_delay_s']:,} | "
                         f"{row['p99_queueing_delay_s']:,} | {row['avg_jct_s']:,} | {row['gpu_allocation']:.1%} | "
                         f"{row['preemptions']:,} ({row['lost_gpu_hours']:,.0f}, {row['lost_share_of_served']:.1%}) | "
                         f"{worst_text} | {anomaly_text} | {row['seconds']:.0f} |")
    return "\n".join(lines)


def long_queue(waiting: int = 10_000, events: int = 2_000) -> dict:
    """Time per scheduler event with `waiting` jobs queued in one VC whose quota is busy (no trace needed)."""
    from libs.common.protocol.model import JobSpec, Resources, TaskRole
    from services.scheduler.core import Release, SchedulerCore, Submit
    from services.scheduler.sim.cluster import cluster_from_vc_capacities

    cluster = cluster_from_vc_capacities({"busy": 4, "other": 4}, rack_nodes=4)
    now = [0.0]
    core = SchedulerCore(cluster.config, clock=lambda: now[0])

    def spec(name: str, vc: str, gpus: int, priority: int = 10) -> JobSpec:
        return JobSpec(name=name, user="bench", virtualCluster=vc, priority=priority, gangAllocation=True,
                       taskRoles=[TaskRole(name="w", instances=1, resources=Resources(gpu=gpus, cpu=0, memoryMB=0))])

    for n in range(4):  # the busy VC's whole quota runs
        core.handle(Submit(job=f"bench~run{n}", attempt=1, spec=spec(f"run{n}", "busy", 8)))
    started = time.perf_counter()
    for n in range(waiting):
        core.handle(Submit(job=f"bench~wait{n}", attempt=1, spec=spec(f"wait{n}", "busy", 1 + n % 8)))
    submit_s = time.perf_counter() - started
    started = time.perf_counter()
    for n in range(events):  # other work comes and goes; opportunistic jobs arrive and wait too
        now[0] += 1.0
        core.handle(Submit(job=f"bench~other{n}", attempt=1, spec=spec(f"other{n}", "other", 1)))
        core.handle(Release(job=f"bench~other{n}", attempt=1))
        core.handle(Submit(job=f"bench~oppo{n}", attempt=1, spec=spec(f"oppo{n}", "other", 64, priority=-1)))
    event_s = time.perf_counter() - started
    return {"waiting_in_one_vc": waiting, "queued_total": core.queued_count(),
            "submit_us_per_job": round(submit_s / waiting * 1e6, 1),
            "event_us": round(event_s / (3 * events) * 1e6, 1),
            "machine_load_average": [round(x, 1) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with philly.csv and philly_vc.csv")
    parser.add_argument("--policy", default="hived", choices=POLICIES)
    parser.add_argument("--quality", action="store_true", help="every policy on the docs' window, at every --loads")
    parser.add_argument("--loads", default="1,3,5,8", help="--quality: load factors, comma-separated")
    parser.add_argument("--policies", default=",".join(POLICIES), help="--quality: policies, comma-separated")
    parser.add_argument("--no-alibaba", action="store_true", help="--quality: leave out the Alibaba 2023 replay")
    parser.add_argument("--plot", type=Path, help="--quality: write the queueing-delay CDF figure here")
    parser.add_argument("--long-queue", action="store_true",
                        help="time per scheduler event with 10,000 jobs waiting in one VC (no trace needed)")
    args = parser.parse_args()
    if args.long_queue:
        print(json.dumps(long_queue(), indent=2))
    elif args.quality:
        loads = [float(x) for x in args.loads.split(",") if x]
        policies = tuple(x for x in args.policies.split(",") if x)
        unknown = [name for name in policies if name not in POLICIES]
        if unknown:
            sys.exit(f"unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})")
        figures = quality(args.data, loads, args.plot, policies, not args.no_alibaba)
        print(json.dumps(figures, indent=2))
        print(markdown_table(figures), file=sys.stderr)
    else:
        print(json.dumps(speed(args.data, args.policy), indent=2))


if __name__ == "__main__":
    main()
