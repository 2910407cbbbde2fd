"""The web portal's calls with 10,000 jobs stored: what each page asks rest for, p50/p99
under a few concurrent browsers, and the bytes of the portal itself. Prints JSON.

Same set-up as benchmarks/api_load.py (nats-server and rest alone, jobs stored straight
into the buckets), then times: the page and its files (what a first visit downloads),
home's overview, one page of the job list (50 rows with the total, as the Jobs page
asks), the list filtered by state, a VC's queue, and the node samples of the Cluster page.
Each call's figures include rest's and nats-server's CPU time per request, as api_load.py's do.

    python benchmarks/portal_load.py [--stored 10000] [--clients 4] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession, TCPConnector  # noqa: E402

from benchmarks.api_load import (  # noqa: E402
    RestCpu,
    nats_with_stored_jobs,
    running_rest,
    summary,
    wait_for_index,
)

STATIC = ROOT / "services" / "rest" / "portal" / "static"


async def run(args) -> dict:
    async with nats_with_stored_jobs(args.stored, "portal-load") as stored:
        with running_rest(stored) as rest:
            base, headers = rest.base, rest.headers
            cpu = RestCpu(rest.proc.pid, stored.nats.pid)
            files = ["/"] + [f"/portal/{p.relative_to(STATIC).as_posix()}" for p in sorted(STATIC.rglob("*"))
                             if p.is_file() and p.name != "index.html"]
            async with ClientSession(connector=TCPConnector(limit=args.clients)) as session:
                await wait_for_index(session, base, headers, args.stored)
                began = time.perf_counter()
                size = 0
                for path in files:  # one first visit, file by file as a browser without cache
                    async with session.get(base + path) as resp:
                        size += len(await resp.read())
                first_visit_ms = (time.perf_counter() - began) * 1000
                figures = {}
                for label, path in (
                    ("home_overview", "/api/v2/portal/overview"),
                    ("jobs_page_50_with_total", "/api/v2/jobs?offset=0&limit=50&withTotalCount=true&order=createdTime,DESC"),
                    ("jobs_page_state_failed", "/api/v2/jobs?offset=0&limit=50&withTotalCount=true&state=FAILED"),
                    ("vc_queue_default", "/api/v2/portal/queue/default"),
                    ("cluster_utilization", "/api/v2/portal/utilization"),
                ):
                    calls = [("GET", base + path, None)] * args.calls
                    figures[label] = summary(*await cpu.drive(session, args.clients, calls, headers))
    return {
        "benchmark": "portal_load",
        "stored_jobs": args.stored,
        "clients": args.clients,
        "portal_files": len(files),
        "portal_bytes": size,
        "first_visit_files_ms": round(first_visit_ms, 1),
        **figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
