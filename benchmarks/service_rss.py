"""Each service's memory against the number of finished jobs it has seen: live work only.

A finished job's live records, and every service's in-memory copies of them, leave
once the history database holds the job and it is past `live_finished_job_max` or
`live_finished_job_seconds` (services/rest/history/expiry.py; the launcher's once its
logs are pruned too, `retention_finished_seconds`). So a service's resident memory
should not grow with the jobs it has run. This measures it on the whole platform as
`pai up` runs it (cli/up.py's Platform: nats-server and the five services as
processes, in a temporary data dir on free ports, one node of 64 one-CPU cells):

1. a warm-up burst of `--warmup` trivial jobs (imports, caches, pools reach their
   working size), then every process's RSS (/proc/<pid>/status VmRSS, and RssAnon:
   the heap, without mapped files): the base;
2. bursts of trivial jobs (`true`, 16 clients) up to each total of `--totals`
   (cumulative), each waited for until every job SUCCEEDED, then until pai_jobs holds
   no more than the bound (the history's projection has applied every job's end and the
   sweep archived the excess; `--catch-up-timeout`, whether and when it got there is
   reported); then every process's RSS;
3. after the last burst (after each with `--restart-each`), each service is restarted
   (SIGTERM, started again, timed to /readyz), then nats-server (SIGTERM, started
   again, timed until it answers), and every process's RSS read 10 s after all are
   ready: what a restart rebuilds from the live records.

Reported per process, in MiB per 1,000 finished jobs (the target: at most 1):
`running`, the least-squares slope of RSS over the points (`running_anon`: of RssAnon;
`running_last_burst`: over the last burst alone, where caches that fill once have filled);
`after_restart`, the slope from the base to the RSS after the restart(s). And each
process's restart-to-ready seconds; per point, the live finished jobs the history
counts (not archived), and per live bucket its keys with a value and the messages its
stream holds (the markers of deleted or purged keys count until they expire).
For nats-server also `live_heap`: the slope of its Go heap still live after each
collection (`nats_live_heap_mib` per point, from the gctrace lines GODEBUG=gctrace=1
puts in its log), which its RSS follows at up to twice that.

Every service's and nats-server's memory of finished jobs is bounded by time windows,
not by the history (docs/deploy.md, "Sizing the services"): a burst run in minutes
puts every job inside all of them. `--set nats_events_max_age_seconds=120 --set
nats_events_duplicate_window_seconds=60` shortens nats-server's so that the run
passes them, as months of history pass the week the event stream keeps.

One admin token submits every job, so rest's rate limit and the per-user stored-jobs
quotas are lifted: a burst is taken faster than it runs, and its queue alone would pass
the 10,000 jobs a user may keep (`rest_user_max_jobs`).

The platform runs with a small bound so that archiving happens during the run:
`--live-max` (default 500) finished jobs, `--live-seconds` (default 10),
`--sweep-seconds` (default 1), and the launcher's log retention `--retention-seconds`
(default 10; its record of an archived job leaves with its logs).

    python benchmarks/service_rss.py [--totals 5000,10000,20000] [--warmup 1000] [--clients 16]
                                     [--live-max 500] [--live-seconds 10] [--sweep-seconds 1]
                                     [--retention-seconds 10] [--restart-each] [--timeout 1800]
                                     [--data-dir DIR] [--history-db COPY.sqlite] [--no-restart]
                                     [--profile-restart DIR]

A service that exits during the run (e.g. a leader that could not renew its lease in
time on an overloaded machine, which stops by design) is started again as `pai up`
would, and listed in `exited_and_started_again`.

`--history-db` runs the platform on an existing history database (a copy: it is
written), so the restarts are timed with that much history, e.g. the 1M-job database of
`benchmarks/history_scale.py --jobs 1000000 --db` with its jobs marked archived (a
platform that ran them would have archived them): `sqlite3 COPY "UPDATE jobs SET
archived_at = completed_at"`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession, ClientTimeout, TCPConnector  # noqa: E402

from benchmarks.e2e_throughput import Api, Submitter, git_commit, projector_of, slots64_cluster_file  # noqa: E402
from benchmarks.stats import filesystem_of  # noqa: E402
from cli.up import SERVICES, Platform  # noqa: E402
from libs.common.bus import Bus, all_keys  # noqa: E402
from libs.common.config import load_config  # noqa: E402
from libs.common.natsserver import free_port  # noqa: E402
from libs.common.subjects import STREAM, Bucket  # noqa: E402

POLL_SECONDS = 1.0
SETTLE_SECONDS = 3.0  # after the bound is reached: JobArchived consumed, retention swept
RESTARTED_SECONDS = 10.0  # after the restarts: every service has restored and reconnected
MEASURED = (*SERVICES, "nats-server")
LIVE_BUCKETS = (Bucket.JOBS, Bucket.JOB_STATUS, Bucket.SCHEDULE)


def rss_mib(pid: int, field: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 2)
    except OSError:
        return None
    return None


def pids(platform: Platform) -> dict[str, int]:
    found = {name: proc.pid for name, proc in platform.procs.items()}
    assert platform.nats is not None and platform.nats.pid is not None
    found["nats-server"] = platform.nats.pid
    projector = projector_of(found["rest"])  # rest's history projection process (projector.py)
    if projector is not None:
        found["rest_history"] = projector
    return found


def snapshot(platform: Platform, field: str = "VmRSS") -> dict[str, float | None]:
    return {name: rss_mib(pid, field) for name, pid in pids(platform).items()}


# nats-server runs with GODEBUG=gctrace=1 (set in main): each collection logs a line
# "gc N @Ts P%: ... A->B->C MB, D MB goal, ...", C the heap still live after it.
GC_LINE = re.compile(r"^gc \d+ @[\d.]+s .*?\d+->\d+->(\d+) MB, \d+ MB goal", re.M)


def nats_live_heap_mib(platform: Platform) -> int | None:
    """nats-server's live heap after its last collection: what it holds, as against its
    RSS, which Go lets reach twice that (GOGC=100) and returns to the machine slowly."""
    try:
        text = (platform.logs / "nats.log").read_text(errors="replace")
    except OSError:
        return None
    found = GC_LINE.findall(text[-200_000:])
    return int(found[-1]) if found else None


def slope_per_1000(points: list[tuple[int, float | None]]) -> float | None:
    """Least-squares slope of RSS (MiB) over finished jobs, per 1,000 jobs."""
    xs = [x for x, y in points if y is not None]
    ys = [y for _, y in points if y is not None]
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return round(1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 3)


def load() -> list[float]:
    """The machine's load average (1, 5, 15 min): beside each figure, as the machine is shared."""
    return [round(x, 1) for x in os.getloadavg()]


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used: what its start cost, whatever the load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def history_file(platform: Platform) -> Path | None:
    dsn = platform.config.history_dsn
    if dsn.startswith("sqlite"):
        return Path(dsn.split(":///", 1)[1])
    found = list(platform.data.rglob("history.sqlite"))
    return found[0] if found else None


