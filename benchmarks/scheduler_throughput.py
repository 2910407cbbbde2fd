"""Scheduler core throughput on a heterogeneous cluster built from Alibaba PAI's machine list.

Builds a HiveD-format cluster from `shared/data/traces/pai_machine_spec.csv` (GPU machines
only; one sku per GPU model; racks of nodes; 20 VCs sharing every sku), then drives
100,000 jobs of mixed gang sizes and priorities through `SchedulerCore` with a virtual
clock: Poisson arrivals, exponential run times, preempted jobs released one second
after the Preempt. Prints one JSON object:

    decisions_per_second  Place + Preempt + Wait decisions per second of time spent in handle()
    events_per_second     events handled per second of time spent in handle()
    p50_ms, p99_ms, max_ms   latency of one handle() call (one event)
    jobs, placed, preemptions, waits, ...

--long-queue N (issue 15: decision latency with a long queue): first N guaranteed jobs
are submitted to one VC (vc00) at time 0, so all but the few its quota holds wait there,
then the same stream of submits and releases runs over the whole cluster (default 20,000
jobs) while vc00's queue drains slowly. The latencies are those of the stream's events
only; `long_vc_queue_min` / `long_vc_queue_end` tell how long vc00's queue stayed.

Usage: python benchmarks/scheduler_throughput.py [--jobs N] [--seed S] [--data PATH] [--long-queue 10000]
"""

from __future__ import annotations

import argparse
import csv
import gc
import heapq
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from libs.common.protocol.model import JobSpec, Resources, TaskRole  # noqa: E402
from services.scheduler.cluster import load_cluster_config  # noqa: E402
from services.scheduler.core import (  # noqa: E402
    Place,
    Preempt,
    Release,
    SchedulerCore,
    Submit,
    Wait,
)

DEFAULT_DATA = ROOT / ".." / "shared" / "data" / "traces" / "pai_machine_spec.csv"
VC_COUNT = 20
RACK_NODES = {2: 8, 8: 4}  # nodes per rack cell, by GPUs per node


def read_machines(path: Path) -> list[dict]:
    header_path = path.with_suffix(".header")
    header = header_path.read_text().strip().split(",") if header_path.exists() else [
        "machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu"]
    with path.open() as handle:
        rows = [dict(zip(header, row, strict=False)) for row in csv.reader(handle) if row]
    return [row for row in rows if int(row["cap_gpu"]) > 0]


