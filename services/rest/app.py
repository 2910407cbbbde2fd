"""rest: the HTTP API (OpenPAI v2 paths), users and tokens, job intake.

Job intake is crash-safe: the job record is created in KV first (atomically, so a
duplicate name is a 409), then `JobSubmitted` is published with a deterministic id
(services/rest/intake.py). A record whose event is not out -- a crash between the
two, or a publish not answered in time -- is published again by rest's sweep
within seconds, also in a restarted rest once its job index is loaded; JetStream
and the idempotent consumers absorb the repeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import yaml
from aiohttp import web

from libs.common import ids, job_secrets, telemetry
from libs.common.bus import get_json, store_is_full
from libs.common.errors import (
    BadInput,
    Conflict,
    Forbidden,
    NotFound,
    NoVirtualCluster,
    PaiError,
    Transient,
)
from libs.common.logs import LogRequest, read_log_chunks
from libs.common.messages import StopRequested
from libs.common.protocol import MAX_BODY_BYTES, parse_job, protocol_error_body
from libs.common.protocol.locate import errors_located
from libs.common.protocol.model import ProtocolError
from libs.common.records import JobRecord
from libs.common.schedule import ClusterView
from libs.common.service import ServiceContext, health_routes
from libs.common.subjects import Bucket
from services.rest import (
    alerts as alert_routes,
    auth,
    deletion,
    events,
    fallback,
    history_reads,
    intake,
    jobs_api,
    metrics,
    nodes,
    portal_routes,
    quotas,
    ratelimit,
    rules,
    views,
)
from services.rest.history import query as history_query, wiring as history
from services.rest.identity import (
    core as identity_core,
    oidc_routes,
    routes as identity_routes,
    store as identity_store,
)
from services.rest.log_stream import log_response
from services.rest.records import SubmittedJob
from services.rest.request import CTX, USER, ctx_of, read_body, read_json_object

log = logging.getLogger("pai.rest")

FOLLOW_POLL_SECONDS = 0.5


def request_middleware(limiter: ratelimit.TokenBuckets):
    """Every request's way in, in one middleware (one frame, not three): the bus check,
    the per-token rate limit, the caller's token, then the route; domain errors become
    JSON bodies with OpenPAI's `code` and a message.

    Each request is one trace span (its context goes into the events it
    publishes) and one observation of the request-latency histogram.
    (services/rest/fallback.py, outside it, answers what is left: aiohttp's own
    errors and bugs.)
    """

    @web.middleware
    async def answer(request: web.Request, handler):
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource else "unmatched"
        method = request.method
        with telemetry.span(f"{method} {route}"):
            try:
                path = request.path
                if not path.startswith(BUS_FREE_PREFIXES) and not ctx_of(request).bus.nc.is_connected:
                    # Every API answer needs the bus: say so at once instead of
                    # waiting out a KV timeout while NATS restarts.
                    raise BusUnavailable(BUS_AWAY_MESSAGE)
                # Probes, metrics and the portal's files are never limited; the rest
                # are, before the token is looked up (a flood of made-up tokens costs NATS nothing).
                refused = None if path.startswith(auth.PUBLIC_PREFIXES) else ratelimit.refusal(limiter, request)
                response = refused if refused is not None else await auth.call_as_caller(request, handler)
            except (*BUS_ERRORS, Transient) as exc:
                if store_is_full(exc):
                    log.error("%s %s: the store is full: %r", request.method, request.path, exc)
                    response = _store_full()
                elif isinstance(exc, BUS_ERRORS):
                    log.warning("%s %s: the bus did not answer: %r", request.method, request.path, exc)
                    response = _bus_unavailable(BUS_AWAY_MESSAGE)
                else:
                    response = _bus_unavailable(exc.message)
            except BusUnavailable as exc:
                response = _bus_unavailable(exc.message)
            except ProtocolError as exc:
                response = web.json_response(protocol_error_body(exc), status=400)
            except PaiError as exc:
                body: dict[str, Any] = {"code": exc.code, "message": exc.message}
                if exc.details is not None:
                    body["details"] = exc.details
                response = web.json_response(body, status=exc.status)
        metrics.observe_request(method, route, response.status, time.perf_counter() - started)
        return response

    return answer


# Probes and metrics answer from the process itself, NATS or not.
BUS_FREE_PREFIXES = ("/healthz", "/readyz", "/metrics")
BUS_AWAY_MESSAGE = "PAI cannot reach its message bus (NATS); it is being restarted, try again shortly"
BUS_RETRY_AFTER_SECONDS = 1
# What nats-py raises when NATS is away or restarting mid-request.
BUS_ERRORS = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
)


class BusUnavailable(Transient):
    code = "ServiceUnavailable"


STORE_FULL_MESSAGE = ("PAI's store (NATS JetStream) is full: nothing was stored; an admin must free room "
                      "(docs/reliability.md); try again later")
STORE_FULL_RETRY_AFTER_SECONDS = 30


def _store_full() -> web.Response:
    """507: JetStream refused the write for want of room; nothing of the request was kept."""
    return web.json_response(
        {"code": "InsufficientStorage", "message": STORE_FULL_MESSAGE},
        status=507,
        headers={"Retry-After": str(STORE_FULL_RETRY_AFTER_SECONDS)},
    )


def _bus_unavailable(message: str) -> web.Response:
    return web.json_response(
        {"code": BusUnavailable.code, "message": message},
        status=503,
        headers={"Retry-After": str(BUS_RETRY_AFTER_SECONDS)},
    )


async def create_app(ctx: ServiceContext) -> web.Application:
    limiter = ratelimit.TokenBuckets(rate=ctx.config.rest_rate_limit_per_second, burst=ctx.config.rest_rate_limit_burst)
    app = web.Application(
        middlewares=[fallback.middleware, request_middleware(limiter)],
        client_max_size=MAX_BODY_BYTES * 2,
    )
    app[CTX] = ctx
    identity_store.configure_hashing(ctx.config.password_hash_time_cost, ctx.config.password_hash_memory_kib)
    auth.setup(app, lambda app: app[CTX].bus)  # who each token is, remembered and kept current
    app.add_routes(health_routes(lambda: ctx))
    app.add_routes(
        [
            web.post("/api/v2/jobs", submit_job),
            web.get("/api/v2/jobs", jobs_api.list_jobs),
            web.get("/api/v2/jobs/{job}", get_job),
            web.get("/api/v2/jobs/{job}/config", get_job_config),
            web.get("/api/v2/jobs/{job}/job-attempts", get_job_attempts),
            web.get("/api/v2/jobs/{job}/logs", get_job_logs),
            web.put("/api/v2/jobs/{job}/executionType", put_execution_type),
            web.get("/api/v2/virtual-clusters", jobs_api.list_virtual_clusters),
        ]
    )
    app.add_routes(identity_routes.routes)
    oidc_routes.setup(app, ctx)  # sign-in through the identity provider, /api/v2/authn/info
    events.setup(app)  # GET /api/v2/events (SSE) and what wakes its readers
    app.add_routes(rules.routes)
    jobs_api.setup(app, ctx)
    history.setup(app, ctx)  # the job history database, migrated before rest serves (services/rest/history)
    app.add_routes(alert_routes.routes)  # alerts, alert rules, usage report
    app.add_routes(nodes.routes)
    portal_routes.setup(app)  # the web portal at / (services/rest/portal_routes.py)
    return app


async def submit_job(request: web.Request) -> web.Response:
    async with quotas.submitting(request, request[USER].username):  # 429 past the user's submissions in flight
        return await _take_job(request)


async def _take_job(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    user = request[USER]
    body = await read_body(request, limit=MAX_BODY_BYTES, what="the job body (1 MiB at most)")
    parsed = parse_job(body, content_type=request.content_type, user=user.username)
    spec = parsed.spec
    with errors_located(body, request.content_type):  # refusals against the cluster point at their line too
        await jobs_api.check_against_cluster(request, lambda view: (
            _check_virtual_cluster(view, user, spec.virtualCluster), jobs_api.check_fits(spec, view)))
    if not identity_core.may_use_priority_class(user, spec.priorityClass):  # crit/prod: granted per group
        raise identity_core.priority_class_refused(user, spec.priorityClass, await identity_store.all_groups(ctx.bus))
    jid = ids.job_id(user.username, spec.name)
    if portal_routes.wants_dry_run(request):  # validated as a submission is; nothing stored or published
        return portal_routes.dry_run_answer(jid, parsed)
    record = SubmittedJob(
        job=jid,
        user=user.username,
        name=spec.name,
        vc=spec.virtualCluster,
        spec=spec,
        config=parsed.config,
        warnings=parsed.warnings,
        submittedAt=time.time(),
    )
    if await history_reads.holds(request, jid):  # finished, its live records gone: the name is still taken
        raise Conflict(f"job {jid} already exists (finished; kept in the job history); job names are unique per "
                       "user: delete it first, or submit under another name")
    refused = deletion.name_reuse_refusal(ctx, request.app.get(jobs_api.INDEX), jid, record.submittedAt)
    if refused is not None:  # the name of a job deleted within the event stream's duplicate window
        raise refused
    # 507 past the user's stored-jobs quotas, before anything is stored (services/rest/quotas.py).
    await quotas.check_submission(request, request.app.get(jobs_api.INDEX), user.username,
                                  len(msgspec.json.encode(record)))
    if parsed.secrets:  # sealed for the launcher alone, stored before the record names the job
        kv, key = await ctx.bus.kv(Bucket.JOBS), ids.job_key(jid)
        await job_secrets.store(await ctx.bus.kv(Bucket.SECRETS), ctx.config.secrets_public_key_file, key,
                                parsed.secrets, job_exists=lambda: get_json(kv, key, SubmittedJob))
    try:
        published = await request.app[jobs_api.INTAKE].submit(record)
    except nats.js.errors.KeyWrongLastSequenceError:
        raise Conflict(f"job {jid} already exists; job names are unique per user") from None
    warnings = parsed.warnings
    if not published:
        # Not answered in time (it may be stored or not). The job is recorded, so it
        # is accepted: rest's sweep publishes it (a resubmission would only be a 409).
        warnings = [*warnings, PUBLISH_DELAYED_WARNING]
    metrics.job_submitted(record.vc)
    return jobs_api.json_response(
        {"job": jid, "name": spec.name, "state": "WAITING", "warnings": warnings, "ignoredFields": spec.ignoredFields},
        status=202,
    )


PUBLISH_DELAYED_WARNING = (f"the job is recorded, but the scheduler has not been told yet (the message bus did not "
                           f"answer in time); PAI tells it within {intake.UNPUBLISHED_AFTER_SECONDS + intake.SWEEP_SECONDS:.0f} "
                           f"seconds of the bus answering again: do not submit it again")


def _check_virtual_cluster(view: ClusterView, user: identity_core.Principal, vc: str) -> None:
    known = {v.get("name") for v in view.virtualClusters}
    if known and vc not in known:
        raise NoVirtualCluster(
            f"virtual cluster {vc!r} does not exist; known: {', '.join(sorted(known))}",
            details={"errors": [{"path": "defaults.virtualCluster", "rule": "unknown_virtual_cluster",
                                 "message": f"no virtual cluster {vc!r}"}]},
        )
    # As OpenPAI: a VC is open to a user when one of their groups lists it
    # (`extension.acls.virtualClusters`; the default group lists `default`).
    if not identity_core.may_submit_to(user, vc):
        granted = ", ".join(user.virtualClusters) or "none"
        raise Forbidden(f"user {user.username} may not submit to virtual cluster {vc}: none of their groups "
                        f"({', '.join(user.grouplist) or 'none'}) lists it; their virtual clusters: {granted}")


async def get_job(request: web.Request) -> web.Response:
    sub, rec, sched = await jobs_api.read_job(request, jobs_api.job_param(request))
    detail = views.job_detail(sub, rec, jobs_api.waiting_reason(rec, sched), backend=ctx_of(request).config.backend,
                              with_output=jobs_api.may_read_output(request, sub))
    detail["traceId"] = telemetry.job_trace_id_hex(sub.job)  # open it in the trace viewer (otlp_endpoint)
    return jobs_api.json_response(detail)


async def get_job_attempts(request: web.Request) -> web.Response:
    jid = jobs_api.job_param(request)
    try:
        sub, rec, _ = await jobs_api.read_job(request, jid)
    except NotFound as gone:  # finished and expired from the buckets: the history database has it
        engine = await jobs_api.from_history(request, jid, "read the attempts of", gone)
        return jobs_api.json_response(jobs_api.history_attempts(await history_query.job_attempts(engine, jid)))
    jobs_api.require_owner_or_admin(request, sub, "read the attempts of")
    return jobs_api.json_response(views.job_attempts(rec))


async def get_job_config(request: web.Request) -> web.Response:
    sub, _, _ = await jobs_api.read_job(request, jobs_api.job_param(request))
    jobs_api.require_owner_or_admin(request, sub, "read the config of")
    if "yaml" in request.headers.get("Accept", ""):
        return web.Response(text=yaml.safe_dump(sub.config, sort_keys=False), content_type="text/yaml")
    return web.json_response(sub.config)


async def put_execution_type(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    jid = jobs_api.job_param(request)
    sub, rec, _ = await jobs_api.read_job(request, jid)
    jobs_api.require_owner_or_admin(request, sub, "stop")
    user = request[USER]
    body = await read_json_object(request, what="the body", example='{"value": "STOP"}')
    value = body.get("value")
    if value not in ("STOP", "START"):
        raise BadInput(
            f"value must be STOP (got {str(value)[:40]!r})",
            details={"errors": [{"path": "value", "rule": "enum", "message": "one of STOP"}]},
        )
    if value == "START":
        raise BadInput("a stopped job cannot be started again; submit it under a new name")
    await ctx.bus.publish(StopRequested(id=f"{jid}/stop", job=jid, vc=sub.vc, by=user.username, at=time.time()))
    return web.json_response({"message": f"stop of {jid} requested"}, status=202)


async def get_job_logs(request: web.Request) -> web.StreamResponse:
    """A task's output, proxied from the launcher over NATS request/reply (it owns
    the logs). `tailBytes` gives the end only; `follow=true` streams the log as it
    grows until the job is final."""
    ctx = ctx_of(request)
    jid = jobs_api.job_param(request)
    sub, rec, _ = await jobs_api.read_job(request, jid)
    jobs_api.require_owner_or_admin(request, sub, "read the logs of")
    q = request.query
    role = q.get("taskRole") or sub.spec.taskRoles[0].name
    try:
        index = int(q.get("taskIndex", 0))
        tail = int(q["tailBytes"]) if "tailBytes" in q else None
        attempt = int(q.get("attempt", rec.attempt if rec else 1))
    except ValueError:
        raise BadInput("taskIndex, attempt and tailBytes must be integers") from None
    req = LogRequest(job=jid, attempt=attempt, role=role, index=index, tailBytes=tail)
    if q.get("follow", "").lower() not in ("1", "true", "yes"):
        return await log_response(request, ctx.bus, req)  # in chunks under NATS's message limit, streamed
    return await _follow_log(request, ctx, req)


async def _follow_log(request: web.Request, ctx: ServiceContext, req: LogRequest) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    await response.prepare(request)
    shown = 0
    while True:
        key = ids.job_key(req.job)
        got = await get_json(await ctx.bus.kv(Bucket.JOB_STATUS), key, JobRecord)
        final = got is not None and got[0].state.is_final
        try:
            async for chunk in read_log_chunks(ctx.bus, msgspec.structs.replace(req, tailBytes=None, offset=shown)):
                await response.write(chunk)
                shown += len(chunk)
        except NotFound:
            pass  # not started yet
        if final:
            break
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
    await response.write_eof()
    return response


async def startup(ctx: ServiceContext) -> None:
    token = await auth.ensure_admin(ctx.bus, ctx.config.admin_user)
    if token is not None:
        path = ctx.config.token_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token + "\n")
        path.chmod(0o600)
        log.info("created admin user %s; token written to %s", ctx.config.admin_user, path)
    await oidc_routes.seed_groups(ctx)  # OpenPAI's groupConfig: the groups directory groups map to
    # Submissions an earlier crash left unpublished: the intake sweep finds them once
    # the job index is loaded (services/rest/intake.py).
