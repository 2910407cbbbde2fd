"""GET /api/v2/jobs/{id}/metrics: a job's utilisation over time, per task and for
the whole job, shaped for charts (libs/common/usage_history.py), from the monitor's
`pai_job_metrics` bucket.

Query: `from` and `to` (Unix seconds) cut the window; `step` (seconds) merges
points into coarser steps (never finer than what is stored). For the job's owner
and admins, as its logs are (the command lines' effects show in them).
"""

from __future__ import annotations

import math
import time
import urllib.parse

import msgspec
from aiohttp import web

from libs.common.bus import read_pages
from libs.common.errors import BadInput
from libs.common.messages import JobState
from libs.common.subjects import Bucket
from libs.common.usage_history import TaskHistory, columns, decode_history, gpu_idle, job_prefix, job_total, rebucket, window
from services.rest import jobs_api
from services.rest.request import ctx_of

# Coarser than a day a point says nothing a chart can show.
MAX_STEP_SECONDS = 86_400.0


def _seconds(request: web.Request, name: str, *, upper: float) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(f"{name}: {raw[:40]!r} is not a number of seconds",
                       details={"errors": [{"path": name, "rule": "type", "message": "a number"}]}) from None
    if not math.isfinite(value) or value < 0 or value > upper:
        raise BadInput(f"{name}: {raw[:40]!r} must be between 0 and {upper:g}",
                       details={"errors": [{"path": name, "rule": "range", "message": f"0..{upper:g}"}]})
    return value


async def job_histories(request: web.Request, jid: str) -> list[TaskHistory]:
    kv = await ctx_of(request).bus.kv(Bucket.JOB_METRICS)
    found: dict[str, TaskHistory] = {}
    async for page in read_pages(kv, prefix=job_prefix(jid)):
        for entry in page:
            if not entry.value:
                found.pop(entry.key, None)
                continue
            try:
                found[entry.key] = decode_history(entry.value)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # the monitor's to fix; the other tasks still answer
    return sorted(found.values(), key=lambda h: (h.role, int(h.index) if h.index.isdigit() else 0, h.index))


async def get_job_metrics(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    jid = jobs_api.job_param(request)
    sub, rec, _ = await jobs_api.read_job(request, jid)  # 404: no such job
    jobs_api.require_owner_or_admin(request, sub, "read the utilisation of")
    now = time.time()
    start = _seconds(request, "from", upper=4e9)
    end = _seconds(request, "to", upper=4e9)
    step = _seconds(request, "step", upper=MAX_STEP_SECONDS) or 0.0
    if start is not None and end is not None and start > end:
        raise BadInput(f"from ({start:g}) is after to ({end:g})",
                       details={"errors": [{"path": "from", "rule": "range", "message": "at most to"}]})
    histories = await job_histories(request, jid)
    common = max([step, *(h.step for h in histories)]) if histories else max(step, ctx.config.node_sample_seconds)
    tasks = []
    cut = []
    for h in histories:
        own = max(step, h.step)
        points = window(rebucket(h.points, own), start, end)
        cut.append(points)
        tasks.append({"taskRoleName": h.role, "taskIndex": int(h.index) if h.index.isdigit() else h.index,
                      "node": h.node, "step": own, "series": columns(points)})
    total = job_total(cut, common)
    config = ctx.config
    running = rec is not None and rec.state == JobState.RUNNING
    idle = gpu_idle(job_total([h.points for h in histories], common), now=now, running=running,
                    window_seconds=config.job_idle_gpu_minutes * 60, threshold=config.job_idle_gpu_percent)
    grafana = None
    if config.grafana_url:
        grafana = f"{config.grafana_url.rstrip('/')}/d/pai-job/pai-job?" + urllib.parse.urlencode({"var-job": jid})
    return jobs_api.json_response({
        "job": jid,
        "state": rec.state.value if rec is not None else None,
        "now": now,
        "sampleSeconds": config.node_sample_seconds,
        "step": common,
        "from": start,
        "to": end,
        "tasks": tasks,
        "total": {"step": common, "series": columns(total)},
        "gpuIdle": msgspec.to_builtins(idle),
        "grafanaUrl": grafana,
    })
