"""What the monitor costs in CPU, printed as JSON.

    python benchmarks/monitor_overhead.py [--jobs 10000] [--rounds 20]

Alert part (`measure_alerts`): CPU seconds of one evaluation of every shipped
alert rule (services/monitor/alerts/default_rules.yaml) over a cluster of
`jobs` jobs on jobs/8 nodes of 8 GPUs, with an hour of GPU readings (one a
minute) behind the low-utilisation rule. The first evaluation (every alert
fires at once) and the steady state (nothing changes) are reported apart, and
the steady state as a share of one core at the default evaluation period.

Node-sample part (`measure_node_sample`): CPU seconds of one sample of this
machine by the node agent, and its share of one core at one sample every
`node_sample_seconds` (target: under 1%). `ALERT_BENCH` is the alert part.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.common.config import Config  # noqa: E402
from libs.common.ids import EventId, JobId, NodeName, VcName  # noqa: E402
from libs.common.messages import (  # noqa: E402
    ExitSpec,
    JobPlaced,
    JobState,
    JobStateChanged,
    JobSubmitted,
    JobWaiting,
    TaskPlacement,
)
from libs.common.protocol.model import JobSpec  # noqa: E402
from services.monitor.alerts.core import AlertCore, NodeReading  # noqa: E402
from services.monitor.alerts.rules import load_rules_text  # noqa: E402

DEFAULT_RULES = Path(__file__).resolve().parents[1] / "services/monitor/alerts/default_rules.yaml"
GPUS_PER_NODE = 8
HISTORY_SECONDS = 3600
SAMPLE_EVERY = 60


def build_cluster(jobs: int, now: float) -> AlertCore:
    """`jobs` jobs: 60% running on 8 GPUs of a node each (a third of them nearly
    idle), 30% waiting (some past the pending threshold), 10% failed."""
    core = AlertCore(load_rules_text(DEFAULT_RULES.read_text()))
    nodes = max(1, jobs // GPUS_PER_NODE)
    for t in range(int(now) - HISTORY_SECONDS, int(now) + 1, SAMPLE_EVERY):
        for n in range(nodes):
            idle = n % 3 == 0
            core.node_sampled(NodeReading(
                node=f"node-{n}", at=t, cpuPercent=40.0, memoryPercent=50.0, diskPercent=60.0,
                gpuUtilization={g: (2.0 if idle else 85.0) for g in range(GPUS_PER_NODE)},
            ))
    for i in range(jobs):
        job = f"user{i % 200}~job{i}"
        submitted_at = now - 2 * HISTORY_SECONDS
        core.handle(JobSubmitted(id=EventId(f"{job}/s"), job=JobId(job), at=submitted_at,
                                 spec=JobSpec(name=f"job{i}", user=f"user{i % 200}", virtualCluster=f"vc{i % 8}")))
        kind = i % 10
        if kind < 6:
            node = f"node-{i % nodes}"
            core.handle(JobPlaced(id=EventId(f"{job}/p"), job=JobId(job), at=submitted_at, vc=VcName(f"vc{i % 8}"),
                                  attempt=1, tasks=[TaskPlacement(role="main", index=0, node=NodeName(node),
                                                                  gpus=list(range(GPUS_PER_NODE)))]))
            core.handle(_state(job, i, JobState.RUNNING, submitted_at + 60))
        elif kind < 9:
            core.handle(JobWaiting(id=EventId(f"{job}/w"), job=JobId(job), vc=VcName(f"vc{i % 8}"), attempt=1,
                                   reason="VC is full: 0 of 8 GPUs free"))
        else:
            core.handle(_state(job, i, JobState.FAILED, now - 60,
                               spec=ExitSpec(code=1, phrase="UserError", reason="exited with 1")))
    return core


def _state(job: str, i: int, state: JobState, at: float, spec: ExitSpec | None = None) -> JobStateChanged:
    return JobStateChanged(id=EventId(f"{job}/{state}"), job=JobId(job), at=at, vc=VcName(f"vc{i % 8}"),
                           user=job.split("~")[0], attempt=1, state=state, exitSpec=spec)


def measure_alerts(jobs: int = 10_000, rounds: int = 20) -> dict:
    now = time.time()
    started = time.process_time()
    core = build_cluster(jobs, now)
    build_cpu = time.process_time() - started

    started = time.process_time()
    first = core.evaluate(now)
    first_cpu = time.process_time() - started

    steady: list[float] = []
    for r in range(1, rounds + 1):
        started = time.process_time()
        core.evaluate(now + r)
        steady.append(time.process_time() - started)
    steady.sort()
    median = steady[len(steady) // 2]
    period = Config().alert_evaluate_seconds
    return {
        "jobs": jobs,
        "nodes": max(1, jobs // GPUS_PER_NODE),
        "gpus": max(1, jobs // GPUS_PER_NODE) * GPUS_PER_NODE,
        "rules": len(core.rules.rules),
        "firing_alerts": sum(1 for a in core.alerts.values() if a.state.value == "firing"),
        "first_outputs": len(first),
        "setup_cpu_seconds": round(build_cpu, 3),
        "first_evaluation_cpu_seconds": round(first_cpu, 4),
        "evaluation_cpu_seconds_median": round(median, 4),
        "evaluation_cpu_seconds_max": round(steady[-1], 4),
        "evaluate_every_seconds": period,
        "share_of_one_core_percent": round(100 * median / period, 2),
    }


def measure_node_sample(samples: int = 60) -> dict:
    """The node agent's cost: CPU seconds of one sample of this machine (psutil, NVML,
    every process checked for a PAI task), turned into gauges and encoded for the
    `pai_nodes` bucket, as `agent.sample_forever` does. The first sample (which
    reads every process's environment once) is reported apart from the steady
    state; the share of one core is at the default sample period."""
    import psutil

    from services.monitor import metrics
    from services.monitor.core.samples import encode_node_sample
    from services.monitor.sampler import NodeSampler

    sampler = NodeSampler("bench", Path("."))
    sampler.open()
    try:
        def one() -> tuple[float, object]:
            started = time.process_time()
            sample = sampler.sample()
            metrics.record_node_sample(sample)
            encode_node_sample(sample)
            return time.process_time() - started, sample

        first_cpu, sample = one()
        steady = sorted(one()[0] for _ in range(samples))
    finally:
        sampler.close()
    median = steady[len(steady) // 2]
    period = Config().node_sample_seconds
    return {
        "processes_on_machine": len(psutil.pids()),
        "gpus": len(sample.gpus),
        "gpu_note": sample.gpuNote,
        "pai_tasks_seen": len(sample.tasks),
        "samples": samples,
        "first_sample_cpu_seconds": round(first_cpu, 4),
        "sample_cpu_seconds_median": round(median, 5),
        "sample_cpu_seconds_max": round(steady[-1], 5),
        "sample_every_seconds": period,
        "share_of_one_core_percent": round(100 * median / period, 3),
        "target_share_percent": 1.0,
    }


ALERT_BENCH = measure_alerts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    result: dict = {"alerts": ALERT_BENCH(args.jobs, args.rounds)}
    node_sample = globals().get("measure_node_sample")
    if callable(node_sample):
        result["node_sample"] = node_sample()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
