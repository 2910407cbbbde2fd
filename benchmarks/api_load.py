"""rest under load with 10,000 jobs stored: submissions accepted per second, and
GET of one job and of the job list (p50/p99) under concurrent clients. Prints JSON.

Starts nats-server and rest alone (as `pai up` would, with rest's own NATS user),
stores `--stored` jobs straight into the buckets (half of them with a launcher
status), then drives rest over HTTP with `--clients` concurrent clients. Each call's
figures include rest's CPU time per request (`rest_cpu_ms_per_request`), which a
busy machine disturbs far less than rates and latencies, and nats-server's
(`nats_cpu_ms_per_request`: what the request cost the bus). For
comparison it also times one list built by reading every key of the buckets
(what rest does while its index is still loading).

    python benchmarks/api_load.py [--stored 10000] [--clients 16] [--submits 500] [--gets 2000] [--lists 200]
                                  [--profile DIR]

`--profile DIR` records rest with py-spy (`pip install py-spy`) during the submit
and GET phases, as collapsed stacks (DIR/submit.txt, DIR/get_job.txt), to see where
a request's time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession, TCPConnector  # noqa: E402

from benchmarks.feeding import cpu_seconds  # noqa: E402
from benchmarks.jobs import trivial_job  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from libs.common import ids  # noqa: E402
from libs.common.bus import Bus  # noqa: E402
from libs.common.busauth import BusCredentials, load_or_create_credentials  # noqa: E402
from libs.common.config import Config, load_config  # noqa: E402
from libs.common.messages import JobState  # noqa: E402
from libs.common.natsserver import NatsServer, free_port  # noqa: E402
from libs.common.protocol import parse_job  # noqa: E402
from libs.common.records import JobRecord, encode_job_record  # noqa: E402
from libs.common.service import ServiceContext  # noqa: E402
from libs.common.subjects import Bucket  # noqa: E402
from services.rest.records import SubmittedJob  # noqa: E402

USERS = [f"user{n}" for n in range(20)]
READY_SECONDS = 60


async def seed(bus: Bus, count: int) -> None:
    """`count` submitted jobs over USERS; every other one has a launcher status."""
    template = parse_job(trivial_job("template"), content_type="text/yaml", user="user0")
    jobs_kv, status_kv = await bus.kv(Bucket.JOBS), await bus.kv(Bucket.JOB_STATUS)
    now = time.time()
    states = [JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED]

    async def one(n: int) -> None:
        user, name = USERS[n % len(USERS)], f"stored-{n}"
        jid = ids.job_id(user, name)
        spec = msgspec.structs.replace(template.spec, name=name, user=user)
        sub = SubmittedJob(job=jid, user=user, name=name, vc="default", spec=spec, config=template.config,
                           submittedAt=now - count + n, published=True, tags=["seeded"] if n % 7 == 0 else [])
        await jobs_kv.put(ids.job_key(jid), msgspec.json.encode(sub))
        if n % 2:
            record = JobRecord(job=jid, name=name, user=user, vc="default", spec=spec, state=states[n % 3],
                               createdTime=sub.submittedAt)
            await status_kv.put(ids.job_key(jid), encode_job_record(record))

    for start in range(0, count, 500):
        await asyncio.gather(*(one(n) for n in range(start, min(count, start + 500))))


def start_rest(config, credentials, data: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(config.to_env())
    env.update(credentials.env_for("rest"))
    env["PAI_DATA_DIR"] = str(data)
    env.pop("PAI_CONFIG", None)
    log = open(data / "rest.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "services.rest"], env=env, stdout=log, stderr=log, cwd=ROOT)
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rest exited with {proc.returncode}; see {data / 'rest.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{config.rest_port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("rest was not ready in time")


@dataclass
class StoredJobs:
    """A nats-server with jobs stored, and the config rest is to start with on it."""

    data: Path  # the temporary folder: the server's store, rest's data and logs
    credentials: BusCredentials
    config: Config
    nats: NatsServer
    seed_seconds: float


@contextlib.asynccontextmanager
async def nats_with_stored_jobs(count: int, name: str) -> AsyncIterator[StoredJobs]:
    """nats-server as `pai up` runs it (PAI's users, store bootstrapped) in a temporary
    folder, `count` jobs stored straight into its buckets (`seed`), and a config for
    rest on a free port with its rate limits out of the way. `name`: the platform
    connection's."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        credentials = load_or_create_credentials(data / "nats-credentials.json")
        nats_port = free_port()
        config = load_config(env={}, data_dir=str(data), nats_url=f"nats://127.0.0.1:{nats_port}",
                             rest_port=free_port(), rest_rate_limit_burst=10_000_000,
                             rest_rate_limit_per_second=10_000_000.0)
        with NatsServer(data / "nats", port=nats_port, auth=credentials, config_file=data / "nats-server.conf",
                        log_file=data / "nats.log") as nats:
            await asyncio.to_thread(nats.bootstrap)  # it runs its own event loop
            platform = await Bus.connect(nats.url, name=name, **nats.login("platform"))
            try:
                began = time.perf_counter()
                await seed(platform, count)
                yield StoredJobs(data=data, credentials=credentials, config=config, nats=nats,
                                 seed_seconds=time.perf_counter() - began)
            finally:
                await platform.close()


@dataclass
class RunningRest:
    proc: subprocess.Popen
    base: str  # http://127.0.0.1:{port}
    headers: dict[str, str]  # signed in as the admin


@contextlib.contextmanager
def running_rest(stored: StoredJobs) -> Iterator[RunningRest]:
    """rest as its own process on `stored`'s server (with rest's own NATS user), ready;
    terminated at the end."""
    proc = start_rest(stored.config, stored.credentials, stored.data)
    try:
        token = stored.config.token_path.read_text().strip()
        yield RunningRest(proc=proc, base=f"http://127.0.0.1:{stored.config.rest_port}",
                          headers={"Authorization": f"Bearer {token}"})
    finally:
        proc.terminate()
        proc.wait(timeout=20)


class RestCpu:
    """rest's and nats-server's CPU time per request over a phase: unlike rates and
    latencies, it hardly moves with what else the machine runs."""

    def __init__(self, pid: int, nats_pid: int):
        self.pid, self.nats_pid = pid, nats_pid

    async def drive(self, *args) -> tuple[list[float], float, dict[int, int], float, float]:
        before, nats_before = cpu_seconds(self.pid), cpu_seconds(self.nats_pid)
        latencies, wall, statuses = await drive(*args)
        count = max(1, len(latencies))
        return (latencies, wall, statuses, (cpu_seconds(self.pid) - before) * 1000 / count,
                (cpu_seconds(self.nats_pid) - nats_before) * 1000 / count)


async def drive(session: ClientSession, clients: int, requests: list[tuple[str, str, bytes | None]],
                headers: dict[str, str]) -> tuple[list[float], float, dict[int, int]]:
    """Run the requests with `clients` workers; (latencies ms, wall seconds, count per status)."""
    queue: asyncio.Queue = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def worker() -> None:
        while not queue.empty():
            method, url, body = queue.get_nowait()
            started = time.perf_counter()
            async with session.request(method, url, data=body, headers=headers) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
            latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return latencies, time.perf_counter() - began, statuses


def summary(latencies: list[float], wall: float, statuses: dict[int, int], rest_cpu_ms: float,
            nats_cpu_ms: float) -> dict:
    return {"requests": len(latencies), "per_second": round(len(latencies) / wall, 1),
            "p50_ms": round(percentile(latencies, 50), 2), "p99_ms": round(percentile(latencies, 99), 2),
            "rest_cpu_ms_per_request": round(rest_cpu_ms, 2), "nats_cpu_ms_per_request": round(nats_cpu_ms, 2),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}}


