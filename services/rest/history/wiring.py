"""The history database in rest: opened and migrated before rest serves, the
projection consumer run beside the API (in a process of its own, projector.py, or
inline on rest's loop), the engine handed to routes (`HISTORY`).

A database that cannot be opened at start-up (PostgreSQL still starting) does not
keep rest from serving: rest tries again in the background, and until the history
is there the routes answer from the live index (`History.engine` is None)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from libs.common.service import ServiceContext
from services.rest.history import consumer, expiry, projector, store

log = logging.getLogger("pai.rest.history")

# Start-up waits this long for the database before serving without it.
OPEN_WAIT_SECONDS = 15.0
REOPEN_SECONDS = 5.0


class History:
    """The engine once the database is open and migrated; None before."""

    def __init__(self) -> None:
        self.engine: AsyncEngine | None = None
        self.opened = asyncio.Event()
        # The name checks' reader of this engine (history_reads._HoldLookups), made at the first check.
        self.hold_lookups: Any = None


HISTORY = web.AppKey("history", History)


async def _open(history: History, dsn: str, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        try:
            history.engine = await store.open_store(dsn)
            history.opened.set()
            return
        except (SQLAlchemyError, OSError) as exc:
            log.warning("history database %s not available (%r); trying again in %.0fs",
                        dsn.split("@")[-1], exc, REOPEN_SECONDS)
            await asyncio.sleep(REOPEN_SECONDS)


def setup(app: web.Application, ctx: ServiceContext) -> None:
    history = History()
    app[HISTORY] = history
    dsn = store.dsn_for(ctx.config.history_dsn, ctx.config.data_path)

    async def run(_: web.Application):
        stopping = asyncio.Event()
        opening = asyncio.ensure_future(_open(history, dsn, stopping))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(opening), OPEN_WAIT_SECONDS)

        async def project() -> None:
            await history.opened.wait()
            assert history.engine is not None
            if ctx.config.history_projection == "process":  # (projector.py says why)
                await projector.supervise(ctx.config, stopping)
                return
            # The expiry sweep beside the projection (expiry.py): live records of jobs it holds leave the buckets.
            await asyncio.gather(consumer.run(ctx.bus, history.engine, stopping),
                                 expiry.run(ctx, history.engine, stopping))

        projecting = asyncio.ensure_future(project())
        yield
        stopping.set()
        for task in (opening, projecting):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if history.engine is not None:
            await history.engine.dispose()

    app.cleanup_ctx.append(run)
