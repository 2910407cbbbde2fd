"""kill -9 the scheduler while jobs are queued and being placed: after its restart
every job runs exactly once, and never more of them at once than the VC holds."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.chaos.harness import (
    assert_each_task_started_once,
    chaos_job,
    kill,
    start,
    states,
    wait_all_final,
)

pytestmark = pytest.mark.chaos

# VC default holds 16 CPUs: four 4-CPU jobs at a time.
JOB_CPUS = 4
JOBS_AT_ONCE = 16 // JOB_CPUS


def record_span(span_dir: Path) -> tuple[str, str]:
    """Commands that note when a task begins and ends its work (wall clock, this machine)."""
    target = f"{span_dir}/$PAI_JOB_NAME.span"
    return f"echo begin $(date +%s.%N) >> {target}", f"echo end $(date +%s.%N) >> {target}"


def most_at_once(span_dir: Path) -> int:
    edges = []
    for path in span_dir.glob("*.span"):
        for line in path.read_text().splitlines():
            kind, at = line.split()
            edges.append((float(at), 0 if kind == "end" else 1))  # an end at the same instant comes first
    running = peak = 0
    for _, is_begin in sorted(edges):
        running += 1 if is_begin else -1
        peak = max(peak, running)
    return peak


async def test_jobs_queued_while_the_scheduler_is_killed_each_run_once(platform, starts_dir, tmp_path):
    tag = uuid.uuid4().hex[:6]
    spans = tmp_path / "spans"
    spans.mkdir()
    spans.chmod(0o1777)  # tasks run as their job's own uid and write here
    begin, end = record_span(spans)

    def body(name: str) -> str:
        return chaos_job(name, starts_dir, [begin, "sleep 1", end], cpu=JOB_CPUS)

    first = [f"sched-{n}-{tag}" for n in range(8)]
    # Submitted together, so the scheduler dies with some placed and some in the queue.
    await asyncio.gather(*(platform.submit(body(name)) for name in first))
    await kill(platform, "scheduler")
    # Submitted while no scheduler runs: they wait on the bus.
    later = [f"sched-late-{n}-{tag}" for n in range(3)]
    for name in later:
        await platform.submit(body(name))
    await start(platform, "scheduler")

    jobs = {f"admin~{name}": {"main": 1} for name in first + later}
    final = await wait_all_final(platform, jobs, timeout=60)
    assert states(final) == dict.fromkeys(jobs, "SUCCEEDED")
    assert_each_task_started_once(starts_dir, jobs)
    assert most_at_once(spans) <= JOBS_AT_ONCE
