"""How fast the runtime explains a failed task: classifications per second and
latency percentiles, on 64 KiB log tails, with PAI's full default rule set.

Each exit carries a full 64 KiB tail: a long training log (progress lines,
warnings, metrics) ending in one of several realistic failures, plus exits that
only the platform explains and exits that no rule recognises (the slowest
path: every rule is tried). Prints one JSON object.

Latency is measured twice per call: wall-clock time, and the CPU time of the
classifying thread. On a busy machine the wall-clock tail shows the time the
process waited for a core (the load average is printed alongside); the CPU
time is the engine's own cost.

    python benchmarks/classify.py [--exits 3000] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stats import percentile  # noqa: E402
from libs.common.messages import TaskExited  # noqa: E402
from services.runtime.core import LOG_LIMIT_BYTES, RuleEngine, default_rules  # noqa: E402

TARGET_P99_MS = 2.0

# (exit code, platform reason, last lines of the log)
ENDINGS: list[tuple[int, str, str]] = [
    (
        1,
        "",
        "Traceback (most recent call last):\n  File \"/work/train.py\", line 212, in <module>\n"
        "    loss.backward()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 79.10 GiB of which 1.21 GiB is free.\n",
    ),
    (
        1,
        "",
        "Traceback (most recent call last):\n  File \"/work/train.py\", line 3, in <module>\n"
        "    import apex\nModuleNotFoundError: No module named 'apex'\n",
    ),
    (
        134,
        "",
        "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5021, OpType=ALLREDUCE, NumelIn=262144) ran for 600034 milliseconds before timing out.\n",
    ),
    (1, "", "  File \"/work/train.py\", line 88\n    if epoch > 3\n               ^\nSyntaxError: expected ':'\n"),
    (137, "", "/bin/bash: line 1:  4242 Killed                  python train.py --epochs 90\n"),
    (139, "", "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"),
    (137, "OOMKilled", "step 1200 loss 1.93\n"),
    (-1, "Preempted", "step 1300 loss 1.90\n"),
    (2, "", "epoch 3 done\nwriting summary\nValueError: something only this program knows about\n"),
    (1, "", "Epoch 12: val_acc=0.71\nexiting with an error nobody wrote a rule for\n"),
]

WORDS = "epoch step loss lr grad_norm throughput tokens/s samples data_time batch_time eta mem".split()


def training_log(rng: random.Random, size: int) -> str:
    lines: list[str] = []
    total = 0
    step = 0
    while total < size:
        step += 1
        kind = rng.random()
        if kind < 0.7:
            line = (
                f"2025-03-0{rng.randint(1, 9)} 12:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} INFO "
                f"[trainer] epoch={step // 500} step={step} loss={rng.uniform(0.5, 4):.4f} "
                f"lr={rng.uniform(1e-5, 1e-3):.2e} grad_norm={rng.uniform(0.1, 9):.3f} "
                f"tokens/s={rng.randint(9000, 15000)}"
            )
        elif kind < 0.85:
            done = rng.randint(0, 100)
            bar = "#" * (done // 5) + " " * (20 - done // 5)
            line = f"Epoch {step // 500}: {done}%|{bar}| {step}/{step + 99} [00:42<01:13, 2.31it/s]"
        elif kind < 0.95:
            line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16)))
        else:
            line = (
                "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:558: "
                "UserWarning: This DataLoader will create 16 worker processes"
            )
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


def make_exits(count: int, seed: int, distinct_logs: int = 97) -> list[TaskExited]:
    rng = random.Random(seed)
    # A pool of different training logs (a prime count, so each meets every ending).
    bodies = [training_log(rng, LOG_LIMIT_BYTES) for _ in range(min(count, distinct_logs))]
    exits = []
    for n in range(count):
        code, reason, ending = ENDINGS[n % len(ENDINGS)]
        body = bodies[n % len(bodies)]
        tail = (body + "\n" + ending)[-LOG_LIMIT_BYTES:]
        exits.append(
            TaskExited(
                id=f"bench~job/0/worker/{n}/0/exited",
                job="bench~job",
                vc="default",
                attempt=0,
                role="worker",
                index=n,
                exitCode=code,
                platformReason=reason,
                userLogTail=tail,
            )
        )
    return exits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exits", type=int, default=3000, help="classifications to time")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rules = default_rules()
    started = time.perf_counter()
    engine = RuleEngine(rules)
    build_ms = (time.perf_counter() - started) * 1000
    exits = make_exits(args.exits, args.seed)
    for exit in exits[: len(ENDINGS)]:  # warm the matcher's automaton cache
        engine.classify(exit)

    latencies_ms: list[float] = []
    cpu_ms: list[float] = []
    phrases: dict[str, int] = {}
    load_before = os.getloadavg()[0]
    wall_started = time.perf_counter()
    cpu_started = time.thread_time()
    for exit in exits:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        verdict = engine.classify(exit)
        c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
        latencies_ms.append((t1 - t0) / 1e6)
        cpu_ms.append((c1 - c0) / 1e6)
        phrases[verdict.spec.phrase] = phrases.get(verdict.spec.phrase, 0) + 1
    wall_s = time.perf_counter() - wall_started
    cpu_s = time.thread_time() - cpu_started

    latencies_ms.sort()
    cpu_ms.sort()
    p99 = percentile(latencies_ms, 99)
    cpu_p99 = percentile(cpu_ms, 99)
    print(
        json.dumps(
            {
                "benchmark": "runtime.classify",
                "rules": len(rules),
                "log_tail_bytes": LOG_LIMIT_BYTES,
                "classifications": len(exits),
                "per_second": round(len(exits) / wall_s, 1),
                "per_cpu_second": round(len(exits) / cpu_s, 1),
                "p50_ms": round(percentile(latencies_ms, 50), 4),
                "p99_ms": round(p99, 4),
                "max_ms": round(latencies_ms[-1], 4),
                "mean_ms": round(statistics.fmean(latencies_ms), 4),
                "cpu_p50_ms": round(percentile(cpu_ms, 50), 4),
                "cpu_p99_ms": round(cpu_p99, 4),
                "cpu_max_ms": round(cpu_ms[-1], 4),
                "engine_build_ms": round(build_ms, 2),
                "target_p99_ms": TARGET_P99_MS,
                "target_met": p99 < TARGET_P99_MS,
                "target_met_cpu": cpu_p99 < TARGET_P99_MS,
                "load_average_1m": round(load_before, 2),
                "cpus": os.cpu_count(),
                "verdicts": dict(sorted(phrases.items())),
                "python": platform.python_version(),
                "machine": platform.machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
