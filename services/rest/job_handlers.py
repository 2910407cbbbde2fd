"""The job handlers of OpenPAI's v2 job API that PAI answers from its own records:
submit, a job's detail, its config, its logs and its stop. Registered, with every other
job route, in services/rest/routes/jobs.py.

Job intake is crash-safe: the job record is created in KV first (atomically, so a
duplicate name is a 409), then `JobSubmitted` is published with a deterministic id
(services/rest/intake.py); see services/rest/app.py.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats.js.errors
import yaml
from aiohttp import web

from libs.common import ids, job_secrets, telemetry
from libs.common.bus import get_json
from libs.common.errors import BadInput, Conflict, Forbidden, NotFound, NoVirtualCluster
from libs.common.logs import LogRequest, read_log_chunks
from libs.common.messages import StopRequested
from libs.common.protocol import MAX_BODY_BYTES, parse_job, tensorboard
from libs.common.protocol.locate import errors_located
from libs.common.records import JobRecord
from libs.common.schedule import ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import deletion, history_reads, intake, job_ssh, jobs_api, metrics, portal_routes, quotas, storages, views
from services.rest.identity import core as identity_core, store as identity_store
from services.rest.log_stream import log_response
from services.rest.market import core as market_core, store as market_store
from services.rest.market.handlers import caller_of_principal as handlers_caller
from services.rest.notify_default import with_default as with_notification_default
from services.rest.records import SubmittedJob
from services.rest.request import USER, ctx_of, read_body, read_json_object

FOLLOW_POLL_SECONDS = 0.5


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
    with errors_located(body, request.content_type):  # teamwise_storage: 404 unknown, 403 not granted, each named
        spec = await storages.with_storages(ctx.bus, user, spec)
    jid = ids.job_id(user.username, spec.name)
    # OpenPAI's ssh plugin: the job's key pair and the owner's profile keys (services/rest/job_ssh.py).
    spec, secrets, ssh_keys = await job_ssh.prepare(ctx.bus, user.username, jid, spec, parsed.config, parsed.secrets)
    # Status mail as the owner's profile asks, where the job does not say (services/rest/notify_default.py).
    spec = with_notification_default(spec, parsed.config, user.notifyStates)
    tensorboard_request = tensorboard.tensorboard_request(parsed.config)  # OpenPAI's tensorboard plugin
    if tensorboard_request is not None:
        spec = tensorboard.with_tensorboard(spec, tensorboard_request)
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
    if secrets:  # sealed for the launcher alone, stored before the record names the job
        kv, key = await ctx.bus.kv(Bucket.JOBS), ids.job_key(jid)
        await job_secrets.store(await ctx.bus.kv(Bucket.SECRETS), ctx.config.secrets_public_key_file, key,
                                secrets, job_exists=lambda: get_json(kv, key, SubmittedJob))
    if ssh_keys is not None:  # for the owner's GET .../ssh
        await job_ssh.keep(ctx.bus, jid, ssh_keys)
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
    if (item := market_core.item_of_job_config(parsed.config)) is not None:  # made from a marketplace item
        await market_store.count_submission(ctx.bus, handlers_caller(user), item)
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
