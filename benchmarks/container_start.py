"""Container-mode start: what PAI adds to the container engine's own start.

Starts the platform as `pai up` runs it (cli/up.py's Platform, a temporary data dir,
free ports, `container_engine: auto`: podman's API service PAI starts, or a podman or
Docker socket already answering) and, in the same run, drives the same engine through
the same Docker-compatible API directly, so both are measured on the machine as it is
at that moment:

1. paired, one at a time (`--idle-jobs`, after one unmeasured warm-up of each):
   - PAI: a one-task job of `true` in the test image (an OpenPAI v2 YAML naming it),
     submitted and waited for to its end; submit->RUNNING = the launcher's RUNNING
     time minus rest's intake time (the platform's own timestamps, as
     e2e_throughput.py's idle phase);
   - bare engine: create + start of a container of the same image running `true`
     with what PAI asks for too (host network, memory without swap, one cpu, pids,
     /dev/shm 512 MB, a work directory bound in), timed to start's answer; then its
     wait (create+start+wait: the engine's whole run) and its removal.
   Each PAI job is followed by one bare run, so load from other work on the
   machine falls on both alike.
2. burst: `--jobs` such jobs submitted together (e2e_throughput.py's burst_phase),
   jobs completed per second from the first intake to the last completion; beside
   it the same number of bare create+start+wait+remove runs, as many at a time as
   the platform has cells (what bounds PAI's concurrency), per second.
3. `podman run --rm` of the image once, timed (the CLI, for reference).

`ratio_p50` is PAI's submit->RUNNING p50 over the engine's create+start p50 (the
target: at most 1.2, PAI adding at most 20% to the engine's own start). The machine's
load and speed (stats.python_loop_seconds) are reported beside the figures.

    python benchmarks/container_start.py [--jobs 50] [--idle-jobs 20] [--timeout 600] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession, ClientTimeout, TCPConnector  # noqa: E402

from benchmarks.e2e_throughput import ENDED, Api, burst_phase, git_commit, summary_ms  # noqa: E402
from benchmarks.jobs import image_job  # noqa: E402
from benchmarks.stats import python_loop_seconds  # noqa: E402
from cli.up import SERVICES, Platform  # noqa: E402
from libs.common.config import load_config  # noqa: E402
from libs.common.natsserver import free_port  # noqa: E402
from services.launcher.backends import engine as engine_api  # noqa: E402

IMAGE = "localhost/pai-test-busybox:1"  # tests/containers/build-images.sh, from this machine's files
BUILD_IMAGES = ROOT / "tests" / "containers" / "build-images.sh"
MAX_JOBS = 500  # bounded: each job is a container (a few hundred ms of the engine's time)
MIB = 1024 * 1024


class ImageApi(Api):
    """e2e_throughput's client, submitting the trivial job in a container of IMAGE."""

    async def submit(self, name: str) -> tuple[int, str]:
        async with self.session.post(f"{self.url}/api/v2/jobs", data=image_job(name, IMAGE),
                                     headers={**self.headers, "Content-Type": "text/yaml"}) as resp:
            return resp.status, (await resp.text())[:300]

    async def detail(self, name: str) -> dict:
        async with self.session.get(f"{self.url}/api/v2/jobs/admin~{name}", headers=self.headers) as resp:
            return await resp.json()


def bare_spec(work: Path) -> dict[str, Any]:
    """A container as PAI asks for one (local_containers._spec), running `true`."""
    return {
        "Image": IMAGE, "Entrypoint": ["/bin/sh", "-c", "true"], "Cmd": [], "WorkingDir": "/pai/work",
        "Labels": {"ai.pai.benchmark": "container_start"},
        "HostConfig": {"NetworkMode": "host", "Memory": 256 * MIB, "MemorySwap": 256 * MIB,
                       "NanoCpus": 1_000_000_000, "PidsLimit": 4096, "ShmSize": 512 * MIB,
                       "Binds": [f"{work}:/pai/work:rw"]},
    }


