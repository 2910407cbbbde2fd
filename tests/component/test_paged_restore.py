"""Restores that read buckets in pages and keep only live work, against a real nats-server.

The launcher's records (pai_job_status) are seeded as the launcher writes them:
one job driven to SUCCEEDED by the real launcher core gives a record (with its
attempts, history and outbox), copied under other job ids and written with
`kv_write_many`, as the launcher's shell does. Then each service restores, as
its `body` does at start, over its own NATS user.

The tier `slow_restart` grows the bucket to PAI_RESTART_TIER_JOBS finished jobs
(default 20,000) and restores the launcher, the scheduler and the monitor.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import msgspec
import pytest

from libs.common import ids, service
from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.messages import JobState
from libs.common.records import JobRecord, encode_job_record
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket
from services.launcher.core import LauncherCore, Placed, Submitted
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning
from services.launcher.service import LauncherShell
from tests.unit.launcher.builders import job_spec, placement

TEMPLATE = "alice~paged-template"
LIVE_JOBS = 10


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


async def connect(server, user: str) -> Bus:
    return await Bus.connect(server.url, name=f"test-{user}", **server.login(user))


def finished_record(*, finished_at: float) -> JobRecord:
    """A one-task job run to SUCCEEDED by the launcher core, as it stores it."""
    clock = [finished_at - 60.0]
    core = LauncherCore(lambda: clock[0])
    spec = msgspec.structs.replace(job_spec(), name=TEMPLATE.split("~")[1], user="alice")
    core.handle(Submitted(job=TEMPLATE, spec=spec, at=clock[0], id=f"{TEMPLATE}/submitted"))
    record = core.job(TEMPLATE)
    core.handle(Placed(job=TEMPLATE, attempt=1, tasks=[placement(t) for t in record.current.tasks], id=f"{TEMPLATE}/1/placed"))
    key = TaskKey(job=TEMPLATE, attempt=1, role="worker", index=0, taskAttempt=0)
    core.handle(TaskRunning(key=key))
    clock[0] = finished_at
    core.handle(TaskFinished(key=key, exitCode=0))
    record = core.job(TEMPLATE)
    assert record.state is JobState.SUCCEEDED and record.outbox
    return record


def live_record(job: str, *, at: float) -> JobRecord:
    core = LauncherCore(lambda: at)
    user, name = job.split("~")
    spec = msgspec.structs.replace(job_spec(), name=name, user=user)
    core.handle(Submitted(job=job, spec=spec, at=at, id=f"{job}/submitted"))
    return core.job(job)


def copies(template: JobRecord, count: int, prefix: str) -> dict[str, bytes]:
    """`count` copies of the template's stored value under job ids of their own."""
    raw = encode_job_record(template)
    name = TEMPLATE.encode()
    return {
        ids.job_key(f"{prefix}{n:06d}".replace("-", "~", 1)): raw.replace(name, f"{prefix}{n:06d}".replace("-", "~", 1).encode())
        for n in range(count)
    }


async def seed(bus: Bus, values: dict[str, bytes]) -> None:
    items = list(values.items())
    for start in range(0, len(items), 500):
        await bus.kv_write_many(Bucket.JOB_STATUS, dict(items[start:start + 500]))


async def clear(bus: Bus) -> None:
    for bucket in (Bucket.JOB_STATUS, Bucket.SCHEDULE, Bucket.LEASES):
        await bus.js.purge_stream(f"KV_{bucket.value}")


def launcher_shell(bus: Bus, data_dir: Path) -> LauncherShell:
    from services.launcher.backends.local import LocalBackend

    ctx = ServiceContext(name="launcher", config=Config(grace_seconds=1.0), bus=bus)
    return LauncherShell(ctx, LauncherCore(time.time, kill_grace_seconds=1.0), LocalBackend(data_dir, grace_seconds=1.0))


async def test_launcher_restores_in_pages_keeping_live_jobs_whole_and_its_lease(nats_server, tmp_path, monkeypatch):
    """A launcher restoring thousands of finished jobs keeps renewing its lease
    throughout, holds only its live jobs whole, and loses none of the others."""
    admin = await connect(nats_server, "platform")
    bus = await connect(nats_server, "launcher")
    try:
        await clear(admin)
        now = time.time()
        finished = copies(finished_record(finished_at=now - 86400), 10_000, "alice-old")
        live = {ids.job_key(j): encode_job_record(live_record(j, at=now)) for j in (f"bob~live{n}" for n in range(LIVE_JOBS))}
        await seed(admin, finished | live)

        # A renewal every 0.05 s: restoring 10,000 records takes several such turns
        # even on a fast machine (2,000 took 0.05 s on one), and a restore that held
        # the event loop gets none.
        monkeypatch.setattr(service, "LEASE_SECONDS", 0.15)
        shell = launcher_shell(bus, tmp_path / "launcher")
        await service.hold_leadership(shell.ctx)
        leases = await bus.kv(Bucket.LEASES)
        before = (await leases.get("launcher")).revision
        await shell.restore()
        renewed = (await leases.get("launcher")).revision - before
        await asyncio.sleep(0.5)
        still_ours = (await leases.get("launcher")).revision - before > renewed

        assert renewed >= 1 and still_ours
        assert sorted(shell.core.job_ids()) == sorted(f"bob~live{n}" for n in range(LIVE_JOBS))
        assert len(shell._finished) == len(finished)
        # A finished job held compactly is still there whole when asked for.
        record = await shell._record("alice~old000123")
        assert record is not None and record.state is JobState.SUCCEEDED and record.job == "alice~old000123"
        shell.ctx.stopping.set()
        for task in shell.ctx.tasks:
            task.cancel()
        await shell.close()
    finally:
        await bus.close()
        await admin.close()


