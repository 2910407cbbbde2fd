"""The Cluster page's reads for `--nodes` nodes: GET /api/v2/portal/utilization (each
node's latest sample from the monitor) and GET /api/v2/cluster/nodes (each node's
health), p50/p99 and the answer's size. Prints JSON.

Starts nats-server and rest alone (as `pai up` would, with rest's own NATS user), and
stores one sample per node in `pai_nodes` (8 GPUs and 2 tasks each, about the size a
real agent writes) and one health record per node in `pai_node_health`, straight into
the buckets as the monitor writes them; then times `--requests` calls of each route,
one at a time.

    python benchmarks/cluster_page.py [--nodes 1000] [--requests 30]
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

from aiohttp import ClientSession  # noqa: E402

from benchmarks.api_load import nats_with_stored_jobs, running_rest  # noqa: E402
from benchmarks.feeding import cpu_seconds  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from libs.common.bus import Bus  # noqa: E402
from libs.common.nodes import NodeHealthRecord, encode_health, node_key  # noqa: E402
from libs.common.subjects import Bucket  # noqa: E402
from services.monitor.core.samples import GpuSample, NodeSample, TaskGpuUsage, TaskUsage, encode_node_sample  # noqa: E402

WRITE_BATCH = 200


def sample(node: str, at: float) -> NodeSample:
    gpus = [GpuSample(index=g, uuid=f"GPU-{node}-{g}", minorNumber=g, name="NVIDIA H100 80GB HBM3",
                      utilizationGpuPercent=37.0 + g, utilizationMemoryPercent=12.0, memoryUsedBytes=20 << 30,
                      memoryTotalBytes=80 << 30, temperatureCelsius=51.0, powerWatts=312.5, performanceState=0)
            for g in range(8)]
    tasks = [TaskUsage(key=f"user{t}~job-{node}-{t}/worker/0", username=f"user{t}", jobName=f"user{t}~job-{node}-{t}",
                       roleName="worker", taskIndex="0", virtualCluster="default", cpuPercent=12.5,
                       memoryBytes=8 << 30, gpus=[TaskGpuUsage(minorNumber=str(t * 4 + g), gpuPercent=40.0, gpuMemPercent=25.0)
                                                 for g in range(4)])
             for t in range(2)]
    return NodeSample(node=node, at=at, cpuCount=96, cpuPercent=31.0, memoryUsedBytes=300 << 30,
                      memoryTotalBytes=1 << 40, load1=20.0, load5=19.0, load15=18.0, diskPath="/var/lib/pai",
                      diskUsedBytes=1 << 40, diskTotalBytes=4 << 40, gpus=gpus, tasks=tasks, agent=f"agent-{node}")


async def seed(bus: Bus, nodes: int) -> int:
    """Write the samples and health records; returns the bytes of samples stored."""
    now, stored = time.time(), 0
    for start in range(0, nodes, WRITE_BATCH):
        names = [f"node-{n:05d}" for n in range(start, min(nodes, start + WRITE_BATCH))]
        samples = {node_key(n): encode_node_sample(sample(n, now)) for n in names}
        stored += sum(len(v) for v in samples.values())
        await bus.kv_write_many(Bucket.NODES, samples)
        await bus.kv_write_many(Bucket.NODE_HEALTH, {
            node_key(n): encode_health(NodeHealthRecord(node=n, heard=True, lastHeard=now, since=now)) for n in names})
    return stored


async def time_route(session: ClientSession, url: str, headers: dict[str, str], requests: int, pid: int,
                     nats_pid: int, expect_nodes: int, count) -> dict:
    latencies, size = [], 0
    cpu_before, nats_before = cpu_seconds(pid), cpu_seconds(nats_pid)
    for _ in range(requests):
        began = time.perf_counter()
        async with session.get(url, headers=headers) as resp:
            body = await resp.read()
            assert resp.status == 200, (resp.status, body[:200])
        latencies.append((time.perf_counter() - began) * 1000)
        size = len(body)
    got = count(json.loads(body))
    assert got == expect_nodes, f"{url}: {got} nodes, {expect_nodes} expected"
    return {"p50_ms": round(percentile(latencies, 50), 1), "p99_ms": round(percentile(latencies, 99), 1),
            "answer_bytes": size,
            "rest_cpu_ms_per_request": round((cpu_seconds(pid) - cpu_before) * 1000 / requests, 1),
            "nats_cpu_ms_per_request": round((cpu_seconds(nats_pid) - nats_before) * 1000 / requests, 1)}


async def run(args) -> dict:
    async with nats_with_stored_jobs(0, "cluster-page") as stored:
        platform = await Bus.connect(stored.nats.url, name="cluster-page-seed", **stored.nats.login("platform"))
        try:
            sample_bytes = await seed(platform, args.nodes)
        finally:
            await platform.close()
        with running_rest(stored) as rest:
            async with ClientSession() as session:
                pids = (rest.proc.pid, stored.nats.pid)
                utilization = await time_route(session, f"{rest.base}/api/v2/portal/utilization", rest.headers,
                                               args.requests, *pids, args.nodes, lambda b: len(b["nodes"]))
                nodes = await time_route(session, f"{rest.base}/api/v2/cluster/nodes", rest.headers,
                                         args.requests, *pids, args.nodes, len)
    return {
        "benchmark": "cluster_page",
        "nodes": args.nodes,
        "samples_stored_bytes": sample_bytes,
        "portal_utilization": utilization,
        "cluster_nodes": nodes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
