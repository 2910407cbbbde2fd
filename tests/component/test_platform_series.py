"""The series that tell an operator how the platform itself is, against a real
nats-server with PAI's per-service permissions:

- pai_leader: a single-active service's standby exports 0, and 1 once it took the lease;
- pai_build_info: the version and commit this process runs;
- JetStream's fill, read by the monitor as its own NATS user from JetStream's API:
  bytes and messages of the stream and every bucket against their limits, and the store.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import subprocess
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from libs.common import shell_metrics
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.service import ServiceContext, hold_leadership
from libs.common.subjects import STREAM, Bucket
from services.monitor import store_fill
from tests.fixtures.settings import IN_PROCESS_ENV

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # the lease bucket's "launcher" key is this module's alone


@pytest.fixture(scope="module")
async def platform(nats_server):
    bus = await Bus.connect(nats_server.url, name="series-platform", **nats_server.login("platform"))
    await bus.bootstrap()
    yield bus
    await bus.close()


async def context(nats_server, user: str, replica: str, tmp_path: Path) -> ServiceContext:
    bus = await Bus.connect(nats_server.url, name=f"series-{user}-{replica}", **nats_server.login(user))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path / replica), replica=replica)
    return ServiceContext(name=user, config=config, bus=bus)


async def close(ctx: ServiceContext) -> None:
    ctx.stopping.set()
    for task in ctx.tasks:
        task.cancel()
    await ctx.bus.close()


async def test_the_standby_exports_0_and_1_once_it_leads(nats_server, platform, tmp_path):
    first = await context(nats_server, "launcher", "a", tmp_path)
    second = await context(nats_server, "launcher", "b", tmp_path)
    try:
        await hold_leadership(first)
        assert sample("pai_leader", service="launcher") == 1
        waiting = asyncio.ensure_future(hold_leadership(second))
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the lease is the first's"
        assert sample("pai_leader", service="launcher") == 0, "the standby's process says it does not lead"
        # The leader goes away (its renewals stopped, its lease removed as at a clean stop).
        await close(first)
        await (await platform.kv(Bucket.LEASES)).delete("launcher")
        await asyncio.wait_for(waiting, 20)
        assert sample("pai_leader", service="launcher") == 1
    finally:
        for ctx in (first, second):
            if not ctx.bus.nc.is_closed:
                await close(ctx)


def test_build_info_names_the_version_and_the_checkouts_commit():
    shell_metrics.record_build("rest")
    version = importlib.metadata.version("pai")
    if (REPO / ".git").exists():
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    else:
        commit = "unknown"
    assert sample("pai_build_info", service="rest", version=version, commit=commit) == 1


def test_a_build_commit_given_to_the_image_wins(monkeypatch):
    monkeypatch.setenv("PAI_BUILD_COMMIT", "0123abc")
    assert shell_metrics.commit() == "0123abc"


def test_the_commit_of_a_checkout_read_from_its_files(tmp_path):
    git = tmp_path / "repo" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text("# pack-refs with: peeled\n" + "a" * 40 + " refs/heads/main\n")
    assert shell_metrics.checkout_commit(tmp_path / "repo") == "a" * 40
    (git / "refs" / "heads" / "main").write_text("b" * 40 + "\n")  # a loose ref is newer than the packed one
    assert shell_metrics.checkout_commit(tmp_path / "repo") == "b" * 40
    worktree = tmp_path / "wt"
    (git / "worktrees" / "wt").mkdir(parents=True)
    (git / "worktrees" / "wt" / "HEAD").write_text("c" * 40 + "\n")  # detached
    (git / "worktrees" / "wt" / "commondir").write_text("../..\n")
    worktree.mkdir()
    (worktree / ".git").write_text(f"gitdir: {git / 'worktrees' / 'wt'}\n")
    assert shell_metrics.checkout_commit(worktree) == "c" * 40
    assert shell_metrics.checkout_commit(tmp_path / "nothing") == ""


async def test_the_monitor_reads_jetstreams_fill_as_its_own_user(nats_server, platform, tmp_path):
    nodes = await platform.kv(Bucket.NODES)
    for i in range(3):
        await nodes.put(f"fill-{uuid.uuid4().hex[:6]}-{i}", b"x" * 1000)
    monitor = await context(nats_server, "monitor", "m", tmp_path)
    try:
        await store_fill.read_once(monitor)  # as the monitor: its permissions allow exactly this
    finally:
        await close(monitor)
    truth = await platform.js.stream_info(f"KV_{Bucket.NODES.value}")
    labels = {"stream": f"KV_{Bucket.NODES.value}", "bucket": Bucket.NODES.value}
    assert sample("pai_jetstream_stream_bytes", **labels) == truth.state.bytes >= 3000
    assert sample("pai_jetstream_stream_messages", **labels) == truth.state.messages >= 3
    assert sample("pai_jetstream_stream_max_bytes", **labels) == truth.config.max_bytes > 0, "every bucket has a limit"
    events = {"stream": STREAM, "bucket": ""}
    assert sample("pai_jetstream_stream_max_bytes", **events) == (await platform.js.stream_info(STREAM)).config.max_bytes
    for bucket in Bucket:
        assert sample("pai_jetstream_stream_bytes", stream=f"KV_{bucket.value}", bucket=bucket.value) is not None
    store = sample("pai_jetstream_store_bytes")
    assert store is not None and store >= truth.state.bytes