def live_finished(platform: Platform) -> int | None:
    """Finished jobs the history holds whose live records are not archived yet."""
    found = history_file(platform)
    if found is None:
        return None
    with sqlite3.connect(f"file:{found}?mode=ro", uri=True, timeout=10) as db:
        return db.execute("SELECT count(*) FROM jobs WHERE archived_at IS NULL AND completed_at IS NOT NULL"
                          ).fetchone()[0]


def history_jobs(path: str | None) -> int | None:
    if path is None:
        return None
    with sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=10) as db:
        return db.execute("SELECT count(*) FROM jobs").fetchone()[0]


async def stream_state(bus: Bus, stream: str) -> dict[str, Any]:
    """What nats-server holds of a stream in memory as well as on disk: its messages,
    their subjects (an entry each in the server's subject index) and its interior
    deletes (numbers). JetStream's own API, as nats-py's StreamState has no subjects."""
    reply = await bus.nc.request(f"$JS.API.STREAM.INFO.{stream}", b"{}", timeout=10)
    state = json.loads(reply.data)["state"]
    return {"messages": state.get("messages", 0), "subjects": state.get("num_subjects", 0),
            "interior_deletes": state.get("num_deleted", 0), "bytes": state.get("bytes", 0)}


async def buckets(bus: Bus) -> dict[str, dict[str, int]]:
    """Per live bucket: its keys with a value, and what its stream holds (values and the
    markers of deleted or purged keys that have not expired); and the event stream."""
    out: dict[str, dict[str, Any]] = {}
    for bucket in LIVE_BUCKETS:
        out[bucket.value] = {"live_keys": len(await all_keys(await bus.kv(bucket))),
                             **await stream_state(bus, f"KV_{bucket.value}")}
    out[STREAM] = await stream_state(bus, STREAM)
    return out


