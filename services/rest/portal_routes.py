"""The web portal: its static files, and the few summaries its pages need in one call.

    GET /                             the portal's page (public; it signs in through the API)
    GET /portal/{path}                its scripts, styles and icons (public, from services/rest/portal/static)
    GET /api/v2/portal/overview       home: cells/GPUs per VC and sku, jobs by state, my recent jobs, firing alerts
    GET /api/v2/portal/utilization    cluster: each node's latest sample from the monitor (GPUs, CPU, memory)
    GET /api/v2/portal/queue/{vc}     a VC's waiting jobs, in queue order, each with why it waits
    POST /api/v2/jobs?dryRun=true     (in app.submit_job) validate without submitting: 200 or the 400 of a submit

Everything a page shows comes from the public API or these summaries; the
summaries exist so that a page on a 10,000-job cluster is one small answer from
rest's job index instead of the whole job list in the browser. The overview's jobs by
state and recent jobs cover every job the history database holds (finished jobs leave
the live index once archived: services/rest/history/expiry.py), with the index's newer
rows laid over it as the job list does; without the database, the index alone.

No build step and no CDN: the static files are plain ES modules and CSS that
ship in the package. They are served with a validator (ETag from size and
mtime) so a browser revalidates rather than trusting a stale copy after an upgrade.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import sqlalchemy as sa
from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from libs.common import ids
from libs.common.alerts_messages import ALERT_KEY_PREFIX, AlertRecord, AlertState
from libs.common.bus import all_keys
from libs.common.errors import NotFound
from libs.common.messages import JobState
from libs.common.subjects import Bucket
from services.rest import jobs_api, nodes as nodes_api
from services.rest.history import query as history_query, schema
from services.rest.job_index import JobIndex
from services.rest.request import USER, ctx_of

STATIC_DIR = Path(__file__).resolve().parent / "portal" / "static"
RECENT_JOBS = 8
FIRING_ALERTS_SHOWN = 10
QUEUE_SHOWN = 500
# The history's jobs by state are counted again at most this often, for every portal
# polling the overview together: the count walks all of ix_jobs_state (a covering index
# scan), about 0.5 s per million jobs on SQLite on a loaded 2-core machine. Jobs that
# settle in the database meanwhile show at their last counted state until the next count.
STATE_COUNTS_SECONDS = 5.0
OVERLAY_LOOKUP = 1000  # unsettled jobs looked up in the database per query

log = logging.getLogger("pai.rest.portal")

_alert_decoder = msgspec.json.Decoder(AlertRecord)


class _GpuBrief(msgspec.Struct, frozen=True, kw_only=True):
    """What the heat map needs of the monitor's GPU sample (decoded leniently: the
    monitor owns the full type; fields added there are skipped here)."""

    index: int = 0
    name: str = ""
    utilizationGpuPercent: float | None = None
    utilizationMemoryPercent: float | None = None
    memoryUsedBytes: int | None = None
    memoryTotalBytes: int | None = None
    temperatureCelsius: float | None = None


class _NodeBrief(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    at: float = 0.0
    cpuCount: int = 0
    cpuPercent: float = 0.0
    memoryUsedBytes: int = 0
    memoryTotalBytes: int = 0
    gpus: list[_GpuBrief] = []
    gpuNote: str = ""


_node_decoder = msgspec.json.Decoder(_NodeBrief)
_encoder = msgspec.json.Encoder()


def _json(value: Any) -> web.Response:
    """Encoded by msgspec: Structs as they are, several times faster than json.dumps."""
    return web.Response(body=_encoder.encode(value), content_type="application/json")


# --- the page and its files ---------------------------------------------------------------


def _etag(path: Path) -> str:
    stat = path.stat()
    return '"' + hashlib.sha1(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16] + '"'


# The page holds a bearer token: only its own scripts run (no inline script or style, no
# other origin), it cannot be framed, and it sends no referrer.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
                               "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def _file_response(request: web.Request, path: Path) -> web.StreamResponse:
    etag = _etag(path)
    headers = {"ETag": etag, "Cache-Control": "no-cache", **SECURITY_HEADERS}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if path.suffix == ".js":
        content_type = "text/javascript"  # ES modules need a JavaScript type, whatever the host's mime table says
    return web.Response(body=path.read_bytes(), content_type=content_type, headers=headers)


async def index_page(request: web.Request) -> web.StreamResponse:
    return _file_response(request, STATIC_DIR / "index.html")


async def static_file(request: web.Request) -> web.StreamResponse:
    wanted = request.match_info["path"]
    try:
        path = (STATIC_DIR / wanted).resolve()
        found = path.is_relative_to(STATIC_DIR) and path.is_file()
    except (OSError, ValueError):  # a name over the file system's 255 bytes, a NUL byte, bytes not UTF-8
        found = False
    if not found:
        raise NotFound(f"the portal has no file {wanted[:120]!r}")
    return _file_response(request, path)


# --- home --------------------------------------------------------------------------------


def vc_cells(vc: dict[str, Any], sku_types: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per sku of one VC: cells and GPUs guaranteed, used (guaranteed + opportunistic
    jobs), free within its quota (pure)."""
    rows = []
    for sku in vc.get("skus", []):
        name = str(sku.get("sku"))
        gpus_per_cell = int(sku_types.get(name, {}).get("gpu", 0))
        guaranteed, used = int(sku.get("guaranteed", 0)), int(sku.get("used", 0))
        opportunistic = int(sku.get("opportunistic", 0))
        free = max(guaranteed - used, 0)
        rows.append({
            "sku": name, "gpusPerCell": gpus_per_cell, "guaranteed": guaranteed, "used": used,
            "opportunistic": opportunistic, "free": free, "total": int(sku.get("total", 0)),
            "unhealthy": int(sku.get("unhealthy", 0)),
            "gpusUsed": (used + opportunistic) * gpus_per_cell, "gpusFree": free * gpus_per_cell,
        })
    return rows


