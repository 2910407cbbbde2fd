"""The chaos suite at full size: lost, duplicated and orphaned work while kill -9
hits every service and nats-server, as JSON figures.

Starts the whole platform (nats-server and the five services as processes, under
`pai up`'s own supervisor) in a temporary directory, submits jobs of mixed shapes
(single tasks, gangs, failing, retried, stopped, preempted) throughout while
killing a service or NATS every 1-2 s in a seeded random order, waits for every
accepted job to end, and counts what was lost, ran twice, was left running or
ended in the wrong state, with each part's recovery time (kill to ready again).
See tests/chaos/soak.py for the shapes and how each figure is counted.

    python benchmarks/chaos.py [--jobs 1000] [--kills 50] [--nats-kills 10] [--seed N]

The CI form (tests/chaos/test_soak.py) is 100 jobs, 12 kills, 2 of NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.harness import start_platform, stop_platform, task_writable_dir  # noqa: E402
from tests.chaos.soak import DEFAULT_SEED, run_soak  # noqa: E402


async def soak(jobs: int, kills: int, nats_kills: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        starts_dir = task_writable_dir(Path(tmp) / "starts")
        api = await start_platform(Path(tmp) / "pai")
        try:
            report = await run_soak(api, starts_dir, jobs=jobs, kills=kills, nats_kills=nats_kills, seed=seed)
        finally:
            await stop_platform(api)
    return {"benchmark": "chaos", "seed": seed, **report.figures()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--nats-kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(soak(args.jobs, args.kills, args.nats_kills, args.seed))))


if __name__ == "__main__":
    main()