def supervise(platform: Platform) -> None:
    """Start again what died, as `pai up` does (a leader that could not renew its lease in
    time stops by design), and say so: a point after it is not the same process's RSS."""
    for name in platform.restart_what_died():
        CRASHES.append({"process": name, "at": time.strftime("%H:%M:%S", time.gmtime()), "load": load()})
        print(json.dumps({"restarted_after_exit": CRASHES[-1]}), file=sys.stderr, flush=True)


CRASHES: list[dict[str, Any]] = []


async def burst(platform: Platform, api: Api, url: str, token: str, prefix: str, start: int, count: int,
                clients: int, deadline: float, before: int = 0) -> None:
    """Submit jobs prefix-start .. prefix-(start+count-1) with `clients` connections; wait
    until every job of the prefix SUCCEEDED."""
    names = iter(range(start, start + count))
    failures: list[str] = []

    async def worker() -> None:
        submitter = Submitter(url, token)
        try:
            for i in names:
                status, body = await submitter.submit(f"{prefix}-{i}")
                if status != 202:
                    failures.append(f"{status} {body}")
        finally:
            await submitter.close()

    await asyncio.gather(*(worker() for _ in range(clients)))
    if failures:
        raise RuntimeError(f"{len(failures)} submissions refused, e.g. {failures[0]}")
    # every job here is the admin's, each one of the prefix's (`before`: the admin's in a given history)
    while await api.count("SUCCEEDED") < before + start + count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every job of {prefix} SUCCEEDED in time")
        supervise(platform)
        await asyncio.sleep(POLL_SECONDS)


async def caught_up(platform: Platform, bus: Bus, bound: int, timeout: float) -> dict[str, Any]:
    """Wait (up to `timeout` s) until the platform holds no more live finished jobs than
    the bound: the history has applied every job's end (its projection lags under load;
    a job it has not applied cannot be archived) and the sweep has archived the excess,
    so pai_jobs holds at most `bound` keys. What was reached, and how long it took."""
    started = time.monotonic()
    while True:
        live = live_finished(platform)
        keys = len(await all_keys(await bus.kv(Bucket.JOBS)))
        waited = time.monotonic() - started
        if (live is not None and live <= bound and keys <= bound) or waited > timeout:
            await asyncio.sleep(SETTLE_SECONDS)
            return {"live_finished": live_finished(platform), "pai_jobs_keys": keys,
                    "caught_up": keys <= bound, "caught_up_in_s": round(waited, 1)}
        supervise(platform)
        await asyncio.sleep(POLL_SECONDS)


