"""What the chaos tier needs around a running platform: a start log every task
writes to, and ways to kill, restart and wait that survive a service being down.

Every task of a chaos job first appends one line to its own start log:
`<job attempt> <task attempt>` in `<dir>/<job id>-<role>-<index>.starts`. The
file is written by the task itself, not by PAI, so it counts what really ran:
two equal lines in one file are one task attempt started twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import psutil

from cli.client import ApiError, Connection, connection_file
from cli.up import SERVICES, Platform, secure_data_dir
from libs.common.busauth import load_or_create_credentials
from libs.common.config import Config, load_config
from libs.common.jetstream_limits import store_settings
from libs.common.natsserver import NatsCluster, free_port
from tests.integration.conftest import FINAL, Api, job_yaml

# Three 8-CPU nodes on this machine; VC `default` holds two of them, `research` one.
CLUSTER_FILE = Path(__file__).resolve().parents[1] / "integration" / "cluster-3nodes.yaml"

# Short, so that stopping a platform between tests and killing tasks stay quick.
CHAOS_GRACE_SECONDS = 0.5
STARTS_SUFFIX = ".starts"
TEARDOWN_SIGTERM_SECONDS = 2.0


def record_start(log_dir: Path) -> str:
    """The shell command a chaos task runs first: one line per start of this task."""
    target = f"{log_dir}/$PAI_JOB_NAME-$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX{STARTS_SUFFIX}"
    return f'echo "$PAI_JOB_ATTEMPT_ID $PAI_TASK_ATTEMPT_ID" >> {target}'


@dataclass(frozen=True)
class TaskStarts:
    """Every start of one task instance (`role`, `index`) of `job`, in order."""

    job: str
    role: str
    index: int
    attempts: list[tuple[int, int]]  # (job attempt, task attempt) per start

    @property
    def duplicated(self) -> int:
        """Starts of a task attempt that had already started."""
        return len(self.attempts) - len(set(self.attempts))


def read_starts(log_dir: Path) -> dict[tuple[str, str, int], TaskStarts]:
    """The start logs under `log_dir`, keyed by (job id, role, index)."""
    found = {}
    for path in sorted(log_dir.glob(f"*{STARTS_SUFFIX}")):
        job, role, index = path.name.removesuffix(STARTS_SUFFIX).rsplit("-", 2)
        attempts = [tuple(int(n) for n in line.split()) for line in path.read_text().splitlines() if line.strip()]
        found[(job, role, int(index))] = TaskStarts(job=job, role=role, index=int(index), attempts=attempts)
    return found


def task_processes(job: str) -> list[psutil.Process]:
    """Live processes of `job`'s tasks (the local backend marks each with PAI_TASK_KEY)."""
    marker = job.replace("~", ".") + "."
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        try:
            environ = proc.info.get("environ") or {}
            if marker in environ.get("PAI_TASK_KEY", "") and proc.info.get("status") != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


