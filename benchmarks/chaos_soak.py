"""Lost and duplicated work under kill -9: the chaos soak, as JSON figures.

Starts the whole platform (nats-server and the five services as processes) in a
temporary directory, submits small jobs (some with three tasks) while killing a
service every 1-2 s in a seeded random order (each restarted as `pai up`'s
supervisor would), waits for every accepted job to end, and counts what was lost
or ran twice (see tests/chaos/soak.py for how). Prints JSON.

    python benchmarks/chaos_soak.py [--jobs 30] [--kills 5] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.harness import start_platform, stop_platform  # noqa: E402
from tests.chaos.soak import DEFAULT_JOBS, DEFAULT_KILLS, DEFAULT_SEED, run_soak  # noqa: E402


async def soak(jobs: int, kills: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        starts_dir = Path(tmp) / "starts"
        starts_dir.mkdir()
        api = await start_platform(Path(tmp) / "pai")
        try:
            report = await run_soak(api, starts_dir, jobs=jobs, kills=kills, seed=seed)
        finally:
            await stop_platform(api)
    return {"benchmark": "chaos_soak", "seed": seed, **report.figures()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--kills", type=int, default=DEFAULT_KILLS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(soak(args.jobs, args.kills, args.seed))))


if __name__ == "__main__":
    main()
