"""Job state events delivered to many open event streams (GET /api/v2/events): the delay
from publish to arrival at each watcher, p50/p99, with `--watchers` streams open and
`--rate` events a second; and submissions a second meanwhile, against the same rest
with no stream open. Prints JSON.

Starts nats-server and rest alone (as `pai up` would, with rest's own NATS user),
creates `--users` users, opens `--watchers` streams spread evenly over them, then
publishes job state events (as the launcher does, logged in as `launcher`) for jobs
of random users at `--rate` a second for `--seconds`, each stamped with its publish
time. Each watcher notes when each event arrives; every event must reach each of its
user's streams once (the JSON says how many were missing or repeated). Meanwhile
`--submitters` clients submit jobs as fast as rest accepts them; the same is measured
before any stream is opened, for comparison. Everything is on loopback.

    python benchmarks/sse_watchers.py [--watchers 1000] [--users 100] [--rate 100] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession, ClientTimeout, TCPConnector  # noqa: E402

from benchmarks.api_load import nats_with_stored_jobs, running_rest  # noqa: E402
from benchmarks.feeding import cpu_seconds  # noqa: E402
from benchmarks.jobs import trivial_job  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from libs.common.bus import Bus  # noqa: E402
from libs.common.messages import JobState, JobStateChanged  # noqa: E402
from services.rest import auth  # noqa: E402

SETTLE_SECONDS = 3.0  # after the last publish, for the last deliveries
OPEN_IN_FLIGHT = 50


class Watcher:
    def __init__(self, user: str):
        self.user = user
        self.arrivals: dict[str, list[float]] = {}  # event id (job/state) -> arrival times
        self.delays: list[float] = []

    async def watch(self, session: ClientSession, url: str, token: str, opened: asyncio.Event) -> None:
        async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200, resp.status
            opened.set()
            async for line in resp.content:
                if line.startswith(b"data: "):
                    now = time.time()
                    data = json.loads(line[6:])
                    key = f"{data['job']}/{data['state']}"
                    self.arrivals.setdefault(key, []).append(now)
                    self.delays.append(now * 1000 - data["time"])


async def submit_rate(session: ClientSession, base: str, token: str, clients: int, seconds: float) -> dict:
    """Submissions accepted a second by `clients` submitting back to back for `seconds`."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"}
    counter = iter(range(10**9))
    run = f"{time.monotonic_ns() % 10**8}"
    accepted = 0
    refused: dict[str, int] = {}  # by HTTP status
    deadline = time.monotonic() + seconds

    async def client() -> None:
        nonlocal accepted
        while time.monotonic() < deadline:
            async with session.post(f"{base}/api/v2/jobs", data=trivial_job(f"sse-{run}-{next(counter)}"),
                                    headers=headers) as resp:
                await resp.read()
                if resp.status in (200, 201, 202):
                    accepted += 1
                else:
                    refused[str(resp.status)] = refused.get(str(resp.status), 0) + 1

    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"per_second": round(accepted / (time.monotonic() - began), 1), "refused": sum(refused.values()),
            "refused_by_status": refused}


async def publish(bus: Bus, users: list[str], rate: float, seconds: float) -> list[JobStateChanged]:
    """Job state events at `rate` a second, each job through WAITING, RUNNING, SUCCEEDED."""
    rng = random.Random(7)
    states = (JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED)
    sent: list[JobStateChanged] = []
    began = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - began) < seconds:
        due = int(elapsed * rate) + 1
        while n < due:
            job, step = n // 3, n % 3
            user = users[rng.randrange(len(users))] if step == 0 else sent[-step].user
            name = f"{user}~bench{job}"
            event = JobStateChanged(id=f"{name}/1/state/{states[step].value}", job=name, vc="default", user=user,
                                    attempt=1, state=states[step], previous=states[step - 1] if step else None,
                                    at=time.time())
            await bus.publish(event)
            sent.append(event)
            n += 1
        await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
    return sent


async def run(args) -> dict:
    async with nats_with_stored_jobs(0, "sse-watchers") as stored:
        nats = stored.nats
        platform = await Bus.connect(nats.url, name="sse-bench-platform", **nats.login("platform"))
        launcher = await Bus.connect(nats.url, name="sse-bench-launcher", **nats.login("launcher"))
        users = [f"watcher{n}" for n in range(args.users)]
        tokens = {user: await auth.create_user(platform, user) for user in users}
        try:
            with running_rest(stored) as rest:
                timeout = ClientTimeout(total=None, sock_read=None)
                async with ClientSession(timeout=timeout, connector=TCPConnector(limit=0)) as session:
                    alone = await submit_rate(session, rest.base, tokens[users[0]], args.submitters, args.submit_seconds)
                    watchers = [Watcher(users[n % len(users)]) for n in range(args.watchers)]
                    url = f"{rest.base}/api/v2/events"
                    opening = asyncio.Semaphore(OPEN_IN_FLIGHT)

                    async def start(watcher: Watcher) -> asyncio.Task:
                        async with opening:
                            opened = asyncio.Event()
                            task = asyncio.create_task(watcher.watch(session, url, tokens[watcher.user], opened))
                            await opened.wait()
                            return task

                    began = time.monotonic()
                    tasks = await asyncio.gather(*(start(w) for w in watchers))
                    open_seconds = time.monotonic() - began
                    cpu_before, nats_before = cpu_seconds(rest.proc.pid), cpu_seconds(nats.pid)
                    publishing = asyncio.create_task(publish(launcher, users, args.rate, args.seconds))
                    # Another user than the first phase's: each phase has the whole of a user's
                    # stored-jobs quota (rest_user_max_jobs), so neither measures its 507s.
                    watched = await submit_rate(session, rest.base, tokens[users[1 % len(users)]], args.submitters,
                                                min(args.submit_seconds, args.seconds))
                    sent = await publishing
                    await asyncio.sleep(SETTLE_SECONDS)
                    rest_cpu = cpu_seconds(rest.proc.pid) - cpu_before
                    nats_cpu = cpu_seconds(nats.pid) - nats_before
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await launcher.close()
            await platform.close()
    delays = [d for w in watchers for d in w.delays]
    expected = missing = repeated = 0
    for watcher in watchers:
        for event in sent:
            if event.user != watcher.user:
                continue
            expected += 1
            got = len(watcher.arrivals.get(f"{event.job}/{event.state.value}", []))
            missing += got == 0
            repeated += max(0, got - 1)
    wall = args.seconds + SETTLE_SECONDS
    return {
        "benchmark": "sse_watchers",
        "watchers": args.watchers,
        "users": args.users,
        "events_published": len(sent),
        "events_per_second": round(len(sent) / args.seconds, 1),
        "deliveries_expected": expected,
        "deliveries_missing": missing,
        "deliveries_repeated": repeated,
        "open_watchers_seconds": round(open_seconds, 2),
        "delivery_latency_ms": {"p50": round(percentile(delays, 50) or 0, 1),
                                "p99": round(percentile(delays, 99) or 0, 1),
                                "max": round(max(delays, default=0), 1)},
        "submissions_per_second_no_watchers": alone,
        "submissions_per_second_while_watched": watched,
        "rest_cpu_percent_while_watched": round(100 * rest_cpu / wall, 1),
        "nats_cpu_percent_while_watched": round(100 * nats_cpu / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rate", type=float, default=100.0, help="job state events a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--submit-seconds", type=float, default=5.0)
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