def jobs_by_state(states: list[JobState]) -> dict[str, int]:
    """Every state with its count, zeros included, in lifecycle order (pure)."""
    counts = Counter(states)
    return {state.value: counts.get(state, 0) for state in JobState}


async def _firing_alerts(request: web.Request) -> list[AlertRecord]:
    user = request[USER]
    kv = await ctx_of(request).bus.kv(Bucket.ALERTS)
    firing = []
    for key in await all_keys(kv):
        if not key.startswith(ALERT_KEY_PREFIX):
            continue
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            continue
        if not entry.value:
            continue
        try:
            alert = _alert_decoder.decode(entry.value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if alert.state is AlertState.FIRING and (user.admin or alert.user == user.username):
            firing.append(alert)
    firing.sort(key=lambda a: -a.startsAt)
    return firing


class _StateCounts:
    """The history's jobs per state, counted again once STATE_COUNTS_SECONDS old."""

    def __init__(self) -> None:
        self.engine: AsyncEngine | None = None
        self.at = 0.0
        self.counts: dict[str, int] = {}

    async def get(self, engine: AsyncEngine) -> dict[str, int]:
        now = time.monotonic()
        if engine is not self.engine or now - self.at >= STATE_COUNTS_SECONDS:
            jobs = schema.jobs
            query = (sa.select(jobs.c.state, sa.func.count()).where(jobs.c.submitted_at.is_not(None))
                     .group_by(jobs.c.state))
            async with engine.connect() as connection:
                rows = (await connection.execute(query)).all()
            self.engine, self.at, self.counts = engine, now, {state: count for state, count in rows}
        return self.counts


_STATE_COUNTS = web.AppKey("portal_state_counts", _StateCounts)


async def _history_states_of(engine: AsyncEngine, job_ids: list[str]) -> dict[str, str]:
    """The state the history has for each of these jobs (those it lists: submitted)."""
    jobs = schema.jobs
    found: dict[str, str] = {}
    async with engine.connect() as connection:
        for at in range(0, len(job_ids), OVERLAY_LOOKUP):
            rows = (await connection.execute(
                sa.select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(job_ids[at:at + OVERLAY_LOOKUP]),
                                                         jobs.c.submitted_at.is_not(None)))).all()
            found.update({row.id: row.state for row in rows})
    return found


async def _overview_from_history(request: web.Request, engine: AsyncEngine, index: JobIndex,
                                 username: str) -> tuple[dict[str, int], list[Any]]:
    """Jobs by state and the user's recent jobs from the history database, with the rows
    of the index's unsettled jobs (newer there, or deleted) laid over it as the job list
    does (jobs_api._list_from_history): a job counts once, at its latest state."""
    keys = list(index.unsettled)
    unsettled = [ids.job_id_from_key(key) for key in keys]
    counts = Counter(await request.app[_STATE_COUNTS].get(engine))
    counts.subtract(Counter((await _history_states_of(engine, unsettled)).values()) if unsettled else Counter())
    overlaid = []
    for key in keys:
        job = index.jobs.get(key)
        if job is None:
            continue  # deleted (or archived, until the index finds it so): not shown, as in the list
        row = jobs_api.row_of(job)
        counts[row.state] += 1
        if job.brief.user == username:
            overlaid.append(row)
    _, rows = await history_query.list_jobs(
        engine, history_query.JobFilter(user=username, limit=RECENT_JOBS), with_total=False,
        excluding=set(unsettled))
    mine = [msgspec.convert(row, jobs_api.JobRow) for row in rows] + overlaid
    mine = [row for _, row in jobs_api.order_jobs([(None, row) for row in mine], "createdTime", True)][:RECENT_JOBS]
    return {state.value: max(counts.get(state.value, 0), 0) for state in JobState}, mine