async def bare_run(engine: engine_api.Engine, name: str, work: Path) -> tuple[float, float]:
    """(create+start, create+start+wait) seconds of one container; removed after (not timed)."""
    began = time.monotonic()
    await engine.create(name, bare_spec(work))
    await engine.start(name)
    started = time.monotonic() - began
    await engine.wait(name)
    ended = time.monotonic() - began
    await engine.remove(name)
    return started, ended


async def pai_job(api: ImageApi, name: str, deadline: float) -> dict:
    """Submit one job and wait for its end; its detail."""
    status, body = await api.submit(name)
    if status not in (200, 201, 202):
        raise RuntimeError(f"submit {name}: HTTP {status} {body}")
    while True:
        got = await api.job(name)
        if got["state"] in ENDED:
            return await api.detail(name)
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {name} still {got['state']}")
        await asyncio.sleep(0.02)


def launched_ms(detail: dict) -> float | None:
    status = detail["jobStatus"]
    if status.get("state") != "SUCCEEDED":
        raise RuntimeError(f"job {detail.get('name')} {status.get('state')}: {json.dumps(detail)[:600]}")
    if status.get("appLaunchedTime") and status.get("createdTime"):
        return status["appLaunchedTime"] - status["createdTime"]
    return None


async def measure(conn, result: dict, args, slots: int, work: Path) -> dict:
    deadline = time.monotonic() + args.timeout
    engine = await engine_api.connect("auto")  # the socket the launcher chose (the same order)
    if engine is None:
        raise RuntimeError("no container engine answered (container_engine auto)")
    version = await engine.version()
    result["engine"] = {"socket": engine.socket_path, "version": version.get("Version"),
                        "name": (version.get("Components") or [{}])[0].get("Name")}
    try:
        async with ClientSession(connector=TCPConnector(limit=max(args.clients, 4)),
                                 timeout=ClientTimeout(total=120)) as session:
            api = ImageApi(session, conn.url, conn.token)
            # Warm-up, unmeasured: the first container pays the engine's one-off setup.
            detail = await pai_job(api, "warm", deadline)
            task = detail["taskRoles"]["main"]["taskStatuses"][0]
            if task.get("runtimeMode") != "container":
                raise RuntimeError(f"the job ran as {task.get('runtimeMode')}, not in a container: "
                                   f"{detail['jobStatus'].get('appExitDiagnostics')}")
            await bare_run(engine, "pai-bench-warm", work)

            loop_seconds, load_before = python_loop_seconds(), os.getloadavg()
            pai, bare_start, bare_run_s = [], [], []
            for n in range(args.idle_jobs):
                ms = launched_ms(await pai_job(api, f"idle-{n}", deadline))
                if ms is not None:
                    pai.append(ms)
                started, ended = await bare_run(engine, f"pai-bench-idle-{n}", work)
                bare_start.append(round(started * 1000, 1))
                bare_run_s.append(round(ended * 1000, 1))
            result["paired"] = {
                "jobs": args.idle_jobs,
                "pai_submit_to_running": summary_ms(pai),
                "engine_create_start": summary_ms(bare_start),
                "engine_create_start_wait": summary_ms(bare_run_s),
                "python_loop_s_before": loop_seconds,
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            }
            p50_pai, p50_bare = result["paired"]["pai_submit_to_running"]["p50_ms"], \
                result["paired"]["engine_create_start"]["p50_ms"]
            if p50_pai is not None and p50_bare:
                result["ratio_p50"] = round(p50_pai / p50_bare, 3)
                result["pai_adds_p50_ms"] = round(p50_pai - p50_bare, 1)

            load_before = os.getloadavg()
            burst = await burst_phase(api, "burst-", args.jobs, args.clients, deadline, "aiohttp")
            rows = await api.rows("burst-")
            created = [r["createdTime"] for r in rows if r.get("createdTime")]
            completed = [r["completedTime"] for r in rows if r.get("state") == "SUCCEEDED" and r.get("completedTime")]
            span = (max(completed) - min(created)) / 1000 if completed and created else None
            launch = []
            for start in range(0, len(rows), 16):
                got = await asyncio.gather(*(api.job(r["name"]) for r in rows[start:start + 16]))
                launch += [g["appLaunchedTime"] - g["createdTime"] for g in got
                           if g.get("appLaunchedTime") and g.get("createdTime")]

            gate = asyncio.Semaphore(slots)

            async def gated(n: int) -> None:
                async with gate:
                    await bare_run(engine, f"pai-bench-burst-{n}", work)

            began = time.monotonic()
            await asyncio.gather(*(gated(n) for n in range(args.jobs)))
            bare_seconds = time.monotonic() - began
            result["burst"] = {
                "jobs": args.jobs, "concurrency": slots, "accepted": burst["accepted"],
                "succeeded": burst["succeeded"], "timed_out": burst["timed_out"],
                "pai_completed_per_s": round(len(completed) / span, 2) if span else None,
                "pai_submit_to_running": summary_ms(launch),
                "engine_runs_per_s": round(args.jobs / bare_seconds, 2),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            }
            if span and bare_seconds:
                result["burst"]["throughput_ratio"] = round(result["burst"]["pai_completed_per_s"]
                                                            / result["burst"]["engine_runs_per_s"], 3)
    finally:
        await engine.close()
    return result


