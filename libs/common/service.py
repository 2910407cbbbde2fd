"""The shell every PAI service runs in: logs, bus, leader lease, health and metrics HTTP.

A service provides `body(ctx)`: rebuild state, call `ctx.set_ready()`, then consume
until `ctx.stopping` is set. An exception escaping `body` is a bug: it is logged
and the process exits non-zero so its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import nats.errors
import nats.js.errors
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from libs.common import busauth, heap, http_server, shell_metrics, telemetry
from libs.common.bus import Bus
from libs.common.bus.publish import PUBLISH_TROUBLE
from libs.common.config import Config
from libs.common.subjects import Bucket

log = logging.getLogger("pai.service")

LEASE_SECONDS = 10.0
# What a lease renewal may meet while NATS fails over or restarts (what any publish may
# meet, e.g. no stream answering yet while a restarted server recovers its store, and
# our own bound on a try); retried within the lease, each try bounded so that several
# fit in it.
LEASE_RENEWAL_TROUBLE = (asyncio.TimeoutError, *PUBLISH_TROUBLE)
LEASE_RENEWAL_TIMEOUT = 2.0
LEASE_RETRY_SECONDS = 0.5
# How often a service checks that its NATS connection is not closed for good.
BUS_WATCH_SECONDS = 1.0
BUS_CLOSED_REASON = "the NATS connection is closed and will not reconnect"


class BusClosed(RuntimeError):
    """nats-py gave the connection up (e.g. after a protocol error): only a restart recovers."""


async def exit_when_bus_closed(ctx: ServiceContext) -> None:
    """Raise BusClosed once the connection is closed for good while the service runs.

    Spawned by `run`: the failure stops the service and the process exits
    non-zero, so `pai up` or Kubernetes starts it again with a fresh connection
    (a service that answered every request with 500 until killed was the result before).
    """
    while not ctx.stopping.is_set():
        if ctx.bus.nc.is_closed:
            raise BusClosed(BUS_CLOSED_REASON)
        await asyncio.sleep(BUS_WATCH_SECONDS)


@dataclass
class ServiceContext:
    name: str
    config: Config
    bus: Bus
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    ready: bool = False
    # A single-active service's replica waiting for the leader lease: healthy and
    # ready to take over, so ready as Kubernetes reads it (a standby reported not
    # ready kept `helm install --wait`, Argo CD and Flux from ever finishing).
    standby: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)

    def set_ready(self) -> None:
        self.ready = True
        log.info("%s ready", self.name)

    def spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task:
        """A background task whose failure takes the service down (a bug, never swallowed)."""
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        task.add_done_callback(self._check_background)
        self.tasks.append(task)
        return task

    def _check_background(self, task: asyncio.Task) -> None:
        if task.cancelled() or self.stopping.is_set():
            return
        exc = task.exception()
        if exc is not None:
            log.error("background task %s failed: %r; stopping", task.get_name(), exc, exc_info=exc)
            self.failed = exc
            self.stopping.set()


def health_routes(ctx_getter: Callable[[], ServiceContext | None]) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        # Alive means able to recover by itself: a connection that is only
        # reconnecting is, one that nats-py closed for good is not.
        ctx = ctx_getter()
        if ctx is not None and ctx.bus.nc.is_closed:
            return web.json_response({"status": "unhealthy", "reason": BUS_CLOSED_REASON}, status=503)
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ctx = ctx_getter()
        if ctx is not None and (ctx.ready or ctx.standby) and ctx.bus.nc.is_connected:
            return web.json_response({"status": "standby" if ctx.standby else "ready"})
        return web.json_response({"status": "not ready"}, status=503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics)]


class _Lease(msgspec.Struct):
    holder: str
    expires: float


async def hold_leadership(ctx: ServiceContext) -> None:
    """Single-active services: wait for the lease in KV, then keep renewing it.

    Losing the lease (another replica took over after we stalled) ends the
    process: two active schedulers or launchers must never run at once.
    """
    leading = shell_metrics.leader.labels(ctx.name)
    leading.set(0)
    kv = await ctx.bus.kv(Bucket.LEASES)
    me = f"{ctx.config.replica or socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
    revision = None
    while revision is None:
        revision = await _try_take(kv, ctx.name, me)
        if revision is None:
            if not ctx.standby:
                log.info("standing by: another %s holds the lease", ctx.name)
            ctx.standby = True
            await asyncio.sleep(LEASE_SECONDS / 3)
    ctx.standby = False
    leading.set(1)

    async def renew() -> None:
        nonlocal revision
        held_until = time.time() + LEASE_SECONDS
        delay = LEASE_SECONDS / 3
        while not ctx.stopping.is_set():
            await asyncio.sleep(delay)
            expires = time.time() + LEASE_SECONDS
            value = msgspec.json.encode(_Lease(holder=me, expires=expires))
            try:
                revision = await asyncio.wait_for(kv.update(ctx.name, value, last=revision), LEASE_RENEWAL_TIMEOUT)
                held_until, delay = expires, LEASE_SECONDS / 3
            except nats.js.errors.KeyWrongLastSequenceError:
                # A renewal whose answer was lost (timed out) may have landed:
                # the lease is still ours then, at the newer revision.
                entry = await kv.get(ctx.name)
                if entry.value and msgspec.json.decode(entry.value, type=_Lease).holder == me:
                    revision = entry.revision
                    continue
                log.error("lost the %s lease; exiting", ctx.name)
                os._exit(3)
            except LEASE_RENEWAL_TROUBLE as exc:
                # NATS failing over (a cluster node lost, a leader elected):
                # retry while the lease is surely still ours, even through the
                # next try; past that a standby may take it, and this one stops.
                delay = LEASE_RETRY_SECONDS
                if time.time() + delay + LEASE_RENEWAL_TIMEOUT >= held_until:
                    raise
                log.warning("renewing the %s lease failed (%r); retrying", ctx.name, exc)

    ctx.spawn(renew(), "lease-renew")


async def _try_take(kv, key: str, me: str) -> int | None:
    value = msgspec.json.encode(_Lease(holder=me, expires=time.time() + LEASE_SECONDS))
    try:
        return await kv.create(key, value)
    except nats.js.errors.KeyWrongLastSequenceError:
        pass
    entry = await kv.get(key)
    current = msgspec.json.decode(entry.value, type=_Lease) if entry.value else None
    # The lease is free when it expired, or when its holder was this same
    # replica (Config.replica: the host name unless set): a replica is started
    # again only after it died, so its old holder is gone.
    if current is None or current.expires < time.time() or current.holder.split("/")[0] == me.split("/")[0]:
        try:
            return await kv.update(key, value, last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
    return None


# Allocations between two collections of the youngest generation (CPython's default: 700).
# Every job makes and drops thousands of short-lived objects in each service that
# handles it (rest: the YAML nodes, the document, the HTTP request; the scheduler and
# launcher: decisions, records, events, their encodings, the NATS client's messages).
# At the default a young collection ran every few jobs of a burst and moved whatever
# was alive at that moment into the older generations, whose collections walk every
# record the service holds: 12-18% of the launcher's CPU and 5% of the scheduler's
# (py-spy --native, gc_collect_main); all of it freed by reference counting moments later.
YOUNG_COLLECTION_ALLOCATIONS = 20_000


def collect_young_less_often() -> None:
    """For a process that handles many jobs a second (every service: `run` calls it):
    young collections every YOUNG_COLLECTION_ALLOCATIONS allocations; the older
    generations' thresholds stay."""
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, *gc.get_threshold()[1:])


