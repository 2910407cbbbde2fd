"""The history projection in a process of its own (`history_projection: process`).

rest starts one per rest process (`supervise`) once the database is migrated, and
starts it again whenever it exits. It runs the projection consumer and the expiry
sweep (consumer.py, expiry.py) as rest's loop ran them inline, on a NATS connection
of its own with rest's login.

Why a process: on rest's loop the projection (about 1.5 ms of CPU per job: decoding,
rows, SQLite through aiosqlite's thread, acks) held the loop every submission waits
on, and took the GIL from it. Here it runs at a lower CPU priority
(`history_projection_nice`): on a busy machine the API is served first and the
projection catches up in larger batches once the burst has passed. Waiting loses
nothing: the events stay in the stream until applied, and rest lays the jobs the
history does not hold yet over every list and read (overlay.py, jobs_api.py).

It ends with rest: the kernel kills it when rest dies (PR_SET_PDEATHSIG), and rest
stops it with SIGTERM when rest stops. A kill at any moment is a crash the consumer
already survives: a batch is acked only after its transaction committed, and a
replay changes nothing.

    python -m services.rest.history.projector <rest's pid>
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys

from libs.common import busauth, service, telemetry
from libs.common.bus import Bus
from libs.common.config import Config, load_config
from libs.common.service import ServiceContext, exit_when_bus_closed
from services.rest.history import consumer, expiry, store

log = logging.getLogger("pai.rest.history")

# After the process exited (a crash, NATS gone for good), rest starts it again after this.
RESTART_SECONDS = 1.0
# rest's stop waits this long for the process to close its connections (a batch in
# flight is abandoned, unacked: it comes back), then kills it.
STOP_WAIT_SECONDS = 10.0
ORPHAN_CHECK_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1


def command(parent: int) -> list[str]:
    return [sys.executable, "-m", __name__, str(parent)]


async def supervise(config: Config, stopping: asyncio.Event) -> None:
    """Run the projection process until `stopping` (or cancelled), starting it again
    whenever it exits; stop it on the way out."""
    env = {**os.environ, **config.to_env()}
    while not stopping.is_set():
        proc = await asyncio.create_subprocess_exec(*command(os.getpid()), env=env, stdin=asyncio.subprocess.DEVNULL)
        log.info("history projection: process %d started", proc.pid)
        _lower_priority(proc.pid, config.history_projection_nice)
        try:
            exited = asyncio.ensure_future(proc.wait())
            stop = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({exited, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if stopping.is_set():
                return
            log.warning("history projection: process %d exited with %s; starting it again in %.0fs",
                        proc.pid, proc.returncode, RESTART_SECONDS)
        finally:
            await _stop(proc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), RESTART_SECONDS)


def _lower_priority(pid: int, nice: int) -> None:
    """The process's niceness raised by `nice` (from its start: its imports too)."""
    if nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    except OSError as exc:  # gone already, or not allowed: it runs at rest's priority
        log.warning("history projection: could not lower the priority of process %d (%r)", pid, exc)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), STOP_WAIT_SECONDS)
    except TimeoutError:
        log.warning("history projection: process %d did not stop in %.0fs; killing it", proc.pid, STOP_WAIT_SECONDS)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def _die_with(parent: int) -> None:
    """SIGKILL when `parent` (rest) dies, so no projection outlives the rest that started it
    (Linux; elsewhere `_stop_when_orphaned` notices within a second)."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("history projection: PR_SET_PDEATHSIG failed (errno %d)", ctypes.get_errno())
    if os.getppid() != parent:  # rest died before the line above took effect
        os._exit(0)


async def _stop_when_orphaned(parent: int, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        if os.getppid() != parent:
            log.warning("history projection: rest (%d) is gone; stopping", parent)
            stopping.set()
            return
        await asyncio.sleep(ORPHAN_CHECK_SECONDS)


async def _run(config: Config, parent: int) -> None:
    bus = await Bus.connect(config.nats_url, name="pai-rest-history", **busauth.login_of_config(config))
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ctx.stopping.set)
    # rest migrated the database before starting this process: only the engine here.
    engine = store.open_engine(store.dsn_for(config.history_dsn, config.data_path))
    work = [asyncio.ensure_future(consumer.run(bus, engine, ctx.stopping)),
            asyncio.ensure_future(expiry.run(ctx, engine, ctx.stopping)),
            asyncio.ensure_future(exit_when_bus_closed(ctx)),
            asyncio.ensure_future(_stop_when_orphaned(parent, ctx.stopping))]
    try:
        done, _ = await asyncio.wait([*work, asyncio.ensure_future(ctx.stopping.wait())],
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task in work and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
        await engine.dispose()
        await bus.close()


def main(argv: list[str]) -> None:
    parent = int(argv[1])
    _die_with(parent)
    config = load_config()
    service.collect_young_less_often()  # every event a job makes is decoded and turned into rows here
    telemetry.setup("rest-history", level=config.log_level, otlp_endpoint=config.otlp_endpoint)
    try:
        asyncio.run(_run(config, parent))
    except KeyboardInterrupt:
        pass
    except Exception:
        log.exception("history projection crashed")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