async def overview(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    user = request[USER]
    view = await jobs_api.cluster_view(ctx)
    index = request.app.get(jobs_api.INDEX)
    engine = jobs_api.history_engine(request)
    from_history = None
    if engine is not None and index is not None and index.ready and len(index.unsettled) <= jobs_api.MAX_OVERLAY:
        try:
            from_history = await _overview_from_history(request, engine, index, user.username)
        except (SQLAlchemyError, OSError) as exc:  # the database away: the index answers
            log.warning("portal overview: the history database did not answer (%r); counting the index", exc)
    if from_history is not None:
        counts, mine = from_history
    elif index is not None and index.ready:
        ordered = jobs_api._ordered_from_index(index, "createdTime", True)
        counts = index.memo(("portal", "states"), lambda: jobs_by_state([row.state for _, row in ordered]))
        mine = index.memo(("portal", "mine", user.username),
                          lambda: [row for sub, row in ordered if sub.user == user.username][:RECENT_JOBS])
    else:  # the index is loading: the same from the buckets (slower, rare)
        query = jobs_api.parse_list_query({})
        ordered = jobs_api.order_jobs(await jobs_api._rows_from_buckets(ctx, query), "createdTime", True)
        counts = jobs_by_state([row.state for _, row in ordered])
        mine = [row for sub, row in ordered if sub.user == user.username][:RECENT_JOBS]
    alerts = await _firing_alerts(request)
    body = {
        "user": {"username": user.username, "admin": user.admin, "virtualClusters": list(user.virtualClusters)},
        "virtualClusters": [{"name": str(vc.get("name")), "queued": int(vc.get("queued", 0)),
                             "running": int(vc.get("running", 0)), "skus": vc_cells(vc, view.skuTypes)}
                            for vc in view.virtualClusters],
        "jobsByState": counts,
        "totalJobs": sum(counts.values()),
        "myRecentJobs": mine,
        "firingAlerts": alerts[:FIRING_ALERTS_SHOWN],
        "firingCount": len(alerts),
    }
    return _json(body)


# --- the cluster's nodes -----------------------------------------------------------------


async def utilization(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    nodes = []
    for value in (await nodes_api.latest_values(await ctx.bus.kv(Bucket.NODES))).values():  # one pass, not a get per node
        try:
            nodes.append(_node_decoder.decode(value))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # the monitor's record, not ours to judge
    view = await jobs_api.cluster_view(ctx)
    cells = {str(n.get("name")): n.get("cells", []) for n in view.nodes}
    nodes.sort(key=lambda n: n.node)
    return _json({"nodes": nodes, "cells": cells, "skuTypes": view.skuTypes})


# --- a VC's queue -------------------------------------------------------------------------


def queue_order(rows: list[Any]) -> list[Any]:
    """Waiting jobs by priority, then first come, as the scheduler serves a VC (pure); each
    job's reason says the scheduler's own count of jobs ahead of it."""
    return sorted(rows, key=lambda r: (-r.priority, r.createdTime or 0, r.debugId))


def _waiting_in(vc: str, rows) -> list[Any]:
    return queue_order([r for r in rows if r.virtualCluster == vc and r.state == JobState.WAITING])


async def queue(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    vc = request.match_info["vc"]
    view = await jobs_api.cluster_view(ctx)
    known = bool(view.virtualClusters)  # none yet: the scheduler has not reported; the queue is what is stored
    if known:
        jobs_api._find_vc(view, vc)  # 404 naming the known VCs
    index = request.app.get(jobs_api.INDEX)
    if index is not None and index.ready and known:  # remembered only for VCs that exist (a bounded set)
        # The list's own order (shared with it), filtered and sorted once per change of the index.
        ordered = jobs_api._ordered_from_index(index, "createdTime", True)
        waiting = index.memo(("portal", "queue", vc), lambda: _waiting_in(vc, (row for _, row in ordered)))
    elif index is not None and index.ready:
        waiting = _waiting_in(vc, (row for _, row in jobs_api._ordered_from_index(index, "createdTime", True)))
    else:
        rows = await jobs_api._rows_from_buckets(ctx, jobs_api.parse_list_query({}))
        waiting = _waiting_in(vc, (row for _, row in rows))
    return _json({"vc": vc, "count": len(waiting), "jobs": waiting[:QUEUE_SHOWN]})


# --- validation without submitting ---------------------------------------------------------


def wants_dry_run(request: web.Request) -> bool:
    return request.query.get("dryRun", "").lower() in ("1", "true", "yes")


def dry_run_answer(job: str, parsed: Any) -> web.Response:
    """What POST /api/v2/jobs?dryRun=true says of a job that would be accepted."""
    return web.json_response({"valid": True, "job": job, "warnings": parsed.warnings,
                              "ignoredFields": parsed.spec.ignoredFields})


ROUTES = [
    web.get("/", index_page),
    web.get("/portal/{path:.+}", static_file),
    web.get("/api/v2/portal/overview", overview),
    web.get("/api/v2/portal/utilization", utilization),
    web.get("/api/v2/portal/queue/{vc}", queue),
]


def setup(app: web.Application) -> None:
    app[_STATE_COUNTS] = _StateCounts()
    app.add_routes(ROUTES)
