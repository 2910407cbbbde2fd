"""Simulator speed on the whole Philly trace, and the quality figures of docs/simulator.md.

Default (speed): replays every job of `philly.csv` whose VC has a capacity row in
`philly_vc.csv` (82,229 jobs on 11 VCs, 2,816 GPUs) through the hived policy, PAI's
scheduler core with a virtual clock, and prints one JSON object:

    jobs, wall_s (reading + simulating + figures), simulate_s, cpu_s,
    jobs_per_second (jobs / simulate_s), and the run's overall figures.

--quality: every policy on the window 2017-10-01 .. 2017-11-30 at the trace's own load
and at --stress-load times it; prints the figures as JSON (and a markdown table on
stderr) and, with --plot PATH, writes the queueing-delay CDF figure used in the docs.

The traces are not part of PAI: they are read from ../shared/data/traces (or --data).

Usage: python benchmarks/simulate_philly.py [--policy hived] [--quality [--plot PNG]] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.scheduler.sim.runner import POLICIES, SimOptions, simulate_files  # noqa: E402

DEFAULT_DATA = ROOT / ".." / "shared" / "data" / "traces"
WINDOW = ("2017-10-01", "2017-11-30")
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


def quality(data: Path, stress_load: float, plot: Path | None) -> dict:
    trace, vcs = _files(data)
    figures: dict = {"window": list(WINDOW), "published_private_clusters": PUBLISHED, "loads": {}}
    panels = []
    for load in (1.0, stress_load):
        options = SimOptions(policies=POLICIES, start=WINDOW[0], end=WINDOW[1], load_factor=load)
        started = time.perf_counter()
        result = simulate_files(trace, vcs, options)
        rows = {}
        for name, report in result.report["policies"].items():
            overall = report["overall"]
            rows[name] = {
                "avg_queueing_delay_s": overall["queueing_delay_s"]["avg"],
                "p50_queueing_delay_s": overall["queueing_delay_s"]["p50"],
                "p99_queueing_delay_s": overall["queueing_delay_s"]["p99"],
                "avg_jct_s": overall["jct_s"]["avg"],
                "p99_jct_s": overall["jct_s"]["p99"],
                "gpu_allocation": overall["gpu_allocation"],
                "preemptions": overall["preemptions"],
                "lost_gpu_hours": overall["lost_gpu_hours"],
                "never_started": overall["never_started"],
                "worst_vc_avg_delay_s": max(
                    ((vc["queueing_delay_s"]["avg"] or 0.0, name_) for name_, vc in report["vcs"].items()),
                    key=lambda pair: pair[0]),
            }
        anomalies = result.report["sharing_anomaly"]
        figures["loads"][str(load)] = {
            "jobs": result.report["input"]["jobs_simulated"],
            "policies": rows,
            "vcs_with_sharing_anomaly": {name: found["vcs_with_anomaly"] for name, found in anomalies.items()},
            # VC -> average delay of hived's guaranteed jobs: [shared (hived), alone (private)]
            "guaranteed_delay_by_vc": {vc: [v["avg_delay_shared_s"], v["avg_delay_private_s"]]
                                       for vc, v in anomalies["hived"]["vcs"].items()},
            "seconds": round(time.perf_counter() - started, 1),
        }
        label = "trace load" if load == 1.0 else f"arrivals {load:g}x as fast"
        panels.append((f"Philly {WINDOW[0]} .. {WINDOW[1]}, {label}", result.workload.jobs, result.runs))
    if plot is not None:
        from services.scheduler.sim.plots import delay_cdf_panels

        delay_cdf_panels(plot, panels)
    return figures


def markdown_table(figures: dict) -> str:
    header = ("| load | policy | avg delay (s) | p99 delay (s) | avg JCT (s) | GPU alloc | preemptions (GPU-h lost) "
              "| worst VC avg delay (s) |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---|"]
    for load, info in figures["loads"].items():
        for name, row in info["policies"].items():
            worst, vc = row["worst_vc_avg_delay_s"]
            worst_text = f"{worst:,} ({vc})" if worst else "0"
            lines.append(f"| {float(load):g}x | {name} | {row['avg_queueing_delay_s']:,} | "
                         f"{row['p99_queueing_delay_s']:,} | {row['avg_jct_s']:,} | {row['gpu_allocation']:.1%} | "
                         f"{row['preemptions']:,} ({row['lost_gpu_hours']:,.0f}) | {worst_text} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with philly.csv and philly_vc.csv")
    parser.add_argument("--policy", default="hived", choices=POLICIES)
    parser.add_argument("--quality", action="store_true", help="every policy on the docs' window, two loads")
    parser.add_argument("--stress-load", type=float, default=3.0, help="--quality: the second load factor")
    parser.add_argument("--plot", type=Path, help="--quality: write the queueing-delay CDF figure here")
    args = parser.parse_args()
    if args.quality:
        figures = quality(args.data, args.stress_load, args.plot)
        print(json.dumps(figures, indent=2))
        print(markdown_table(figures), file=sys.stderr)
    else:
        print(json.dumps(speed(args.data, args.policy), indent=2))


if __name__ == "__main__":
    main()
