"""End-to-end throughput of trivial jobs: the whole platform as `pai up` runs it.

Starts nats-server and the five services as real processes (cli/up.py's
Platform) in a temporary data dir on free ports, so it never meets another
platform running on the machine, then for each configuration:

1. idle: `--idle-jobs` one-task jobs one at a time, each waited for to the end,
   giving submit->RUNNING on an idle platform (the launcher's RUNNING time minus
   rest's intake time, both the platform's own timestamps); while one of them
   runs, every NATS message is recorded (benchmarks/e2e_trace.py) to list what
   one job costs the bus;
2. burst: `--jobs` one-task jobs (`true`, cpu 1, an OpenPAI v2 YAML) POSTed by
   `--clients` concurrent aiohttp clients, then waited for until every one has
   SUCCEEDED. Measured over the burst: submissions/s, jobs completed/s from the
   first intake (createdTime) to the last completion (completedTime), submit->
   launch p50/p99, the CPU seconds each process used per job, NATS messages per
   job (nats-server's /varz), the event stream's messages per job and kind and
   each bucket's writes per job, the load average, and how long a fixed Python
   loop took just before (`python_loop_s_before`: the machine's speed, which
   moves every figure with it; compare runs taken at different times by it);
   and where a job's time went between its events (`stages`, e2e_stages.py: a
   cell is held from its job's placement to its release, so on the 64 cells
   that time bounds the jobs finished per second).

The burst's clients are lean HTTP/1.1 clients on asyncio streams (`Submitter`):
they share the machine's two cores with the platform, and aiohttp's client took
0.20-0.27 ms of CPU per submission against their 0.08-0.10 (`client_cpu_ms_per_job`).
`--client aiohttp` submits through aiohttp's client instead.

CPU per job comes from /proc/<pid>/stat before and after the burst: utime+stime
of each service process, nats-server, and the launcher's fork server; the fork
server's cutime+cstime are the shims it forked and reaped, and through them the
task processes (`true`) the shims reaped, counted as `launcher_shims_and_tasks`.
A shim still alive at the end is waited for (up to 10 s) so its time is in.
rest's history projection process (`rest_history`, niced: it may apply the burst's
events after the last job ends) is waited for until the history has applied every
event (`history_caught_up_after_s`), and all CPU is read then.
The benchmark's own status polls (one list request a second) are in rest's.

Configurations (`--config`, both by default):
- `default`: `pai up`'s laptop cluster, this machine as one node of
  cores x cpu_oversubscription one-CPU cells (4 per core: 8 on 2 cores);
- `slots64`: a cluster file in the temp dir with one node of 64 one-CPU cells,
  so that slots are not the limit.
rest's per-token rate limit is raised out of the way (one admin token submits
everything).

Where the data dir lies matters: each task creates one or two files and
directories there (its record, and its working directory unless it takes over
the bare one of a task that ended). On an ext4 without a
journal (this machine's root filesystem) a create steps over every inode
deleted in the last one to six minutes, so a run soon after another (whose
temporary data dir was just deleted) pays more per task than one on a quiet
disk; a journaled ext4 (the usual kind) or `--data-dir /dev/shm` does not
pay it. The report names the filesystem (`data_dir_filesystem`: its type and,
for ext4, whether it has a journal); say which was used when quoting figures.

`--profile DIR` records every service with py-spy during the burst and writes,
per configuration, each service's top functions by own time and its samples
grouped by step (HTTP, validation, KV writes, publishes, acks, fetches, core, ...)
to DIR/<config>.json and DIR/<config>.txt, plus the raw stacks.

    python benchmarks/e2e_throughput.py [--jobs 1000] [--clients 16] [--client streams|aiohttp]
                                        [--config default|slots64|both]
                                        [--idle-jobs 30] [--timeout 900] [--profile DIR] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from aiohttp import ClientSession, ClientTimeout, TCPConnector  # noqa: E402

from benchmarks import e2e_profile, e2e_stages, e2e_trace  # noqa: E402
from benchmarks.jobs import trivial_job  # noqa: E402
from benchmarks.stats import filesystem_of, interpreter, percentile, python_loop_seconds  # noqa: E402
from cli.up import SERVICES, Platform  # noqa: E402
from libs.common import busauth, machine  # noqa: E402
from libs.common.bus import Bus  # noqa: E402
from libs.common.config import load_config  # noqa: E402
from libs.common.natsserver import free_port  # noqa: E402
from libs.common.subjects import STREAM, Bucket, Durable  # noqa: E402
from services.rest.history import projector  # noqa: E402

ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
POLL_SECONDS = 1.0
SLOTS64_CELLS = 64


# --- processes and their CPU ---------------------------------------------------------


def proc_stat(pid: int) -> dict[str, float]:
    """CPU seconds of `pid`: own (utime+stime), of which in the kernel (stime), and
    reaped children (cutime+cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return {"own": (utime + stime) / CLOCK_TICK, "kernel": stime / CLOCK_TICK, "children": (cutime + cstime) / CLOCK_TICK}


def children_of(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def child_running(parent: int, module: str) -> int | None:
    """The child of `parent` whose command line names `module`, if one runs."""
    try:
        children = psutil.Process(parent).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or a zombie
            if module in " ".join(child.cmdline()):
                return child.pid
    return None


def fork_server_of(launcher_pid: int) -> int | None:
    return child_running(launcher_pid, "local_forkserver")


def projector_of(rest_pid: int) -> int | None:
    """rest's history projection process (history_projection: process), if it runs one."""
    return child_running(rest_pid, projector.__name__)


async def history_caught_up(bus: Bus, timeout: float = 120.0) -> float | None:
    """Seconds until the history's durable has applied every event (none pending, none
    unacked); None if it had not after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        info = await bus.js.consumer_info(STREAM, Durable.HISTORY.value)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return round(time.monotonic() - started, 2)
        await asyncio.sleep(0.2)
    return None


class Processes:
    """The pids measured: each service, nats-server, the launcher's fork server."""

    def __init__(self, platform: Platform):
        self.pids = {name: proc.pid for name, proc in platform.procs.items()}
        assert platform.nats is not None and platform.nats.pid is not None
        self.pids["nats-server"] = platform.nats.pid
        fork_server = fork_server_of(self.pids["launcher"])
        if fork_server is not None:
            self.pids["launcher_forkserver"] = fork_server
        projector = projector_of(self.pids["rest"])
        if projector is not None:
            self.pids["rest_history"] = projector

    def snapshot(self) -> dict[str, dict[str, float]]:
        taken = {}
        for name, pid in self.pids.items():
            try:
                taken[name] = proc_stat(pid)
            except OSError:
                taken[name] = {"own": float("nan"), "kernel": float("nan"), "children": float("nan")}
        return taken

    def wait_for_shims(self, timeout: float = 10.0) -> int:
        """Shims still running (their CPU is counted once the fork server reaps them)."""
        fork_server = self.pids.get("launcher_forkserver")
        if fork_server is None:
            return 0
        deadline = time.monotonic() + timeout
        while (left := len(children_of(fork_server))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def cpu_per_job(before: dict, after: dict, jobs: int) -> dict[str, float]:
    """Milliseconds of CPU per job per process; see the module's doc for what is counted."""
    per_job: dict[str, float] = {}
    for name in before:
        own = after[name]["own"] - before[name]["own"]
        children = after[name]["children"] - before[name]["children"]
        if name == "launcher_forkserver":
            per_job["launcher_forkserver"] = own
            per_job["launcher_shims_and_tasks"] = children
        else:
            per_job[name] = own
            if children:
                per_job[f"{name}_children"] = children
    ms = {name: round(seconds * 1000 / max(1, jobs), 3) for name, seconds in per_job.items()}
    ms["total"] = round(sum(v for v in ms.values() if v == v), 3)
    return ms


def kernel_percent(before: dict, after: dict) -> dict[str, float]:
    """Share of each process's own CPU time spent in the kernel (system calls: socket
    writes and reads on loopback carry the TCP work of both ends)."""
    shares = {}
    for name in before:
        own = after[name]["own"] - before[name]["own"]
        if own > 0:
            shares[name] = round(100 * (after[name]["kernel"] - before[name]["kernel"]) / own, 1)
    return shares


# --- the platform ---------------------------------------------------------------------


def with_monitor_port(port: int):
    """busauth.server_config that also serves nats-server's monitoring (/varz) on `port`."""
    original = busauth.server_config

    def server_config(*args, **kwargs) -> dict:
        config = original(*args, **kwargs)
        config["http"] = f"127.0.0.1:{port}"
        return config

    return original, server_config


def slots64_cluster_file(path: Path) -> Path:
    """One node (this machine, as the node agent names it) of 64 one-CPU cells, one VC
    (JSON, which is YAML: the loader takes a path ending in .yaml)."""
    host = machine.detect().hostname
    path.write_text(json.dumps({
        "physicalCluster": {
            "skuTypes": {"cpu": {"gpu": 0, "cpu": 1, "memory": "512Mi"}},
            "cellTypes": {"cpu-node": {"childCellType": "cpu", "childCellNumber": SLOTS64_CELLS, "isNodeLevel": True}},
            "physicalCells": [{"cellType": "cpu-node", "cellAddress": host}],
        },
        "virtualClusters": {"default": {"virtualCells": [{"cellType": "cpu-node", "cellNumber": 1}]}},
    }, indent=2))
    return path


def varz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as resp:
        return json.loads(resp.read())


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


async def stream_sequences(bus: Bus) -> dict[str, int]:
    """Last sequence of the event stream and of every bucket's stream: their
    difference over a phase is how many messages (events, KV writes) were stored."""
    names = [STREAM] + [f"KV_{bucket.value}" for bucket in Bucket]
    sequences = {}
    for name in names:
        try:
            sequences[name] = (await bus.js.stream_info(name)).state.last_seq
        except Exception:  # noqa: BLE001 - a bucket not made in this version
            pass
    return sequences


async def events_per_kind(bus: Bus, prefix: str) -> dict[str, int]:
    """Events stored per kind for the jobs whose name starts with `prefix`."""
    info = await bus.js.stream_info(STREAM, subjects_filter="pai.v1.>")
    counts: dict[str, int] = {}
    for subject, count in (info.state.subjects or {}).items():
        if subject.rsplit(".", 1)[-1].startswith(prefix):
            kind = ".".join(subject.split(".")[2:4])
            counts[kind] = counts.get(kind, 0) + count
    return dict(sorted(counts.items()))


# --- HTTP -----------------------------------------------------------------------------


class Api:
    def __init__(self, session: ClientSession, url: str, token: str):
        self.session = session
        self.url = url
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"}

    async def submit(self, name: str) -> tuple[int, str]:
        async with self.session.post(f"{self.url}/api/v2/jobs", data=trivial_job(name),
                                     headers={**self.headers, "Content-Type": "text/yaml"}) as resp:
            return resp.status, (await resp.text())[:300]

    async def job(self, name: str) -> dict:
        async with self.session.get(f"{self.url}/api/v2/jobs/admin~{name}", headers=self.headers) as resp:
            return (await resp.json())["jobStatus"] if resp.status == 200 else {"state": f"HTTP {resp.status}"}

    async def count(self, state: str, user: str = "admin") -> int:
        """The user's jobs in `state`: an exact total (a keyword's total is capped past
        1,000 matches, X-Total-Count-Capped; a user's and a state's never are)."""
        query = f"username={user}&state={state}&limit=1"
        async with self.session.get(f"{self.url}/api/v2/jobs?{query}", headers=self.headers) as resp:
            await resp.read()
            return int(resp.headers.get("X-Total-Count", 0))

    async def rows(self, prefix: str) -> list[dict]:
        async with self.session.get(f"{self.url}/api/v2/jobs?keyword={prefix}&limit=10000",
                                    headers=self.headers) as resp:
            return await resp.json()


class Submitter:
    """One burst client's keep-alive HTTP/1.1 connection to rest, for submissions.

    The burst's clients run on the cores the platform uses, and aiohttp's client
    costs about a quarter of a millisecond of CPU per request: some 7% of all the
    CPU a trivial job takes, taken from the platform while it is measured. This
    client writes the request and reads the answer (status line, headers, body by
    Content-Length or chunks) with asyncio streams, a request at a time on its
    connection, as an aiohttp client with one connection does. `--client aiohttp`
    measures with aiohttp's client instead."""

    def __init__(self, url: str, token: str):
        host_port = url.split("://", 1)[1].rstrip("/")
        self.host, _, port = host_port.partition(":")
        self.port = int(port or 80)
        self.head = (f"POST /api/v2/jobs HTTP/1.1\r\nHost: {host_port}\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: text/yaml\r\nContent-Length: ").encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def submit(self, name: str) -> tuple[int, str]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        body = trivial_job(name)
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError(f"rest closed the connection before answering the submission of {name}")
        status = int(status_line.split(b" ", 2)[1])
        length, chunked, close = 0, False, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            field, _, value = line.partition(b":")
            field, value = field.strip().lower(), value.strip().lower()
            if field == b"content-length":
                length = int(value)
            elif field == b"transfer-encoding":
                chunked = value == b"chunked"
            elif field == b"connection":
                close = value == b"close"
        if chunked:
            answer = b""
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                answer += await self.reader.readexactly(size + 2)
            await self.reader.readline()  # the last chunk's line break (no trailers)
        else:
            answer = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, answer[:300].decode(errors="replace")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def summary_ms(values: list[float]) -> dict[str, float | None]:
    return {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
            "max_ms": max(values) if values else None, "count": len(values)}


async def idle_phase(api: Api, bus: Bus, prefix: str, jobs: int, deadline: float) -> tuple[dict, dict]:
    """Jobs one at a time on the idle platform: submit->RUNNING; the message trace of one."""
    latencies, trace = [], {}
    for n in range(jobs):
        name = f"{prefix}{n}"
        tracing = n == jobs // 2 and jobs > 0
        recorder = await e2e_trace.Recorder.start(bus.nc) if tracing else None
        if recorder is not None:
            await asyncio.sleep(2.0)  # a quiet window of the idle platform, to tell background from the job
            recorder.mark("job submitted")
        status, body = await api.submit(name)
        if status != 202 and status != 201 and status != 200:
            raise RuntimeError(f"idle submit {name}: HTTP {status} {body}")
        while True:
            got = await api.job(name)
            if got["state"] in ENDED:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"idle job {name} still {got['state']}")
            await asyncio.sleep(0.02)
        if got.get("appLaunchedTime") and got.get("createdTime"):
            latencies.append(got["appLaunchedTime"] - got["createdTime"])
        if recorder is not None:
            await asyncio.sleep(1.0)  # what follows the end (releases, status writes)
            trace = recorder.stop(job=f"admin~{name}", name=name)
    return summary_ms(latencies), trace


async def burst_phase(api: Api, prefix: str, jobs: int, clients: int, deadline: float, client: str) -> dict:
    """`jobs` submitted by `clients` workers (each a `Submitter`, or aiohttp's client when `client`
    is "aiohttp"), then waited for until all SUCCEEDED (or the deadline)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for n in range(jobs):
        queue.put_nowait(f"{prefix}{n}")
    statuses: dict[str, int] = {}
    rejected: list[str] = []

    async def worker() -> None:
        own = Submitter(api.url, api.token) if client == "streams" else api
        try:
            while not queue.empty():
                name = queue.get_nowait()
                status, body = await own.submit(name)
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status >= 300 and len(rejected) < 5:
                    rejected.append(f"{name}: HTTP {status} {body}")
        finally:
            if isinstance(own, Submitter):
                await own.close()

    before = await api.count("SUCCEEDED")  # the idle phase's jobs (the same user's)
    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(clients)))
    submit_seconds = time.monotonic() - began
    accepted = sum(v for k, v in statuses.items() if k.startswith("2"))
    succeeded = 0
    while time.monotonic() < deadline:
        succeeded = await api.count("SUCCEEDED") - before
        if succeeded >= accepted:
            break
        await asyncio.sleep(POLL_SECONDS)
    return {"submit_seconds": submit_seconds, "wait_seconds": time.monotonic() - began, "statuses": statuses,
            "accepted": accepted, "succeeded": succeeded, "rejected_examples": rejected,
            "timed_out": succeeded < accepted}


async def measure(platform: Platform, conn, result: dict, args, nats_monitor: int, profile_dir: Path | None) -> dict:
    """Fills `result` as it goes, so that a failure still shows what was reached."""
    config_name = result["config"]
    deadline = time.monotonic() + args.timeout
    bus = await Bus.connect(platform.nats.url, name="e2e-throughput", **platform.nats.login(busauth.PLATFORM))
    try:
        async with ClientSession(connector=TCPConnector(limit=max(args.clients, 4)),
                                 timeout=ClientTimeout(total=120)) as session:
            api = Api(session, conn.url, conn.token)
            idle, trace = await idle_phase(api, bus, "idle-", args.idle_jobs, deadline)
            result["idle_submit_to_running"] = idle
            result["one_job_messages"] = trace
            await asyncio.sleep(2.0)  # the idle jobs' last shims end
            processes = Processes(platform)  # after the idle jobs: the fork server is started by the first task

            prefix = "burst-"
            loop_seconds = python_loop_seconds()
            load_before = os.getloadavg()
            cpu_before, varz_before = processes.snapshot(), varz(nats_monitor)
            seq_before = await stream_sequences(bus)
            client_cpu_before = time.process_time()
            profiler = e2e_profile.Profiler.start(processes.pids, profile_dir, config_name) if profile_dir else None
            try:
                burst = await burst_phase(api, prefix, args.jobs, args.clients, deadline, args.client)
            finally:
                if profiler is not None:
                    profiler.stop()
            client_cpu = time.process_time() - client_cpu_before
            shims_left = await asyncio.to_thread(processes.wait_for_shims)
            # The history is a projection at a lower CPU priority (projector.py): it may
            # finish the burst's events after the last job. Its CPU counts until it has.
            caught_up_s = await history_caught_up(bus)
            cpu_after, varz_after = processes.snapshot(), varz(nats_monitor)
            seq_after = await stream_sequences(bus)
            load_after = os.getloadavg()
            done = max(1, burst["succeeded"])

            rows = await api.rows(prefix)
            created = [r["createdTime"] for r in rows if r.get("createdTime")]
            completed = [r["completedTime"] for r in rows if r.get("state") == "SUCCEEDED" and r.get("completedTime")]
            launch = []
            details: dict[str, dict] = {}
            for start in range(0, len(rows), 32):  # after the measured window: these GETs cost nothing counted
                got = await asyncio.gather(*(api.job(r["name"]) for r in rows[start:start + 32]))
                details.update((r["name"], g) for r, g in zip(rows[start:start + 32], got, strict=True))
                launch += [g["appLaunchedTime"] - g["createdTime"] for g in got
                           if g.get("appLaunchedTime") and g.get("createdTime")]
            span = (max(completed) - min(created)) / 1000 if completed and created else None
            submit_span = (max(created) - min(created)) / 1000 if len(created) > 1 else None
            result["burst"] = {
                "jobs": args.jobs, "clients": args.clients, "client": args.client, "accepted": burst["accepted"],
                "succeeded": burst["succeeded"], "timed_out": burst["timed_out"],
                "http_statuses": burst["statuses"], "rejected_examples": burst["rejected_examples"],
                "submissions_per_s_client": round(burst["accepted"] / burst["submit_seconds"], 1),
                "submissions_per_s_platform": round(len(created) / submit_span, 1) if submit_span else None,
                "completed_per_s": round(len(completed) / span, 1) if span else None,
                "first_submit_to_last_completion_s": round(span, 2) if span else None,
                "submit_to_launch": summary_ms(launch),
                "cpu_ms_per_job": cpu_per_job(cpu_before, cpu_after, done),
                "cpu_kernel_percent": kernel_percent(cpu_before, cpu_after),
                # This benchmark's own process (the HTTP clients and the polling for completion): it shares
                # the machine's cores with the platform during the burst.
                "client_cpu_ms_per_job": round(client_cpu * 1000 / done, 2),
                "shims_still_running_at_end": shims_left,
                "history_caught_up_after_s": caught_up_s,
                "nats_msgs_per_job": {
                    "in": round((varz_after["in_msgs"] - varz_before["in_msgs"]) / done, 1),
                    "out": round((varz_after["out_msgs"] - varz_before["out_msgs"]) / done, 1),
                    "in_bytes": round((varz_after["in_bytes"] - varz_before["in_bytes"]) / done),
                    "out_bytes": round((varz_after["out_bytes"] - varz_before["out_bytes"]) / done),
                },
                "stored_per_job": {name: round((seq_after[name] - seq_before.get(name, 0)) / done, 2)
                                   for name in seq_after if seq_after[name] != seq_before.get(name, 0)},
                "events_per_job_by_kind": {k: round(v / done, 2) for k, v in
                                           (await events_per_kind(bus, prefix)).items()},
                # The machine's speed just before the burst (stats.python_loop_seconds):
                # compare runs taken at different times with it at hand.
                "python_loop_s_before": loop_seconds,
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in load_after],
            }
            result["burst"]["stages"] = e2e_stages.stages(await e2e_stages.stored_times(bus.js, prefix), details)
            if profiler is not None:
                result["profile"] = profiler.summarise()
    finally:
        await bus.close()
    return result


def run_config(config_name: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"pai-e2e-{config_name}-", dir=args.data_dir) as tmp:
        # Passable by the tasks' users, as a platform's own data dir is: else the
        # launcher puts their working directories outside it (local_layout's
        # choose_work_root), on another filesystem than --data-dir and never removed.
        os.chmod(tmp, 0o711)
        data = Path(tmp) / "pai"
        data.mkdir()
        overrides: dict[str, Any] = {}
        if config_name == "slots64":
            overrides["cluster_file"] = str(slots64_cluster_file(Path(tmp) / "cluster-slots64.yaml"))
        ports = {f"{s}_port": free_port() for s in SERVICES}
        config = load_config(env={}, data_dir=str(data), nats_url=f"nats://127.0.0.1:{free_port()}",
                             rest_rate_limit_burst=10_000_000, rest_rate_limit_per_second=10_000_000.0,
                             **ports, **overrides, **dict(item.split("=", 1) for item in args.set))
        nats_monitor = free_port()
        original, patched = with_monitor_port(nats_monitor)
        busauth.server_config = patched
        platform = Platform(config, print_fn=lambda *_: None)
        started = time.monotonic()
        result: dict[str, Any] = {"config": config_name}
        result["slots"] = (SLOTS64_CELLS if config_name == "slots64"
                           else (config.local_cpus or os.cpu_count() or 1) * config.cpu_oversubscription)
        if config_name == "default":
            result["cpu_oversubscription"] = config.cpu_oversubscription
        try:
            conn = platform.start()
            result["platform_startup_s"] = round(time.monotonic() - started, 1)
            return asyncio.run(measure(platform, conn, result, args, nats_monitor, args.profile))
        except Exception as exc:  # noqa: BLE001 - reported with what was reached; Ctrl-C/SIGTERM stop everything
            logs = data / "logs"
            tails = {}
            for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
                lines = log.read_text(errors="replace").splitlines()
                tails[log.name] = lines[-5:]
            return result | {"error": f"{type(exc).__name__}: {exc}", "log_tails": tails}
        finally:
            busauth.server_config = original
            platform.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--client", choices=("streams", "aiohttp"), default="streams",
                        help="the burst's HTTP client: a lean one on asyncio streams (Submitter), or aiohttp's")
    parser.add_argument("--config", choices=("default", "slots64", "both"), default="both")
    parser.add_argument("--idle-jobs", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration before giving up")
    parser.add_argument("--data-dir", default=None,
                        help="where the platform's temporary data dir is made (default: the temp dir); see the docstring")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy every service during the burst; write here")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a config field for the platform (libs/common/config.py), e.g. history_projection=inline")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    configs = ("default", "slots64") if args.config == "both" else (args.config,)
    data_dir_parent = args.data_dir or tempfile.gettempdir()
    report = {"benchmark": "e2e_throughput", "commit": git_commit(), "cpus": os.cpu_count(), "python": interpreter(),
              "data_dir_parent": data_dir_parent, "data_dir_filesystem": filesystem_of(data_dir_parent),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "configs": []}
    for name in configs:
        report["configs"].append(run_config(name, args))
        print(json.dumps(report["configs"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
