"""Submit-to-RUNNING latency of a one-task job on an idle local cluster.

Starts the whole platform (nats-server and the five services as processes) in a
temporary directory, submits one-task jobs one after another over HTTP, and
reads each job's `appLaunchedTime - createdTime` (the launcher's RUNNING time
minus rest's intake time, both in milliseconds). Prints JSON.

    python benchmarks/submit_latency.py [--jobs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.jobs import trivial_job  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from cli.client import Client  # noqa: E402
from cli.up import Platform  # noqa: E402
from libs.common.config import load_config  # noqa: E402
from libs.common.natsserver import free_port  # noqa: E402


async def measure(client: Client, jobs: int) -> list[float]:
    latencies = []
    for n in range(jobs):
        name = f"latency-{n}"
        await client.request("POST", "/api/v2/jobs", data=trivial_job(name), content_type="text/yaml")
        while True:
            status = (await client.request("GET", f"/api/v2/jobs/admin~{name}"))["jobStatus"]
            if status["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            await asyncio.sleep(0.02)
        latencies.append(status["appLaunchedTime"] - status["createdTime"])
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ports = {f"{s}_port": free_port() for s in ("rest", "scheduler", "launcher", "runtime", "monitor")}
        config = load_config(env={}, data_dir=tmp, nats_url=f"nats://127.0.0.1:{free_port()}", **ports)
        platform = Platform(config, print_fn=lambda *_: None)
        try:
            started = time.monotonic()
            conn = platform.start()
            startup = time.monotonic() - started
            latencies = asyncio.run(measure(Client(conn), args.jobs))
        finally:
            platform.stop()
    print(json.dumps({
        "benchmark": "submit_to_running_latency",
        "jobs": len(latencies),
        "unit": "ms",
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "mean_ms": round(statistics.mean(latencies), 1),
        "max_ms": max(latencies),
        "platform_startup_s": round(startup, 2),
        "target_p50_ms": 100,
    }))


if __name__ == "__main__":
    main()