def podman_run_once() -> float | None:
    """`podman run --rm` of the image once, in seconds (the CLI with PAI's engine configuration)."""
    if shutil.which("podman") is None:
        return None
    began = time.monotonic()
    done = subprocess.run(["podman", "run", "--rm", "--network", "host", IMAGE, "true"],
                          env=engine_api.podman_env(), capture_output=True)
    return round(time.monotonic() - began, 3) if done.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50, help=f"the burst's jobs (at most {MAX_JOBS})")
    parser.add_argument("--idle-jobs", type=int, default=20, help=f"paired one-at-a-time jobs (at most {MAX_JOBS})")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--data-dir", default=None, help="where the temporary data dir is made (default: the temp dir)")
    args = parser.parse_args()
    if not (1 <= args.jobs <= MAX_JOBS and 1 <= args.idle_jobs <= MAX_JOBS):
        parser.error(f"--jobs and --idle-jobs: 1 to {MAX_JOBS}")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if subprocess.run(["sh", str(BUILD_IMAGES)], env=engine_api.podman_env(), capture_output=True).returncode:
        sys.exit(f"the image {IMAGE} could not be built ({BUILD_IMAGES}; needs podman, as root)")
    report: dict[str, Any] = {"benchmark": "container_start", "commit": git_commit(), "cpus": os.cpu_count(),
                              "image": IMAGE, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="pai-containers-", dir=args.data_dir) as tmp:
        os.chmod(tmp, 0o711)  # passable by the tasks' users, as a platform's own data dir is
        data = Path(tmp) / "pai"
        data.mkdir()
        work = Path(tmp) / "bare-work"
        work.mkdir()
        config = load_config(env={}, data_dir=str(data), nats_url=f"nats://127.0.0.1:{free_port()}",
                             rest_rate_limit_burst=10_000_000, rest_rate_limit_per_second=10_000_000.0,
                             container_engine="auto", **{f"{s}_port": free_port() for s in SERVICES})
        slots = (config.local_cpus or os.cpu_count() or 1) * config.cpu_oversubscription
        platform = Platform(config, print_fn=lambda *_: None)
        try:
            conn = platform.start()
            asyncio.run(measure(conn, report, args, slots, work))
        except Exception as exc:  # noqa: BLE001 - reported with what was reached
            report["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            platform.stop()
    report["podman_run_rm_s"] = podman_run_once()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