async def test_a_launcher_restart_publishes_no_finished_jobs_outbox_again(nats_server, tmp_path):
    """Only unfinished jobs' outboxes (and that of the last transaction before a
    crash) go out again: counted on the event stream before and after a restart."""
    admin = await connect(nats_server, "platform")
    bus = await connect(nats_server, "launcher")
    try:
        await clear(admin)
        now = time.time()
        old = finished_record(finished_at=now - 3600)
        finished = copies(old, 300, "carol-done")
        live = {ids.job_key(j): encode_job_record(live_record(j, at=now - 3600)) for j in (f"dave~live{n}" for n in range(3))}
        # The job whose final transaction was the last before the crash: its outbox may be unpublished.
        last = finished_record(finished_at=now - 1800)
        last_values = copies(last, 1, "erin-last")
        await seed(admin, finished | live | last_values)
        stored_before = (await admin.js.stream_info(STREAM)).state.messages

        shell = launcher_shell(bus, tmp_path / "launcher")
        await shell.restore()
        stored_after = (await admin.js.stream_info(STREAM)).state.messages
        await shell.close()

        # One WAITING state change per live job, and the last finished job's outbox.
        assert stored_after - stored_before == 3 + len(last.outbox)
    finally:
        await bus.close()
        await admin.close()


@pytest.mark.slow_restart
async def test_each_service_restarts_over_a_big_history(nats_server, tmp_path):
    """PAI_RESTART_TIER_JOBS finished jobs (default 20,000) and a few live ones:
    the launcher, scheduler and monitor each restore and are ready, holding the
    live jobs and losing none."""
    from services.monitor.service import start_cluster
    from services.scheduler.core import SchedulerCore
    from services.scheduler.service import SchedulerShell, cluster_config

    count = int(os.environ.get("PAI_RESTART_TIER_JOBS", "20000"))
    admin = await connect(nats_server, "platform")
    try:
        await clear(admin)
        now = time.time()
        finished = copies(finished_record(finished_at=now - 86400), count, "frank-old")
        live = {ids.job_key(j): encode_job_record(live_record(j, at=now)) for j in (f"gina~live{n}" for n in range(LIVE_JOBS))}
        await seed(admin, finished | live)
        del finished

        bus = await connect(nats_server, "launcher")
        shell = launcher_shell(bus, tmp_path / "launcher")
        started = time.monotonic()
        await shell.restore()
        took = {"launcher": time.monotonic() - started}
        assert len(shell.core.job_ids()) == LIVE_JOBS and len(shell._finished) == count
        await shell.close()
        await bus.close()

        bus = await connect(nats_server, "scheduler")
        config = Config()
        scheduler = SchedulerShell(ServiceContext(name="scheduler", config=config, bus=bus),
                                   SchedulerCore(cluster_config(config), clock=time.time))
        started = time.monotonic()
        await scheduler.restore()
        took["scheduler"] = time.monotonic() - started
        assert not scheduler.core.knows("frank~old000007")
        await bus.close()

        bus = await connect(nats_server, "monitor")
        # Bounds that hold every finished job restored, so that the count shows none lost by
        # the paged read (with the defaults it holds the latest 10,000: test_monitor_core).
        ctx = ServiceContext(name="monitor", config=Config(alert_probe_urls="-", live_finished_job_max=count,
                                                           live_finished_job_seconds=1e9), bus=bus)
        started = time.monotonic()
        intake = await start_cluster(ctx)
        took["monitor"] = time.monotonic() - started
        ctx.set_ready()
        assert ctx.ready
        assert intake.core.jobs_in("default", JobState.SUCCEEDED) == count
        assert intake.core.jobs_in("default", JobState.WAITING) == LIVE_JOBS
        ctx.stopping.set()
        for task in ctx.tasks:
            task.cancel()
        await bus.close()
        print(f"restore seconds over {count} finished jobs: {took}")
    finally:
        await admin.close()
