"""PAI on a three-node JetStream cluster (each node in a network namespace of its own,
the store bootstrapped with replicas 3): one node is cut off the network
mid-workload, the one leading the event stream, so the stream elects a new leader
and every service that talked to that node moves to another. Every job still ends
in its right state, none is lost, no task attempt starts twice; once the link is
back the node catches up with what it missed.

Needs root (network namespaces); skipped with the reason where `ip netns` is not
permitted.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import pytest

from libs.common import busauth
from libs.common.bus import Bus
from libs.common.natsserver import NamespaceNetwork
from libs.common.subjects import STREAM
from tests.chaos.harness import (
    assert_each_task_started_once,
    chaos_job,
    start_cluster_platform,
    states,
    stop_platform,
    wait_all_final,
)

# A long scenario: `make test-slow` runs it, `make test` (CI) does not.
pytestmark = [pytest.mark.chaos, pytest.mark.slow]

NODES = 3


@pytest.fixture
def work_dir():
    """Where the platform's data and the tasks' start logs live: a directory of its
    own under the system's temporary directory, not pytest's tmp_path, because a
    pytest session starting meanwhile makes `/tmp/pytest-of-<user>` 0700 again,
    and the tasks (which run as uids of their own) could then no longer reach
    their start logs or working directories beneath it."""
    path = Path(tempfile.mkdtemp(prefix="pai-nats-cluster-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def starts_dir(work_dir):
    path = work_dir / "starts"
    path.mkdir()
    path.chmod(0o1777)  # each task writes its own start log, as its job's uid
    return path


@pytest.fixture
async def cluster_platform(work_dir):
    why = NamespaceNetwork.unavailable()
    if why:
        pytest.skip(f"a NATS cluster in network namespaces cannot run here: {why}")
    api = await start_cluster_platform(work_dir / "pai", size=NODES)
    prefix = api.platform.cluster.network.prefix
    try:
        yield api
    finally:
        await stop_platform(api)
    # Torn down: no namespace, bridge or link of this cluster is left behind.
    left = [line for command in (["ip", "netns", "list"], ["ip", "-br", "link"])
            for line in subprocess.run(command, capture_output=True, text=True).stdout.splitlines() if prefix in line]
    assert left == [], f"left behind by the NATS cluster: {left}"


async def stream_leader(cluster) -> tuple[int, str]:
    """(node index, server name) of the node leading the event stream."""
    bus = await Bus.connect(cluster.url, name="test-probe", **cluster.login(busauth.PLATFORM))
    try:
        info = await bus.js.stream_info(STREAM)
    finally:
        await bus.close()
    assert info.config.num_replicas == NODES, info.config
    leader = info.cluster.leader
    return int(leader.rsplit("-", 1)[1]), leader


async def replicas_lagging(cluster, timeout: float) -> list[str]:
    """Wait until every node holding the event stream is current; the ones still
    lagging or offline when `timeout` passes (empty: all caught up)."""
    deadline = time.monotonic() + timeout
    lagging = ["(the cluster never answered)"]
    while time.monotonic() < deadline:
        try:
            bus = await Bus.connect(cluster.url, name="test-probe", connect_timeout=5, **cluster.login(busauth.PLATFORM))
            try:
                info = await bus.js.stream_info(STREAM)
            finally:
                await bus.close()
            lagging = [p.name for p in info.cluster.replicas or [] if not p.current or p.offline]
            if not lagging:
                return []
        except Exception as exc:  # noqa: BLE001 - the cluster is still settling: ask again
            lagging = [repr(exc)]
        await asyncio.sleep(0.5)
    return lagging


@pytest.mark.timeout(240)
async def test_a_nats_node_cut_off_mid_workload_loses_no_job_and_runs_no_task_twice(cluster_platform, starts_dir):
    api = cluster_platform
    cluster = api.platform.cluster
    tag = uuid.uuid4().hex[:6]
    # Five 4-CPU jobs on the 16 CPUs of VC default: four run when the node is cut,
    # one waits in the queue; a two-role job in VC research beside them, and one
    # job that fails (exit 1, no retry) and must end FAILED, not SUCCEEDED.
    expected: dict[str, str] = {}
    roles: dict[str, dict[str, int]] = {}
    for n in range(5):
        job = f"admin~cluster-{n}-{tag}"
        await api.submit(chaos_job(job.split("~")[1], starts_dir, ["sleep 3"], cpu=4))
        expected[job], roles[job] = "SUCCEEDED", {"main": 1}
    multi = f"admin~cluster-multi-{tag}"
    roles[multi] = {"ps": 1, "worker": 2}
    await api.submit(chaos_job(multi.split("~")[1], starts_dir, ["sleep 3"], roles=roles[multi], vc="research"))
    expected[multi] = "SUCCEEDED"
    failing = f"admin~cluster-fails-{tag}"
    await api.submit(chaos_job(failing.split("~")[1], starts_dir, ["sleep 1", "exit 1"], vc="research"))
    expected[failing], roles[failing] = "FAILED", {"main": 1}
    await api.wait_state(next(iter(expected)), "RUNNING", timeout=60)

    node, leader = await stream_leader(cluster)
    # `pai up`'s supervisor (Kubernetes, in the chart) starts again a service
    # that exits: one whose NATS request timed out while its node was away does.
    restarted: list[str] = []
    supervising = asyncio.ensure_future(supervise(api, restarted))
    await asyncio.to_thread(cluster.cut, node)
    cut_at = time.monotonic()
    try:
        # Submitted while the node is away: the client retries a refused or
        # timed-out submit, as a user would; a retry of a job that did get in is
        # answered 409 and changes nothing.
        late = f"admin~cluster-late-{tag}"
        await submit_until_taken(api, chaos_job(late.split("~")[1], starts_dir, ["sleep 1"], cpu=4), late, timeout=60)
        expected[late], roles[late] = "SUCCEEDED", {"main": 1}

        final = await wait_all_final(api, expected, timeout=120)
        print(f"cut {leader} (leader of {STREAM}); all jobs final {time.monotonic() - cut_at:.1f}s later; "
              f"services restarted meanwhile: {restarted or 'none'}")
    finally:
        await asyncio.to_thread(cluster.heal, node)

    assert states(final) == expected, {
        job: ((d or {}).get("jobStatus", {}).get("appExitSpec"), (d or {}).get("jobStatus", {}).get("appExitDiagnostics"))
        for job, d in final.items() if states({job: d})[job] != expected[job]
    }
    assert_each_task_started_once(starts_dir, roles)
    for service in restarted:
        warnings.warn(f"{service} exited while a NATS node was cut off; started again", stacklevel=1)

    # Healed: the node is back in the stream's replica set and current.
    assert await replicas_lagging(cluster, timeout=60) == [], f"{leader} did not catch up after its link came back"
    # And the platform takes new work as before.
    after = f"admin~cluster-after-{tag}"
    await submit_until_taken(api, chaos_job(after.split("~")[1], starts_dir, ["true"]), after, timeout=60)
    final = await wait_all_final(api, [after], timeout=60)
    assert states(final) == {after: "SUCCEEDED"}
    supervising.cancel()


async def supervise(api, restarted: list[str]) -> None:
    """One round of `Platform.restart_what_died` a second, what it restarted noted."""
    while True:
        restarted += await asyncio.to_thread(api.platform.restart_what_died)
        await asyncio.sleep(1.0)


async def submit_until_taken(api, body: str, job: str, timeout: float) -> None:
    from cli.client import ApiError

    deadline = time.monotonic() + timeout
    while True:
        try:
            await api.submit(body)
            return
        except ApiError as exc:
            if exc.status == 409:  # an earlier try got in after all
                return
            failure: Exception = exc
        except Exception as exc:  # noqa: BLE001 - rest unreachable or slow: retry
            failure = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"submitting {job} failed for {timeout:.0f}s: {failure!r}")
        await asyncio.sleep(1.0)
