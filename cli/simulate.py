"""`pai simulate`: replay a cluster trace through PAI's scheduler with a virtual clock.

No NATS, no processes: the same scheduler core as the service, driven by an event
loop (services/scheduler/sim). Writes `report.json` and PNG plots to --out and
prints a summary. See docs/simulator.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from services.scheduler.sim.cluster import DEFAULT_GPUS_PER_NODE, DEFAULT_RACK_NODES, DEFAULT_SKU
    from services.scheduler.sim.readers import TRACE_FORMATS
    from services.scheduler.sim.runner import POLICIES

    sim = subparsers.add_parser(
        "simulate", help="replay a cluster trace through PAI's scheduler (virtual clock)",
        description="Replay a job trace through PAI's scheduler core and simpler reference policies; "
                    "writes report.json and plots to --out. See docs/simulator.md.")
    sim.add_argument("--trace", required=True, type=Path,
                     help="jobs: PAI's CSV (job_id,submit_time,duration,num_gpus,vc[,priority][,tasks]), "
                          "Philly's philly.csv or Alibaba's openb_pod_list_*.csv")
    sim.add_argument("--cluster", required=True, type=Path,
                     help="a HiveD cluster config (.yaml), VC capacities (vc,node num; e.g. philly_vc.csv) "
                          "or a GPU node list (sn,...,gpu,model; e.g. openb_node_list_gpu_node.csv)")
    sim.add_argument("--policy", action="append", metavar="NAME",
                     help=f"{', '.join(POLICIES)} or all; repeat or separate with commas (default: hived)")
    sim.add_argument("--from", dest="start", metavar="WHEN",
                     help="first submission time to replay: seconds as in the trace, or a date(-time) like 2017-10-01")
    sim.add_argument("--to", dest="end", metavar="WHEN",
                     help="replay submissions before this time (a date alone includes that whole day)")
    sim.add_argument("--out", type=Path, default=Path("pai-simulation"),
                     help="folder for report.json and the plots (default: ./pai-simulation)")
    sim.add_argument("--trace-format", choices=TRACE_FORMATS, help="skip detection from the header")
    sim.add_argument("--priority-rule", choices=("quota", "guaranteed"), default="quota",
                     help="hived: priority of trace jobs without one: guaranteed within the VC's quota, else "
                          "opportunistic (quota, default); or always guaranteed")
    sim.add_argument("--load-factor", type=float, default=1.0, metavar="K",
                     help="replay arrivals K times as fast: the same jobs at K times the load (default 1)")
    sim.add_argument("--sample", type=float, default=1.0, metavar="FRACTION",
                     help="simulate a random fraction of the jobs, drawn with --seed (default 1: all)")
    sim.add_argument("--seed", type=int, default=0, help="seed for --sample (default 0)")
    sim.add_argument("--interval", type=float, default=3600.0, metavar="SECONDS",
                     help="resolution of the GPU allocation series (default 3600)")
    sim.add_argument("--drop-duplicates", action="store_true",
                     help="Philly: drop rows that repeat an earlier row exactly (kept by default, and reported)")
    sim.add_argument("--gpus-per-node", type=int, default=DEFAULT_GPUS_PER_NODE,
                     help=f"VC-capacity clusters: GPUs per node (default {DEFAULT_GPUS_PER_NODE})")
    sim.add_argument("--rack-nodes", type=int, default=DEFAULT_RACK_NODES,
                     help=f"VC-capacity clusters: nodes per rack (default {DEFAULT_RACK_NODES})")
    sim.add_argument("--sku", default=DEFAULT_SKU, help=f"VC-capacity clusters: sku name (default {DEFAULT_SKU})")
    sim.add_argument("--no-plots", action="store_true", help="write report.json only")
    sim.add_argument("--quiet", action="store_true", help="no progress bar and no summary tables")
    sim.set_defaults(func=cmd_simulate)
    return sim


def _policies(values: list[str] | None) -> tuple[str, ...]:
    from services.scheduler.sim.runner import POLICIES

    names: list[str] = []
    for value in values or ["hived"]:
        for name in value.split(","):
            name = name.strip()
            if name == "all":
                names.extend(POLICIES)
            elif name:
                names.append(name)
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)}, all)")
    return tuple(dict.fromkeys(names))


def cmd_simulate(args: argparse.Namespace) -> int:
    from services.scheduler.cluster import ClusterConfigError
    from services.scheduler.sim.cluster import ClusterFileError
    from services.scheduler.sim.plots import PlotsUnavailable, write_plots
    from services.scheduler.sim.readers import TraceFormatError
    from services.scheduler.sim.runner import SimOptions, report_json, simulate_files

    try:
        options = SimOptions(
            policies=_policies(args.policy), priority_rule=args.priority_rule, interval_s=args.interval,
            seed=args.seed, sample=args.sample, load_factor=args.load_factor, start=args.start, end=args.end,
            trace_format=args.trace_format, drop_duplicates=args.drop_duplicates, gpus_per_node=args.gpus_per_node,
            rack_nodes=args.rack_nodes, sku=args.sku)
    except ValueError as error:
        err_console.print(f"[red]error[/]: {error}")
        return 2
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs done"),
                        TimeElapsedColumn(), console=err_console, disable=args.quiet, transient=False)
    tasks: dict[str, TaskID] = {}

    def on_workload(workload) -> None:
        for name in options.policies:
            tasks[name] = progress.add_task(f"{name:<10}", total=len(workload.jobs))

    def on_progress(policy: str, settled: int) -> None:
        progress.update(tasks[policy], completed=settled)

    try:
        with progress:
            result = simulate_files(args.trace, args.cluster, options, on_progress, on_workload)
    except (TraceFormatError, ClusterFileError, ClusterConfigError, ValueError) as error:
        err_console.print(f"[red]error[/]: {error}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "report.json"
    report_path.write_text(report_json(result.report))
    plots: list[Path] = []
    if not args.no_plots:
        try:
            plots = write_plots(args.out, result.workload.jobs, result.runs, total_gpus=result.cluster.total_gpus,
                                vcs=list(result.cluster.vc_quota))
        except PlotsUnavailable as error:
            err_console.print(f"[yellow]no plots[/]: {error}")
    if not result.workload.jobs:
        err_console.print("[yellow]no jobs to simulate[/]: none of the trace's jobs is in the window and in a VC "
                          "of the cluster")
    if not args.quiet:
        _print_summary(result.report)
    console.print(f"report: {report_path}" + (f"   plots: {', '.join(p.name for p in plots)}" if plots else ""))
    return 0


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"
    return f"{value:,}"


def _print_summary(report: dict) -> None:
    source = report["input"]
    trace = source["trace"]
    console.print(f"[bold]{trace['file']}[/] ({trace['format']}): {trace['jobs_read']:,} jobs read, "
                  f"{trace['skipped']['count']:,} rows skipped; {source['jobs_simulated']:,} simulated on "
                  f"{source['cluster']['gpus']:,} GPUs ({source['cluster']['file']})")
    for kind, info in trace["skipped"]["by_kind"].items():
        first = info["examples"][0]
        console.print(f"  skipped {info['rows']:,} x {kind}: e.g. line {first['line']}: {first['reason']}")
    for note in trace["notes"] + source.get("notes", []):
        console.print(f"  note: {note}")
    table = Table("policy", "jobs", "never started", "avg delay s", "p50", "p99", "avg JCT s", "p99 JCT",
                  "GPU alloc", "preemptions", title="overall")
    for name, figures in report["policies"].items():
        overall = figures["overall"]
        delay, jct = overall["queueing_delay_s"], overall["jct_s"]
        table.add_row(name, _fmt(overall["jobs"]), _fmt(overall["never_started"]), _fmt(delay["avg"]),
                      _fmt(delay["p50"]), _fmt(delay["p99"]), _fmt(jct["avg"]), _fmt(jct["p99"]),
                      f"{overall['gpu_allocation']:.1%}", _fmt(overall["preemptions"]))
    console.print(table)
    vc_table = Table("vc", "quota", *report["policies"], title="average queueing delay per VC (s)")
    vcs = next(iter(report["policies"].values()))["vcs"] if report["policies"] else {}
    for vc, figures in vcs.items():
        vc_table.add_row(vc, _fmt(figures["quota_gpus"]),
                         *(_fmt(p["vcs"][vc]["queueing_delay_s"]["avg"]) for p in report["policies"].values()))
    console.print(vc_table)
    for name, anomaly in report.get("sharing_anomaly", {}).items():
        flagged = anomaly["vcs_with_anomaly"]
        if flagged:
            console.print(f"[red]sharing anomaly[/] with {name}: guaranteed jobs of {', '.join(flagged)} wait longer "
                          "in the shared cluster than alone on their quota")
        else:
            console.print(f"[green]no sharing anomaly[/] with {name}: no VC's guaranteed jobs wait longer shared "
                          "than alone")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pai")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
