"""A scheduler restarting on a stale pai_schedule bucket, against a real nats-server:
what the launcher's job documents say wins (services/scheduler/core/truth.py)."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import nats.js.errors
import pytest

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.messages import JobPlaced, JobState, subject_of
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.records import AttemptRecord, JobRecord as LauncherRecord, TaskRecord, encode_job_record
from libs.common.schedule import ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket
from services.scheduler.cluster import local_cluster_config
from services.scheduler.core import Place, SchedulerCore, Submit
from services.scheduler.service import SchedulerShell
from tests.conftest import platform_bus

RUN = uuid.uuid4().hex[:6]
CLUSTER = dict(node="node-a", gpus=0, cpus=4, memory_mb=8192)


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """The scheduler restores from whole buckets: a server of this module's own."""
    return own_nats_server


@pytest.fixture
async def admin(nats_server):
    async with platform_bus(nats_server) as bus:
        yield bus


def whole_node_spec(job: str) -> JobSpec:
    user, name = job.split("~")
    return JobSpec(name=name, user=user, virtualCluster="default",
                   taskRoles=[TaskRole(name="worker", instances=1, resources=Resources(gpu=0, cpu=4, memoryMB=4096))])


async def last_placed(bus: Bus, job: str) -> JobPlaced | None:
    subject = subject_of(JobPlaced(id="", job=job, vc="default", attempt=1, tasks=[]))
    try:
        msg = await bus.js.get_last_msg(STREAM, subject)
    except nats.js.errors.NotFoundError:
        return None
    return msgspec.json.decode(msg.data, type=JobPlaced)


async def test_a_stale_placement_of_a_finished_job_frees_its_cells_and_the_waiting_job_is_placed(admin, nats_server):
    finished, waiting = f"alice~done{RUN}", f"bob~next{RUN}"
    # Where the finished job ran: the whole node, as a scheduler placed it.
    probe = SchedulerCore(local_cluster_config(**CLUSTER), clock=time.time)
    [place] = [d for d in probe.handle(Submit(job=finished, attempt=1, spec=whole_node_spec(finished))) if isinstance(d, Place)]

    schedule = await admin.kv(Bucket.SCHEDULE)
    # The scheduler's bucket still says the finished job holds the node (its release was lost to it) ...
    await schedule.put(ids.job_key(finished), msgspec.json.encode(ScheduleEntry(
        job=finished, attempt=1, vc="default", placed=True, tasks=place.tasks, spec=whole_node_spec(finished),
        queuedAt=time.time() - 60)))
    # ... and has the next job waiting for that node.
    await schedule.put(ids.job_key(waiting), msgspec.json.encode(ScheduleEntry(
        job=waiting, attempt=1, vc="default", placed=False, reason="no room", spec=whole_node_spec(waiting),
        queuedAt=time.time() - 30)))
    # The launcher knows better: the job ended and its attempt was released.
    tasks = [TaskRecord(role=t.role, index=t.index, node=t.node, leafCells=list(t.leafCells), startRequested=True,
                        completedTime=time.time() - 10, exitCode=0) for t in place.tasks]
    await (await admin.kv(Bucket.JOB_STATUS)).put(ids.job_key(finished), encode_job_record(LauncherRecord(
        job=finished, name=finished.split("~")[1], user="alice", vc="default", spec=whole_node_spec(finished),
        state=JobState.SUCCEEDED, completedTime=time.time() - 10, attempts=[AttemptRecord(
            attempt=1, state=JobState.SUCCEEDED, completedTime=time.time() - 10, released=True, tasks=tasks)])))

    bus = await Bus.connect(nats_server.url, name="scheduler", **nats_server.login("scheduler"))
    try:
        ctx = ServiceContext(name="scheduler", config=Config(), bus=bus)
        core = SchedulerCore(local_cluster_config(**CLUSTER), clock=time.time)
        shell = SchedulerShell(ctx, core)
        await asyncio.wait_for(shell.restore(), 60)
        core.validate_state()

        placed = await last_placed(admin, waiting)
        assert placed is not None and placed.attempt == 1
        assert [t.node for t in placed.tasks] == ["node-a"]
        # The stale entry is gone from the bucket, the waiting job's entry says placed.
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await schedule.get(ids.job_key(finished))
        stored = msgspec.json.decode((await schedule.get(ids.job_key(waiting))).value, type=ScheduleEntry)
        assert stored.placed
        # The finished job's placement was not announced again to the launcher.
        assert await last_placed(admin, finished) is None
    finally:
        await bus.close()
        for key in (finished, waiting):
            for bucket in (Bucket.SCHEDULE, Bucket.JOB_STATUS):
                try:
                    await (await admin.kv(bucket)).purge(ids.job_key(key))
                except nats.js.errors.Error:
                    pass