async def wait_until_gone(job: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while task_processes(job):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of {job} still run after {timeout}s")
        await asyncio.sleep(0.1)


async def wait_for_file(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout}s")
        await asyncio.sleep(0.05)


def chaos_config(data_dir: Path) -> Config:
    return load_config(
        env={},
        data_dir=str(data_dir),
        nats_url=f"nats://127.0.0.1:{free_port()}",
        cluster_file=str(CLUSTER_FILE),
        grace_seconds=CHAOS_GRACE_SECONDS,
        node_sample_seconds=1.0,
        container_engine="none",  # tasks as processes, whatever engine this machine has
        **{f"{name}_port": free_port() for name in SERVICES},
    )


async def start_platform(data_dir: Path) -> Api:
    """A whole platform on a fresh data dir; the caller stops it with `stop_platform`."""
    platform = Platform(chaos_config(data_dir), print_fn=lambda *_: None)
    try:
        conn = await asyncio.to_thread(platform.start)
    except BaseException:
        await asyncio.to_thread(platform.stop)
        raise
    return Api(platform, conn)


async def stop_platform(api: Api) -> None:
    await asyncio.to_thread(_stop_quickly, api.platform)


def _stop_quickly(platform: Platform) -> None:
    """`Platform.stop`, with services that do not end within a moment of SIGTERM killed.

    A service idle for a few seconds hangs in NATS drain on SIGTERM (a timed-out
    pull request leaves a status message nobody reads), and `Platform.stop` waits
    up to 15 s for it; a chaos data dir is thrown away, so a clean exit buys
    nothing here. Task processes and NATS are still stopped by `Platform.stop`.
    """
    platform.stop_services(TEARDOWN_SIGTERM_SECONDS)
    platform.stop()


async def kill(api: Api, service: str) -> None:
    """kill -9 one service and reap it."""
    await asyncio.to_thread(api.platform.kill_service, service)


async def start(api: Api, service: str) -> None:
    """Start a killed service again and wait until it is ready (as `pai up`'s supervisor would)."""
    await asyncio.to_thread(api.platform.start_service, service)


def dead_services(api: Api) -> list[str]:
    return sorted(name for name, proc in api.platform.procs.items() if proc.poll() is not None)


def task_writable_dir(path: Path) -> Path:
    """Make `path` a directory tasks may write into: they run as their job's own
    unprivileged uid, so it is world-writable (sticky) and every parent lets them
    through (search permission, not listing)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    for parent in path.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    return path


# What a client sees while rest is down or NATS restarts: retry, as a user would.
UNREACHABLE = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


async def job_or_none(api: Api, job: str) -> dict | None:
    """The job's detail, or None while rest cannot answer (down, or NATS away)."""
    try:
        return await api.job(job)
    except UNREACHABLE:
        return None
    except ApiError as exc:
        if exc.status == 404 or exc.status >= 500:
            return None
        raise


async def wait_all_final(api: Api, jobs: Iterable[str], timeout: float) -> dict[str, dict | None]:
    """Poll until every job is final or `timeout` passes; a job never seen final maps to
    its last known detail (None if never seen)."""
    last: dict[str, dict | None] = {job: None for job in jobs}
    pending = set(last)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for job in sorted(pending):
            detail = await job_or_none(api, job)
            if detail is not None:
                last[job] = detail
                if detail["jobStatus"]["state"] in FINAL:
                    pending.discard(job)
        if pending:
            await asyncio.sleep(0.2)
    return last


def is_final(detail: dict | None) -> bool:
    return detail is not None and detail["jobStatus"]["state"] in FINAL


def states(details: dict[str, dict | None]) -> dict[str, str | None]:
    return {job: d["jobStatus"]["state"] if d else None for job, d in details.items()}


def chaos_job(name: str, log_dir: Path, commands: list[str], *, cpu: int = 1, roles: dict[str, int] | None = None,
              vc: str = "default") -> str:
    """A job whose every task records its start before running `commands`."""
    body = job_yaml(name, [record_start(log_dir), *commands], roles=roles, vc=vc)
    return body.replace("cpu: 1,", f"cpu: {cpu},")


def assert_each_task_started_once(log_dir: Path, jobs: dict[str, dict[str, int]]) -> None:
    """Every task of `jobs` (job id -> role -> instances) started exactly once, in
    the first job attempt and the first task attempt."""
    expected = {
        (job, role, index): [(1, 0)]
        for job, roles in jobs.items()
        for role, instances in roles.items()
        for index in range(instances)
    }
    assert {key: starts.attempts for key, starts in read_starts(log_dir).items()} == expected


# --- the platform on a three-node NATS cluster (tests/chaos/test_nats_cluster.py) ---

# Small store limits for the cluster tests: every node reserves the whole table
# against its disk (jetstream_limits), and three nodes share this machine's.
CLUSTER_STORE_LIMITS = {"nats_events_max_bytes": 256 * 1024 * 1024, "nats_bucket_max_bytes": 32 * 1024 * 1024}


class ClusterPlatform(Platform):
    """`Platform` (cli/up.py) on a JetStream cluster of `size` nodes, each in a network
    namespace of its own (libs/common/natsserver.NatsCluster), instead of one
    embedded nats-server: the services get every node in `nats_url` and the store
    is bootstrapped with replicas = size."""

    def __init__(self, config: Config, *, size: int = 3, print_fn=lambda *_: None):
        super().__init__(config, print_fn=print_fn)
        self.size = size
        self.cluster: NatsCluster | None = None

    def start(self) -> Connection:
        self.take_data_dir()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.data.chmod(0o700)
        self.nats_credentials = load_or_create_credentials(self.data / "nats-credentials.json")
        self.config = secure_data_dir(self.config, self.data, print_fn=self.print)
        self.cluster = NatsCluster(self.data / "nats", size=self.size, auth=self.nats_credentials).start()
        self.config = msgspec.structs.replace(self.config, nats_url=self.cluster.url, nats_replicas=self.size)
        self.cluster.bootstrap(store_settings(self.config))
        self.data.chmod(0o711)
        for name in SERVICES:
            self._spawn(name)
        for name in SERVICES:
            try:
                self._wait_ready(name)
            except RuntimeError:
                # A consumer's first leader election may still answer "unavailable"
                # and the service exits on it; its supervisor starts it again.
                self._spawn(name)
                self._wait_ready(name)
        conn = Connection(url=self.api_url, token=self.config.token_path.read_text().strip())
        path = connection_file(self.data)
        path.write_bytes(msgspec.json.encode(conn))
        path.chmod(0o600)
        return conn

    def stop(self) -> None:
        try:
            super().stop()  # services and tasks; self.nats is None, the cluster is ours
        finally:
            if self.cluster is not None:
                self.cluster.stop()


async def start_cluster_platform(data_dir: Path, *, size: int = 3) -> Api:
    """A whole platform on a NATS cluster; the caller stops it with `stop_platform`."""
    config = msgspec.structs.replace(chaos_config(data_dir), **CLUSTER_STORE_LIMITS)
    platform = ClusterPlatform(config, size=size)
    try:
        conn = await asyncio.to_thread(platform.start)
    except BaseException:
        await asyncio.to_thread(platform.stop)
        raise
    return Api(platform, conn)