def run(
    name: str,
    config: Config,
    body: Callable[[ServiceContext], Awaitable[None]],
    *,
    single_active: bool = False,
    app_factory: Callable[[ServiceContext], Awaitable[web.Application]] | None = None,
) -> None:
    """Entry point of `python -m services.<name>`."""
    collect_young_less_often()  # every service handles every job, or every event of one
    telemetry.setup(name, level=config.log_level, otlp_endpoint=config.otlp_endpoint)
    http_server.limit_log_rates()  # what a flood of bad clients makes asyncio and aiohttp log
    try:
        asyncio.run(_main(name, config, body, single_active, app_factory))
    except KeyboardInterrupt:
        pass
    except Exception:
        log.exception("%s crashed", name)
        sys.exit(1)


async def _main(name, config, body, single_active, app_factory) -> None:
    bus = await Bus.connect(config.nats_url, name=f"pai-{name}", **busauth.login_of_config(config))
    ctx = ServiceContext(name=name, config=config, bus=bus)
    shell_metrics.record_build(name)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ctx.stopping.set)
    if app_factory is not None:
        app = await app_factory(ctx)
    else:
        app = web.Application()
        app.add_routes(health_routes(lambda: ctx))
    # Timeouts and connection caps against slow or idle clients (libs/common/http_server.py).
    runner, _ = await http_server.serve(app, config.host, config.port_of(name), http_server.Limits.of(config))
    log.info("%s serving on %s:%s", name, config.host, config.port_of(name))
    ctx.spawn(exit_when_bus_closed(ctx), "bus-watch")
    ctx.spawn(heap.trim_periodically(ctx.stopping), "heap-trim")  # RSS follows live work, not the largest burst
    try:
        await bus.bootstrap()
        if single_active:
            await hold_leadership(ctx)
        body_task = asyncio.ensure_future(body(ctx))
        stop_task = asyncio.ensure_future(ctx.stopping.wait())
        done, _ = await asyncio.wait({body_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if body_task in done:
            body_task.result()  # re-raise a bug
        else:
            body_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await body_task
        failed = getattr(ctx, "failed", None)
        if failed is not None:
            raise failed
    finally:
        for task in ctx.tasks:
            task.cancel()
        await runner.cleanup()
        if single_active:
            with contextlib.suppress(Exception):
                await (await bus.kv(Bucket.LEASES)).delete(name)
        await bus.close()
        log.info("%s stopped", name)