@contextlib.contextmanager
def profiled(pid: int, out: Path | None, phase: str):
    """py-spy recording `pid` while the block runs (nothing when `out` is None)."""
    if out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
                            "--output", str(out / f"{phase}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})
    time.sleep(0.5)  # attached before the phase starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=30)


async def wait_for_index(session: ClientSession, base: str, headers: dict[str, str], stored: int) -> float:
    """Seconds until the list shows every stored job (rest's index loaded)."""
    began = time.perf_counter()
    while time.perf_counter() - began < 120:
        # Every job here is a stored one (a keyword's total would be capped past 1,000).
        async with session.get(f"{base}/api/v2/jobs?limit=1", headers=headers) as resp:
            if int(resp.headers.get("X-Total-Count", 0)) >= stored:
                return time.perf_counter() - began
        await asyncio.sleep(0.2)
    raise RuntimeError("the job list never showed every stored job")


async def run(args) -> dict:
    async with nats_with_stored_jobs(args.stored, "api-load") as stored:
        nats, config = stored.nats, stored.config

        # What a list costs without the index: read every key of the three buckets.
        rest_bus = await Bus.connect(nats.url, name="api-load-direct", **nats.login("rest"))
        from services.rest import jobs_api

        began = time.perf_counter()
        rows = await jobs_api._rows_from_buckets(ServiceContext(name="rest", config=config, bus=rest_bus),
                                                 jobs_api.parse_list_query({}))
        direct_ms = (time.perf_counter() - began) * 1000
        assert len(rows) == args.stored
        await rest_bus.close()

        with running_rest(stored) as rest:
            base, headers = rest.base, rest.headers
            cpu = RestCpu(rest.proc.pid, nats.pid)
            async with ClientSession(connector=TCPConnector(limit=args.clients)) as session:
                index_seconds = await wait_for_index(session, base, headers, args.stored)
                post_headers = {**headers, "Content-Type": "text/yaml"}
                submits = [("POST", f"{base}/api/v2/jobs", trivial_job(f"load-{n}"))
                           for n in range(args.submits)]
                with profiled(rest.proc.pid, args.profile, "submit"):
                    submitted = summary(*await cpu.drive(session, args.clients, submits, post_headers))
                rng = random.Random(1)
                gets = [("GET", f"{base}/api/v2/jobs/{USERS[n % len(USERS)]}~stored-{n}", None)
                        for n in (rng.randrange(args.stored) for _ in range(args.gets))]
                with profiled(rest.proc.pid, args.profile, "get_job"):
                    got = summary(*await cpu.drive(session, args.clients, gets, headers))
                # Baselines: a public call (no token, no NATS) and a signed-in call reading one key.
                info = summary(*await cpu.drive(session, args.clients,
                                            [("GET", f"{base}/api/v2/info", None)] * args.gets, {}))
                one_key = summary(*await cpu.drive(session, args.clients,
                                               [("GET", f"{base}/api/v2/virtual-clusters", None)] * args.gets,
                                               headers))
                lists = {}
                for label, query in (("list_limit_20", "limit=20"), ("list_one_user_limit_100", "username=user3&limit=100"),
                                     ("list_keyword_tag_ordered", "keyword=stored-1&tags=seeded&order=name,ASC&limit=50"),
                                     ("list_default_limit_1000", "")):
                    calls = [("GET", f"{base}/api/v2/jobs?{query}", None)] * args.lists
                    lists[label] = summary(*await cpu.drive(session, args.clients, calls, headers))
    return {
        "benchmark": "api_load",
        "stored_jobs": args.stored,
        "clients": args.clients,
        "seed_seconds": round(stored.seed_seconds, 1),
        "index_loaded_seconds": round(index_seconds, 2),
        "list_by_reading_every_key_ms": round(direct_ms, 1),
        "submit": submitted,
        "get_job": got,
        "get_info_public_no_bus": info,
        "get_virtual_clusters_signed_in_one_key": one_key,
        **lists,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--submits", type=int, default=500)
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--lists", type=int, default=200)
    parser.add_argument("--profile", type=Path, default=None, help="record rest with py-spy into this folder")
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
