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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession, TCPConnector  # noqa: E402

from benchmarks.api_load import RestCpu, seed, start_rest, summary, wait_for_index  # noqa: E402
from libs.common.bus import Bus  # noqa: E402
from libs.common.busauth import load_or_create_credentials  # noqa: E402
from libs.common.config import load_config  # noqa: E402
from libs.common.natsserver import NatsServer, free_port  # noqa: E402

STATIC = ROOT / "services" / "rest" / "portal" / "static"


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        credentials = load_or_create_credentials(data / "nats-credentials.json")
        nats_port = free_port()
        config = load_config(env={}, data_dir=str(data), nats_url=f"nats://127.0.0.1:{nats_port}",
                             rest_port=free_port(), rest_rate_limit_burst=10_000_000,
                             rest_rate_limit_per_second=10_000_000.0)
        with NatsServer(data / "nats", port=nats_port, auth=credentials, config_file=data / "nats-server.conf",
                        log_file=data / "nats.log") as nats:
            await asyncio.to_thread(nats.bootstrap)
            platform = await Bus.connect(nats.url, name="portal-load", **nats.login("platform"))
            await seed(platform, args.stored)
            rest = start_rest(config, credentials, data)
            try:
                token = config.token_path.read_text().strip()
                base = f"http://127.0.0.1:{config.rest_port}"
                headers = {"Authorization": f"Bearer {token}"}
                cpu = RestCpu(rest.pid, nats.pid)
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
            finally:
                rest.terminate()
                rest.wait(timeout=20)
            await platform.close()
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
