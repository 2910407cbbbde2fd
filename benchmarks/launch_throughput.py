"""Launch throughput of the local backend: trivial tasks started and finished per second.

Starts N tasks that run `true`, as fast as they are accepted, and waits for
every exit. Two paths:
- `backend`: straight through `LocalBackend` (start, events);
- `core`: N one-task jobs through the launcher core and the backend together
  (submitted, placed, StartTask -> backend, backend events -> core in batches
  as the launcher's shell takes them, ForgetTask -> backend); no bus, so it
  measures the launcher itself. It also counts what the shell would send to
  NATS per job: records written (one per SaveJob) and events published.

Reports per path, as JSON: tasks started and finished per second, the CPU time
all of it took per task (launcher, fork server, shims and the tasks' bash; the
figure that does not depend on what else runs on the machine; and
`launcher_cpu_ms_per_task`, this process's part alone: the launcher's side
of it, without the fork server, shims and tasks), the latency
from `start()` to TaskRunning (in a burst of N this is mostly queueing), and
from the task's exit (the shim's reap time, `finishedAt` in its exit record) to
TaskFinished reaching the consumer, p50 and p99. `one_at_a_time` starts tasks
one after another on an idle backend, each after the previous ended: the
latency a single job sees. Other load on the machine shows in the figures:
`load_average` is printed too, and `cpu_bound_tasks_per_s` (cpus divided by
CPU time per task) is the rate an otherwise idle machine would allow, and
`python_loop_s` the machine's speed when the run began (a fixed Python loop:
compare runs taken at different times with it). Each task creates its record
(one file), and its working directory unless it takes over one an ended task
left bare, so the filesystem of the data dir matters (`--dir`, default: the
temp dir; `data_dir_filesystem` names it).

As root, tasks run as the launcher runs them, under a uid per job with no
groups (local_users; the shim forks and drops privileges for each), unless
`--task-user none` (then they run as root, spawned with posix_spawn).

    python benchmarks/launch_throughput.py [--tasks 1000] [--path backend|core|both]
        [--single 50] [--dir /var/tmp] [--task-user none|NAME] [--in-flight 64]

`--in-flight N` (backend path) starts a task only while fewer than N are
unfinished, as 64 slots would: the steady state of a busy node, where an ended
task's cgroups are handed to the next (the pool, local_limits), rather than
a burst of N tasks at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stats import filesystem_of, percentile, python_loop_seconds  # noqa: E402
from libs.common.messages import JobState, TaskPlacement  # noqa: E402
from libs.common.protocol.model import JobSpec, Resources, TaskRole  # noqa: E402
from services.launcher.backends.local import LocalBackend  # noqa: E402
from services.launcher.backends.local_layout import TaskFiles, read_task_exit  # noqa: E402
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskLaunch, TaskRunning  # noqa: E402

# Imported here, not in the measured run: the launcher's shell brings in the NATS client.
from services.launcher.service import BATCH_MAX, backend_batches  # noqa: E402


def cpu_seconds() -> float:
    """CPU time of this process and of every process it waited for: the fork
    server, which reaps its shims, which reap their tasks."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def own_cpu_seconds() -> float:
    """CPU time of this process alone: the launcher's side (core, backend), without
    the fork server, the shims and the tasks."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def summary_ms(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": _ms(percentile(values, 50)),
        "p99": _ms(percentile(values, 99)),
        "max": _ms(max(values) if values else None),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


class Timings:
    """When each task was started, seen running, and seen finished."""

    def __init__(self) -> None:
        self.started: dict[TaskKey, float] = {}
        self.running: dict[TaskKey, float] = {}
        self.finished: dict[TaskKey, float] = {}
        self.exit_codes: dict[TaskKey, int] = {}

    def report(self, backend: LocalBackend, tasks: int, began: float, all_started: float, ended: float) -> dict:
        exit_to_recorded = []
        for key, seen in self.finished.items():
            record = read_task_exit(TaskFiles(str(backend.tasks_dir / key.slug)))
            if record is not None and record.finishedAt:
                exit_to_recorded.append(seen - record.finishedAt)
        to_running = [self.running[k] - self.started[k] for k in self.running if k in self.started]
        failed = sum(1 for code in self.exit_codes.values() if code != 0)
        return {
            "tasks": tasks,
            "failed": failed,
            "started_per_s": round(tasks / (all_started - began), 1),
            "finished_per_s": round(tasks / (ended - began), 1),
            "seconds": round(ended - began, 3),
            "start_to_running_ms": summary_ms(to_running),
            "exit_to_recorded_ms": summary_ms(exit_to_recorded),
        }


def trivial_launch(index: int) -> TaskLaunch:
    key = TaskKey(job=f"bench~t{index}", attempt=0, role="main", index=0)
    return TaskLaunch(
        key=key,
        vc="default",
        user="bench",
        placement=TaskPlacement(role="main", index=0, node="node-0"),
        commands=["true"],
        env={},
        memoryMB=256,
    )


# What the launcher's config gives (libs.common.config: task_user ""): as root,
# a uid per job with the default task user's group.
TASK_USER: str | None = ""
IN_FLIGHT = 0  # --in-flight: at most this many tasks unfinished at once (0: all started at once)
LIMITS = "auto"  # --limits: cgroup v2 where allowed (a cgroup made and removed per task), else rlimit


async def through_backend(data_dir: Path, tasks: int) -> dict:
    backend = LocalBackend(data_dir, task_user=TASK_USER, limits=LIMITS)
    await backend.recover()
    timings = Timings()
    done = asyncio.Event()
    slot_freed = asyncio.Event()

    async def watch() -> None:
        async for event in backend.events():
            now = time.time()
            if isinstance(event, TaskRunning):
                timings.running[event.key] = now
            elif isinstance(event, TaskFinished):
                timings.finished[event.key] = now
                timings.exit_codes[event.key] = event.exitCode
                slot_freed.set()
                if len(timings.finished) == tasks:
                    done.set()

    watcher = asyncio.create_task(watch())
    began = time.time()
    for index in range(tasks):
        if IN_FLIGHT:
            while index - len(timings.finished) >= IN_FLIGHT:
                slot_freed.clear()  # a slot frees as a task ends (the platform's slots)
                await slot_freed.wait()
        launch = trivial_launch(index)
        timings.started[launch.key] = time.time()
        await backend.start(launch)
    all_started = time.time()
    await done.wait()
    ended = time.time()
    report = timings.report(backend, tasks, began, all_started, ended)
    await backend.close()
    watcher.cancel()
    return report


async def one_at_a_time(data_dir: Path, tasks: int) -> dict:
    backend = LocalBackend(data_dir, task_user=TASK_USER, limits=LIMITS)
    await backend.recover()
    events = backend.events()
    to_running, to_finished = [], []
    for index in range(tasks):
        began = time.time()
        await backend.start(trivial_launch(index))
        async for event in events:
            if isinstance(event, TaskRunning):
                to_running.append(time.time() - began)
            elif isinstance(event, TaskFinished):
                to_finished.append(time.time() - began)
                break
    await backend.close()
    return {
        "tasks": tasks,
        "start_to_running_ms": summary_ms(to_running),
        "start_to_finished_ms": summary_ms(to_finished),
    }


def one_task_job(index: int) -> JobSpec:
    role = TaskRole(name="main", resources=Resources(cpu=1, memoryMB=256), commands=["true"])
    return JobSpec(name=f"j{index}", user="bench", taskRoles=[role])


async def through_core(data_dir: Path, tasks: int) -> dict:
    from services.launcher.core import (
        ForgetTask,
        KillTask,
        LauncherCore,
        Placed,
        Publish,
        SaveJob,
        StartTask,
        Submitted,
    )

    core = LauncherCore(time.time)
    backend = LocalBackend(data_dir, task_user=TASK_USER, limits=LIMITS)
    await backend.recover()
    timings = Timings()
    done = asyncio.Event()
    ended_jobs = 0
    effects = {"records_written": 0, "events_published": 0, "core_calls_for_backend_events": 0}

    async def carry_out(actions: list) -> None:
        for action in actions:
            if isinstance(action, SaveJob):
                effects["records_written"] += 1
            elif isinstance(action, Publish):
                effects["events_published"] += 1
            elif isinstance(action, StartTask):
                timings.started[action.launch.key] = time.time()
                await backend.start(action.launch)
            elif isinstance(action, ForgetTask):
                await backend.forget(action.key)
            elif isinstance(action, KillTask):
                await backend.kill(action.key, grace_seconds=action.grace_seconds, reason=action.reason)
            # SaveJob, Publish, StartTimer: the bus's part, not measured here

    async def watch() -> None:
        nonlocal ended_jobs
        # (The launcher's shell also holds a task's running report a moment for
        # its end under load, core/held.py; not reproduced here.)
        async for batch in backend_batches(backend, BATCH_MAX):
            now = time.time()
            for event in batch:
                if isinstance(event, TaskRunning):
                    timings.running[event.key] = now
                elif isinstance(event, TaskFinished):
                    timings.finished[event.key] = now
                    timings.exit_codes[event.key] = event.exitCode
            effects["core_calls_for_backend_events"] += 1
            await carry_out(core.handle(*batch))
            for event in batch:
                if isinstance(event, TaskFinished):
                    record = core.job(event.key.job)
                    if record is not None and record.state.is_final:
                        ended_jobs += 1
                        if ended_jobs == tasks:
                            done.set()

    watcher = asyncio.create_task(watch())
    began = time.time()
    for index in range(tasks):
        spec = one_task_job(index)
        job = f"{spec.user}~{spec.name}"
        actions = core.handle(Submitted(job=job, spec=spec, at=time.time(), id=f"bench/{job}"))
        record = core.job(job)
        assert record is not None
        placement = TaskPlacement(role="main", index=0, node="node-0")
        actions += core.handle(
            Placed(job=job, attempt=record.attempt, tasks=[placement], id=f"bench/{job}/placed")
        )
        await carry_out(actions)
    all_started = time.time()
    await done.wait()
    ended = time.time()
    report = timings.report(backend, tasks, began, all_started, ended)
    report.update({f"{name}_per_job": round(count / tasks, 2) for name, count in effects.items()})
    report["jobs_succeeded"] = sum(
        1 for job in core.job_ids() if (r := core.job(job)) is not None and r.state == JobState.SUCCEEDED
    )
    await backend.close()
    watcher.cancel()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--path", choices=("backend", "core", "both"), default="both")
    parser.add_argument("--single", type=int, default=50, help="tasks for one_at_a_time (0: skip)")
    parser.add_argument("--dir", default=None, help="where the data dirs are made (default: temp dir)")
    parser.add_argument(
        "--task-user", default="", help="as root, the task user (default: the launcher's); 'none': tasks run as root"
    )
    parser.add_argument("--limits", choices=("auto", "cgroup", "rlimit", "none"), default="auto")
    parser.add_argument(
        "--in-flight", type=int, default=0,
        help="backend path: at most this many tasks unfinished at once, as a node's slots hold them (0: no bound)",
    )
    args = parser.parse_args()
    global TASK_USER, LIMITS, IN_FLIGHT
    LIMITS = args.limits
    IN_FLIGHT = max(0, args.in_flight)
    TASK_USER = None if args.task_user == "none" else args.task_user
    data_dir_parent = args.dir or tempfile.gettempdir()
    results: dict = {
        "benchmark": "launch_throughput",
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python_loop_s": python_loop_seconds(),  # the machine's speed now (stats.python_loop_seconds)
        "target_tasks_per_s": 500,
        "data_dir_parent": data_dir_parent,
        "data_dir_filesystem": filesystem_of(data_dir_parent),
        # fork + setuid per task (as the launcher runs as root), or posix_spawn
        "tasks_run_as": "uid per job" if TASK_USER is not None and os.geteuid() == 0 else "launcher's user",
        "limits_asked": args.limits,
        "in_flight": args.in_flight or None,
    }
    paths = ("backend", "core") if args.path == "both" else (args.path,)
    for path in paths:
        with tempfile.TemporaryDirectory(prefix="pai-launch-bench-", dir=args.dir) as tmp:
            run = through_backend if path == "backend" else through_core
            cpu_before, own_before = cpu_seconds(), own_cpu_seconds()
            results[path] = asyncio.run(run(Path(tmp), args.tasks))
            cpu_per_task = (cpu_seconds() - cpu_before) / args.tasks
            results[path]["cpu_ms_per_task"] = round(cpu_per_task * 1000, 3)
            results[path]["launcher_cpu_ms_per_task"] = round((own_cpu_seconds() - own_before) / args.tasks * 1000, 3)
            results[path]["cpu_bound_tasks_per_s"] = round((os.cpu_count() or 1) / cpu_per_task, 1)
    if args.single:
        with tempfile.TemporaryDirectory(prefix="pai-launch-bench-", dir=args.dir) as tmp:
            results["one_at_a_time"] = asyncio.run(one_at_a_time(Path(tmp), args.single))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