def cluster_config(machines: list[dict]) -> dict:
    """HiveD config: per GPU model a node type (buddy halves inside), a rack type, VCs by node."""
    by_model: dict[str, list[dict]] = defaultdict(list)
    for row in machines:
        by_model[row["gpu_type"]].append(row)
    skus, cell_types, physical = {}, {}, []
    vcs: dict[str, list[dict]] = {f"vc{i:02d}": [] for i in range(VC_COUNT)}
    for model in sorted(by_model):
        rows = by_model[model]
        gpus = int(rows[0]["cap_gpu"])
        cpu = min(int(r["cap_cpu"]) // int(r["cap_gpu"]) for r in rows)
        memory_gb = min(int(r["cap_mem"]) // int(r["cap_gpu"]) for r in rows)
        skus[model] = {"gpu": 1, "cpu": cpu, "memory": f"{memory_gb}Gi"}
        child, size = model, 1
        while size * 2 < gpus:  # buddy levels inside the node: 2-GPU, 4-GPU, ...
            name = f"{model}-{size * 2}GPU"
            cell_types[name] = {"childCellType": child, "childCellNumber": 2}
            child, size = name, size * 2
        node_type = f"{model}-NODE"
        cell_types[node_type] = {"childCellType": child, "childCellNumber": gpus // size, "isNodeLevel": True}
        rack_nodes = RACK_NODES.get(gpus, 4)
        rack_type = f"{model}-RACK"
        cell_types[rack_type] = {"childCellType": node_type, "childCellNumber": rack_nodes}
        racks, loose = divmod(len(rows), rack_nodes)
        names = [r["machine"] for r in rows]
        for rack in range(racks):
            physical.append({"cellType": rack_type, "cellChildren": [
                {"cellAddress": name} for name in names[rack * rack_nodes:(rack + 1) * rack_nodes]]})
        for name in names[racks * rack_nodes:]:
            physical.append({"cellType": node_type, "cellAddress": name})
        # Split the rack nodes and the loose nodes of this model over the VCs.
        for _chain, count, path in ((rack_type, racks * rack_nodes, f"{rack_type}.{node_type}"),
                                   (node_type, loose, node_type)):
            share, extra = divmod(count, VC_COUNT)
            for index, vc in enumerate(vcs):
                number = share + (1 if index < extra else 0)
                if number:
                    vcs[vc].append({"cellType": path, "cellNumber": number})
    return {
        "physicalCluster": {"skuTypes": skus, "cellTypes": cell_types, "physicalCells": physical},
        "virtualClusters": {vc: {"virtualCells": cells} for vc, cells in vcs.items()},
    }


SHAPES = [  # (weight, instances, gpus per instance)
    (50, 1, 1), (12, 1, 2), (8, 2, 1), (8, 1, 4), (6, 1, 8), (5, 2, 4), (4, 4, 2), (4, 2, 8), (2, 4, 8), (1, 8, 8),
]
PRIORITIES = [(5, 120), (35, 100), (40, 10), (20, -1)]


def pick(rng: random.Random, table: list[tuple]) -> tuple:
    total = sum(row[0] for row in table)
    point = rng.uniform(0, total)
    for row in table:
        point -= row[0]
        if point <= 0:
            return row
    return table[-1]


def make_job(rng: random.Random, number: int, skus: dict[str, tuple[int, int]], vc_names: list[str]) -> JobSpec:
    """skus: model -> (GPUs per node, GPUs in the cluster); a named sku is drawn in proportion to its GPUs."""
    _, instances, gpus = pick(rng, SHAPES)
    sku = pick(rng, [(total, model) for model, (_, total) in skus.items()])[1] if rng.random() < 0.7 else None
    max_gpus = min(per_node for per_node, _ in skus.values()) if sku is None else skus[sku][0]
    gpus = min(gpus, max_gpus)
    _, priority = pick(rng, PRIORITIES)
    return JobSpec(
        name=f"job{number}", user=f"user{number % 97}", virtualCluster=rng.choice(vc_names),
        priority=priority, priorityClass={120: "crit", 100: "prod", 10: "test", -1: "oppo"}[priority],
        skuType=sku, gangAllocation=rng.random() < 0.9, lazyPreemptionEnable=rng.random() < 0.2,
        taskRoles=[TaskRole(name="worker", instances=instances,
                            resources=Resources(gpu=gpus, cpu=gpus * 2, memoryMB=gpus * 4096))],
    )


def run(jobs: int, seed: int, data: Path, load: float = 0.8, long_queue: int = 0) -> dict:
    machines = read_machines(data)
    config = load_cluster_config(cluster_config(machines))
    skus: dict[str, tuple[int, int]] = {}
    for row in machines:
        per_node, total = skus.get(row["gpu_type"], (int(row["cap_gpu"]), 0))
        skus[row["gpu_type"]] = (per_node, total + int(row["cap_gpu"]))
    total_gpus = sum(total for _, total in skus.values())
    rng = random.Random(seed)
    now = [0.0]
    core = SchedulerCore(config, clock=lambda: now[0])
    vc_names = list(config.virtualClusters)
    specs = [make_job(rng, number, skus, vc_names) for number in range(jobs)]
    mean_runtime = 3600.0
    runtimes = [rng.expovariate(1 / mean_runtime) for _ in specs]
    # Offered load: arrivals per second = load * GPUs / (mean GPU-seconds asked per job).
    mean_gpu_seconds = statistics.mean(
        spec.taskRoles[0].instances * spec.taskRoles[0].resources.gpu * runtime
        for spec, runtime in zip(specs, runtimes, strict=True))
    arrival_rate = load * total_gpus / mean_gpu_seconds
    events: list[tuple[float, int, str, str, int]] = []
    by_id: dict[str, JobSpec] = {}
    runtime: dict[str, float] = {}
    long_vc = vc_names[0]
    for number in range(long_queue):
        spec = make_job(rng, jobs + number, skus, [long_vc])
        if spec.priority < 0:
            spec = msgspec.structs.replace(spec, priority=10, priorityClass="test")
        job_id = f"{spec.user}~{spec.name}"
        by_id[job_id] = spec
        runtime[job_id] = rng.expovariate(1 / mean_runtime)
        core.handle(Submit(job=job_id, attempt=0, spec=spec))
    arrival = 0.0
    for number, (spec, seconds) in enumerate(zip(specs, runtimes, strict=True)):
        arrival += rng.expovariate(arrival_rate)
        job_id = f"{spec.user}~{spec.name}"
        by_id[job_id] = spec
        runtime[job_id] = seconds
        events.append((arrival, number, "submit", job_id, 0))
    last_arrival = arrival
    # The cell tree and the pre-generated workload live for the whole run: keep them out of the
    # cyclic GC's full scans (a service does the same with its cell tree after start-up).
    gc.collect()
    gc.freeze()
    sequence = len(events)
    heapq.heapify(events)
    latencies: list[float] = []
    queue_lengths: list[int] = []
    long_lengths: list[int] = []
    counts: dict[str, int] = defaultdict(int)
    busy = 0.0
    held_gpus: dict[tuple[str, int], int] = {}
    busy_gpus = 0
    gpu_seconds = 0.0
    last_time = 0.0
    while events:
        at, _, kind, job_id, attempt = heapq.heappop(events)
        if last_time < last_arrival:
            gpu_seconds += busy_gpus * (min(at, last_arrival) - last_time)
        last_time = now[0] = at
        if kind == "submit":
            event = Submit(job=job_id, attempt=attempt, spec=by_id[job_id])
        else:
            busy_gpus -= held_gpus.pop((job_id, attempt), 0)
            event = Release(job=job_id, attempt=attempt, requeue=kind == "preempted")
        queue_lengths.append(core.queued_count())
        if long_queue:
            long_lengths.append(core.queued_count(long_vc))
        started = time.perf_counter()
        decisions = core.handle(event)
        elapsed = time.perf_counter() - started
        busy += elapsed
        latencies.append(elapsed)
        counts["events"] += 1
        for decision in decisions:
            counts["decisions"] += 1
            if isinstance(decision, Place):
                counts["placements"] += 1
                gpus = sum(len(task.gpus) for task in decision.tasks)
                held_gpus[(decision.job, decision.attempt)] = held_gpus.get((decision.job, decision.attempt), 0) + gpus
                busy_gpus += gpus
                if not decision.partial:
                    heapq.heappush(events, (at + runtime[decision.job], sequence, "finish", decision.job,
                                            decision.attempt))
                    sequence += 1
            elif isinstance(decision, Preempt):
                counts["preemptions"] += 1
                heapq.heappush(events, (at + 1.0, sequence, "preempted", decision.job, decision.attempt))
                sequence += 1
            elif isinstance(decision, Wait):
                counts["waits"] += 1
    latencies.sort()
    long_figures = {"long_queue_vc": long_vc, "long_queue_submitted": long_queue,
                    "long_vc_queue_min": min(long_lengths), "long_vc_queue_end": long_lengths[-1]} if long_queue else {}
    return {
        **long_figures,
        "decisions_per_second": round(counts["decisions"] / busy),
        "events_per_second": round(counts["events"] / busy),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
        "max_ms": round(latencies[-1] * 1000, 3),
        "jobs": jobs,
        "events": counts["events"],
        "decisions": counts["decisions"],
        "placements": counts["placements"],
        "preemptions": counts["preemptions"],
        "waits": counts["waits"],
        "offered_load": load,
        "gpu_utilisation": round(gpu_seconds / (total_gpus * last_arrival), 3),
        "mean_queue": round(statistics.mean(queue_lengths)),
        "max_queue": max(queue_lengths),
        "machines": len(machines),
        "gpus": total_gpus,
        "skus": len(config.skuTypes),
        "vcs": len(config.virtualClusters),
        "busy_seconds": round(busy, 2),
        "simulated_days": round(now[0] / 86400, 1),
        "machine_load_average": [round(x, 1) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="jobs in the stream (default 100,000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--load", type=float, default=0.8, help="offered GPU load (0.8 = 80%% of the GPUs)")
    parser.add_argument("--long-queue", type=int, default=0, metavar="N",
                        help="first N guaranteed jobs wait in one VC (issue 15: 10000); the stream defaults to 20,000 jobs")
    args = parser.parse_args()
    jobs = args.jobs if args.jobs is not None else (20_000 if args.long_queue else 100_000)
    if not args.data.exists():
        sys.exit(f"machine list not found: {args.data} (the Alibaba PAI trace lives in "
                 f"shared/data/traces/pai_machine_spec.csv; pass --data PATH)")
    print(json.dumps(run(jobs, args.seed, args.data, args.load, args.long_queue), indent=2))


if __name__ == "__main__":
    main()
