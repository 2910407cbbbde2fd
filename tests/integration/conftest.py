"""The whole platform as real processes: nats-server and the five services."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.client import ApiError, Client, Connection
from cli.up import Platform
from libs.common.config import load_config
from libs.common.natsserver import free_port
from services.launcher.backends.local_layout import choose_work_root

HERE = Path(__file__).resolve().parent
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def platform_config(data_dir: Path, **overrides: Any):
    ports = {f"{s}_port": free_port() for s in ("rest", "scheduler", "launcher", "runtime", "monitor")}
    return load_config(
        env={},
        data_dir=str(data_dir),
        nats_url=f"nats://127.0.0.1:{free_port()}",
        cluster_file=str(HERE / "cluster-3nodes.yaml"),
        grace_seconds=2.0,
        node_sample_seconds=1.0,
        **ports,
        # Tasks as processes, whatever engine this machine has; the container tier asks for one.
        **({"container_engine": "none"} | overrides),
    )


class Api:
    """Test-side view of a running platform."""

    def __init__(self, platform: Platform, conn: Connection):
        self.platform = platform
        self.client = Client(conn)
        self.conn = conn
        # Where the launcher put tasks' working directories, decided as it started:
        # tests that open directories to task users later (tmp_path_open_to_tasks)
        # would make a later reckoning differ.
        self.work_root = choose_work_root((platform.data / "launcher").resolve(), tasks_are_other_users=os.geteuid() == 0)

    async def submit(self, body: str, *, content_type: str = "text/yaml") -> dict:
        return await self.client.request("POST", "/api/v2/jobs", data=body.encode(), content_type=content_type)

    async def job(self, job: str) -> dict:
        return await self.client.request("GET", f"/api/v2/jobs/{job}")

    async def wait_state(self, job: str, states: set[str] | str, timeout: float = 30.0) -> dict:
        states = {states} if isinstance(states, str) else states
        deadline = time.monotonic() + timeout
        detail: dict = {}
        while time.monotonic() < deadline:
            try:
                detail = await self.job(job)
            except ApiError as exc:
                if exc.status != 404:
                    raise
            else:
                if detail["jobStatus"]["state"] in states:
                    return detail
            await asyncio.sleep(0.1)
        raise AssertionError(f"{job} did not reach {states} in {timeout}s; last: {detail.get('jobStatus')}")

    async def stop(self, job: str) -> None:
        await self.client.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})

    async def logs(self, job: str, **params: Any) -> str:
        data = await self.client.request("GET", f"/api/v2/jobs/{job}/logs", params=params, raw=True)
        return data.decode()


async def written(path: Path, timeout: float = 20.0) -> str:
    """The content of a file a task writes, once it is there and not empty."""
    for _ in range(int(timeout / 0.05)):
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} was not written in {timeout:.0f}s")


@pytest.fixture(autouse=True)
def tmp_path_open_to_tasks(request: pytest.FixtureRequest) -> None:
    """Tasks run as users of their own when the platform runs as root: a test
    that exchanges files with its tasks through tmp_path must let them in
    (write to it, and pass through the directories above it)."""
    if os.geteuid() != 0 or "tmp_path" not in request.fixturenames:
        return
    tmp_path: Path = request.getfixturevalue("tmp_path")
    tmp_path.chmod(0o1777)
    for parent in tmp_path.parents:
        if parent == Path("/") or parent == Path(tempfile.gettempdir()):
            break
        parent.chmod(parent.stat().st_mode | 0o011)


@contextlib.contextmanager
def supervised(plat: Platform) -> Iterator[None]:
    """Supervise a started platform as `pai up` does: a service that exits (a lease
    lost on a loaded machine ends its holder by design) is started again, rather than
    leaving every test after it a platform without it. What a test kills on purpose
    (Platform.kill_service) stays down until it starts it."""
    thread = threading.Thread(target=plat.supervise, name="test-platform-supervisor", daemon=True)
    thread.start()
    try:
        yield
    finally:
        plat.request_stop()
        thread.join(timeout=10)
        plat._stopping = False  # supervised no more; whoever started it still stops it


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory):
    plat = Platform(platform_config(tmp_path_factory.mktemp("pai")), print_fn=lambda *_: None)
    try:
        conn = plat.start()
        with supervised(plat):
            yield Api(plat, conn)
    finally:
        # Services idle in NATS drain on SIGTERM are killed after a moment instead of
        # awaited for up to 15 s (see _stop_quickly); tasks and NATS still stop as usual.
        from tests.chaos.harness import _stop_quickly  # here: the harness imports this module

        _stop_quickly(plat)


def job_yaml(name: str, commands: list[str], *, roles: dict[str, int] | None = None, retry: int = 0,
             vc: str = "default", extra: str = "") -> str:
    roles = roles or {"main": 1}
    lines = ["protocolVersion: 2", f"name: {name}", "type: job", f"jobRetryCount: {retry}", "taskRoles:"]
    for role, instances in roles.items():
        lines += [
            f"  {role}:",
            f"    instances: {instances}",
            "    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}",
            "    commands:",
        ]
        lines += [f"      - {json.dumps(c)}" for c in commands]  # JSON strings are valid YAML
    lines += ["defaults:", f"  virtualCluster: {vc}"]
    return "\n".join(lines) + "\n" + extra