def restart_all(platform: Platform, profile_dir: Path | None = None) -> dict[str, float | None]:
    """Each service, then nats-server: stopped (SIGTERM) and started again; seconds to
    ready, the CPU seconds the new process had used by then (`<name>_cpu_s`: its start's
    work, which the machine's load does not stretch) and the 1-minute load (`<name>_load`)."""
    took: dict[str, float | None] = {}
    for name in SERVICES:
        platform.kill_service(name, signal.SIGTERM)
        started = time.monotonic()
        platform._spawn(name)
        spy = None
        if profile_dir is not None:  # its start as py-spy samples it (collapsed stacks), until ready
            spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid",
                                    str(platform.procs[name].pid), "--format", "raw", "--rate", "50", "--nonblocking",
                                    "--output", str(profile_dir / f"{name}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        platform._wait_ready(name)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        took[name] = round(time.monotonic() - started, 2)
        took[f"{name}_cpu_s"] = cpu_seconds(platform.procs[name].pid)
        took[f"{name}_load"] = load()[0]
    assert platform.nats is not None
    platform.nats.stop()
    started = time.monotonic()
    platform.nats.start()
    took["nats-server"] = round(time.monotonic() - started, 2)
    took["nats-server_cpu_s"] = cpu_seconds(platform.nats.pid) if platform.nats.pid else None
    took["nats-server_load"] = load()[0]
    for name in SERVICES:  # every service back on the restarted bus
        platform._wait_ready(name)
    return took


async def measure(platform: Platform, conn, args, result: dict) -> dict:
    deadline = time.monotonic() + args.timeout
    assert platform.nats is not None
    bus = await Bus.connect(platform.nats.url, name="bench-rss", **platform.nats.login("platform"))
    timeout = ClientTimeout(total=120)
    async with ClientSession(connector=TCPConnector(limit=args.clients + 4), timeout=timeout) as session:
        api = Api(session, conn.url, conn.token)
        # A history database given again (--history-db) holds the last run's jobs: new names, counted from there.
        prefix = f"rss{int(time.time()) % 1_000_000}"
        before = await api.count("SUCCEEDED")
        done = 0
        if args.warmup:
            await burst(platform, api, conn.url, conn.token, prefix, 0, args.warmup, args.clients, deadline, before)
            done = args.warmup
        reached = await caught_up(platform, bus, args.live_max, args.catch_up_timeout)
        points: list[dict[str, Any]] = [{"finished_jobs": done, "rss_mib": snapshot(platform),
                                         "rss_anon_mib": snapshot(platform, "RssAnon"), **reached,
                                         "buckets": await buckets(bus), "load": load()}]
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
        restarted: list[dict[str, Any]] = []
        for total in args.totals:
            if total > done:
                started = time.monotonic()
                await burst(platform, api, conn.url, conn.token, prefix, done, total - done, args.clients, deadline, before)
                burst_s = time.monotonic() - started
                done = total
            else:
                burst_s = 0.0
            reached = await caught_up(platform, bus, args.live_max, args.catch_up_timeout)
            points.append({"finished_jobs": done, "burst_jobs_per_s": round((total - points[-1]["finished_jobs"])
                                                                            / burst_s, 1) if burst_s else None,
                           "rss_mib": snapshot(platform), "rss_anon_mib": snapshot(platform, "RssAnon"),
                           "nats_live_heap_mib": nats_live_heap_mib(platform), **reached,
                           "buckets": await buckets(bus), "load": load()})
            print(json.dumps(points[-1]), file=sys.stderr, flush=True)
            if args.restart_each or (total == args.totals[-1] and not args.no_restart):
                await bus.close()
                took = restart_all(platform, Path(args.profile_restart) if args.profile_restart else None)
                await asyncio.sleep(RESTARTED_SECONDS)
                bus = await Bus.connect(platform.nats.url, name="bench-rss", **platform.nats.login("platform"))
                restarted.append({"finished_jobs": done, "restart_to_ready_s": took, "rss_mib": snapshot(platform),
                                  "rss_anon_mib": snapshot(platform, "RssAnon"), "load": load()})
                print(json.dumps(restarted[-1]), file=sys.stderr, flush=True)
    await bus.close()
    base = points[0]
    slopes = {}
    for name in MEASURED:
        # Running: over the points since the last restart before them (all of them without
        # --restart-each). After a restart: against the base, a fresh platform after the warm-up.
        since = points if not args.restart_each else points[-2:]
        running = [(p["finished_jobs"], p["rss_mib"].get(name)) for p in since]
        after = [(base["finished_jobs"], base["rss_mib"].get(name))] + [
            (r["finished_jobs"], r["rss_mib"].get(name)) for r in restarted]
        last_20k = [(x, y) for x, y in running if x >= running[-1][0] - 20_000]
        slopes[name] = {"running": slope_per_1000(running), "running_last_burst": slope_per_1000(running[-2:]),
                        "running_last_20k": slope_per_1000(last_20k),
                        "after_restart": slope_per_1000(after),
                        "running_anon": slope_per_1000([(p["finished_jobs"], p["rss_anon_mib"].get(name))
                                                        for p in since])}
    live_heap = [(p["finished_jobs"], p.get("nats_live_heap_mib")) for p in points]
    slopes["nats-server"]["live_heap"] = slope_per_1000(live_heap)
    slopes["nats-server"]["live_heap_last_20k"] = slope_per_1000(
        [(x, y) for x, y in live_heap if x >= live_heap[-1][0] - 20_000])
    return result | {"base_finished_jobs": base["finished_jobs"], "points": points, "restarted": restarted,
                     "exited_and_started_again": CRASHES,
                     "mib_per_1000_finished_jobs": slopes,
                     "target_mib_per_1000": 1.0,
                     "restart_to_ready_s_at_end": restarted[-1]["restart_to_ready_s"] if restarted else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--totals", default="5000,10000,20000",
                        help="cumulative finished jobs after each burst, comma-separated")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--live-max", type=int, default=500)
    parser.add_argument("--live-seconds", type=float, default=10.0)
    parser.add_argument("--sweep-seconds", type=float, default=1.0)
    parser.add_argument("--retention-seconds", type=float, default=10.0)
    parser.add_argument("--restart-each", action="store_true",
                        help="restart every process after each burst (by default only after the last)")
    parser.add_argument("--no-restart", action="store_true", help="RSS only: no restarts after the last burst")
    parser.add_argument("--catch-up-timeout", type=float, default=300.0,
                        help="seconds to wait after a burst for the live finished jobs to be back within the bound")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--profile-restart", metavar="DIR",
                        help="py-spy samples each service's restart until ready: DIR/<service>.txt, collapsed stacks")
    parser.add_argument("--history-db", default=None, metavar="PATH",
                        help="the history database, a SQLite file (e.g. a copy of one benchmarks/history_scale.py "
                             "seeded, its jobs marked archived): restarts with that much history. Used and changed "
                             "in place: pass a copy")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a config field for the platform (libs/common/config.py), e.g. history_projection=inline")
    args = parser.parse_args()
    args.totals = sorted(int(t) for t in args.totals.split(","))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    os.environ["GODEBUG"] = "gctrace=1"  # nats-server's live heap in its log (nats_live_heap_mib); Go reads it only
    with tempfile.TemporaryDirectory(prefix="pai-rss-", dir=args.data_dir) as tmp:
        os.chmod(tmp, 0o711)  # passable by the tasks' users (benchmarks/e2e_throughput.py)
        data = Path(tmp) / "pai"
        data.mkdir()
        ports = {f"{s}_port": free_port() for s in SERVICES}
        if args.history_db:
            args.set.append(f"history_dsn=sqlite+aiosqlite:///{Path(args.history_db).resolve()}")
        settings: dict[str, Any] = dict(
            rest_rate_limit_burst=10_000_000, rest_rate_limit_per_second=10_000_000.0,
            # One admin submits every job: a burst queues faster than the platform runs it,
            # and its queue would pass the per-user stored-jobs quota (507s, not memory).
            rest_user_max_jobs=0, rest_user_max_job_bytes=0,
            live_finished_job_max=args.live_max, live_finished_job_seconds=args.live_seconds,
            history_sweep_seconds=args.sweep_seconds, retention_finished_seconds=args.retention_seconds,
            retention_sweep_seconds=max(1.0, args.retention_seconds / 5))
        settings.update(ports)
        settings.update(item.split("=", 1) for item in args.set)  # --set wins over the defaults above
        config = load_config(
            env={}, data_dir=str(data), nats_url=f"nats://127.0.0.1:{free_port()}",
            cluster_file=str(slots64_cluster_file(Path(tmp) / "cluster-slots64.yaml")), **settings)
        result: dict[str, Any] = {
            "benchmark": "service_rss", "commit": git_commit(), "cpus": os.cpu_count(),
            "data_dir_filesystem": filesystem_of(tmp), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "settings": {"live_finished_job_max": args.live_max, "live_finished_job_seconds": args.live_seconds,
                         "history_sweep_seconds": args.sweep_seconds,
                         "retention_finished_seconds": args.retention_seconds, "warmup_jobs": args.warmup,
                         "totals": args.totals, "clients": args.clients, "cells": 64, "set": args.set,
                         "history_jobs_at_start": history_jobs(args.history_db)}}
        platform = Platform(config, print_fn=lambda *_: None)
        try:
            conn = platform.start()
            result = asyncio.run(measure(platform, conn, args, result))
        except Exception as exc:  # noqa: BLE001 - reported with what was reached
            tails = {}
            for log in sorted((data / "logs").glob("*.log")):
                tails[log.name] = log.read_text(errors="replace").splitlines()[-5:]
            result |= {"error": f"{type(exc).__name__}: {exc}", "log_tails": tails}
        finally:
            platform.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
