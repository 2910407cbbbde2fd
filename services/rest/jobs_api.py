"""The rest of OpenPAI's v2 job API: one attempt, its tasks and their logs, tags,
a job's events, one VC, sku types, cluster info, and the job list
with OpenPAI's filters, ordering and paging (served from `job_index`).

Who may do what, as in the rest of the API: a job's status and the job list are
for every signed-in user; its attempts, tasks, logs and events (they can quote
what the job printed) and changing its tags are for its owner and admins.

Response shapes are msgspec Structs where PAI defines them here, so the OpenAPI
document (services/rest/openapi/jobs.py) is generated from the same types.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import logging
import re
import time
from typing import Any, Literal

import msgspec
import nats.js.errors
from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from libs.common import ids
from libs.common.bus import all_keys, get_json
from libs.common.errors import BadInput, Conflict, Forbidden, NotFound, NoVirtualCluster, Transient
from libs.common.logs import LogRequest
from libs.common.messages import JobState
from libs.common.protocol.limits import MAX_JOB_NAME_LENGTH, MAX_USERNAME_LENGTH
from libs.common.protocol.model import JobSpec
from libs.common.records import JobRecord
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView, ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest import capacity, deletion, intake, quotas, views
from services.rest.history import overlay, query as history_query, store as history_store
from services.rest.history.wiring import HISTORY
from services.rest.job_index import IndexedJob, JobIndex, SubmissionBrief
from services.rest.log_stream import log_response
from services.rest.records import SubmittedJob
from services.rest.request import CTX, USER, bad_field, ctx_of, read_json_object
from services.rest.watched import WatchedValue

INDEX = web.AppKey("job_index", JobIndex)
# A list row's submission: the whole record (read from the bucket), or the index's brief of it.
Listed = SubmittedJob | SubmissionBrief
INTAKE = web.AppKey("intake", intake.Intake)
CLUSTER_VIEW = web.AppKey("cluster_view", WatchedValue)

MAX_TAGS_PER_JOB = 32
MAX_TAG_LENGTH = 64
TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10_000
# Far past any real history, and inside what a database's OFFSET takes (64 bits).
MAX_LIST_OFFSET = 10**12
TAG_UPDATE_ATTEMPTS = 5
FALLBACK_READS_IN_FLIGHT = 64  # jobs read at once while the index loads
# The list reads the history database while the index holds at most this many rows newer
# than it (laid over its page); more (the projection far behind), the index answers alone.
MAX_OVERLAY = 5000
# How often rest compares its unsettled rows with the database's, and how many at once.
SETTLE_SECONDS = 0.5
SETTLE_BATCH = 1000
# Rows are compared once unchanged this long: the projection has caught up with them by
# then, where a job still moving through its states would only be compared again.
SETTLE_QUIET_SECONDS = 1.0

log = logging.getLogger("pai.rest.jobs")


# --- response shapes ----------------------------------------------------------------------


class Message(msgspec.Struct, frozen=True, kw_only=True):
    message: str


class TagBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PUT/DELETE /api/v2/jobs/{job}/tag, as OpenPAI: `{"value": "<tag>"}`."""

    value: str


class JobRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of GET /api/v2/jobs (OpenPAI's job summary)."""

    debugId: str
    name: str
    username: str
    state: JobState
    subState: str
    executionType: Literal["START", "STOP"]
    retries: int
    totalTaskNumber: int
    totalGpuNumber: int
    createdTime: int | None
    completedTime: int | None
    appExitCode: int | None
    virtualCluster: str
    priority: int
    waitingReason: str | None
    tags: list[str] = []


class JobPage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """GET /api/v2/jobs?withTotalCount=true (OpenPAI's paged shape)."""

    totalCount: int
    data: list[JobRow]
    # PAI's addition, only when true: a keyword's count stopped at its cap, totalCount is a
    # lower bound (history_query.KEYWORD_TOTAL_MAX).
    totalCountCapped: bool = False


class ClusterInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: str
    launcherType: str  # "local" (processes here) or "k8s"
    authnMethod: str  # "basic": tokens and passwords kept by PAI


class SkuTypeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One leaf cell of a sku (OpenPAI's sku-types answer: memory in MB)."""

    gpu: int
    cpu: int
    memory: int


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    cpu: int = 0
    memory: int = 0  # MB
    gpu: int = 0


class VcSku(msgspec.Struct, frozen=True, kw_only=True):
    sku: str
    guaranteed: int
    used: int
    opportunistic: int
    total: int
    unhealthy: int = 0


class VirtualClusterDetail(msgspec.Struct, frozen=True, kw_only=True):
    """GET /api/v2/virtual-clusters/{vc}: OpenPAI's capacity figures (percent of the
    cluster's cells) and resources, plus PAI's cells per sku and queue."""

    name: str
    capacity: float
    usedCapacity: float
    maxCapacity: float
    dedicated: bool
    resourcesGuaranteed: Resources
    resourcesUsed: Resources
    resourcesTotal: Resources
    skus: list[VcSku]
    queued: int
    running: int


class JobEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened to a job (Kubernetes event-like, as OpenPAI shows them)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    firstTimestamp: int  # ms since the epoch
    lastTimestamp: int
    count: int = 1
    attempt: int | None = None
    involvedObject: str  # the job id, or "<job>/<role>/<index>" for a task


class JobEvents(msgspec.Struct, frozen=True, kw_only=True):
    data: list[JobEvent]


_encoder = msgspec.json.Encoder()


def json_response(value: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """`value` as JSON, encoded by msgspec (several times faster than aiohttp's `json.dumps`)."""
    return web.Response(body=_encoder.encode(value), status=status, content_type="application/json",
                        headers=headers)


# --- loading a job ------------------------------------------------------------------------


def job_param(request: web.Request) -> str:
    jid = request.match_info["job"]
    try:
        user, name = ids.split_job_id(jid)
    except ValueError:
        raise NotFound(f"no job {jid[:200]!r}: job ids look like user~name") from None
    if len(user) > MAX_USERNAME_LENGTH or len(name) > MAX_JOB_NAME_LENGTH:
        raise NotFound(f"no job {jid[:200]!r}: user names are at most {MAX_USERNAME_LENGTH} characters, "
                       f"job names at most {MAX_JOB_NAME_LENGTH}")
    return jid


async def load_job(ctx: ServiceContext, jid: str) -> tuple[SubmittedJob, int, JobRecord | None, ScheduleEntry | None]:
    key = ids.job_key(jid)
    sub, rec, sched = await asyncio.gather(
        get_json(await ctx.bus.kv(Bucket.JOBS), key, SubmittedJob),
        get_json(await ctx.bus.kv(Bucket.JOB_STATUS), key, JobRecord),
        get_json(await ctx.bus.kv(Bucket.SCHEDULE), key, ScheduleEntry),
    )
    if sub is None:
        raise NotFound(f"job {jid} not found")
    return sub[0], sub[1], rec[0] if rec else None, sched[0] if sched else None


async def read_job(request: web.Request, jid: str) -> tuple[SubmittedJob, JobRecord | None, Any]:
    """A job for an answer that only reads it: the submission and the scheduler's word
    from the index when it has the job (no round trip; the index follows the buckets
    within milliseconds and has a job this replica accepted at once), the launcher's
    full record from its bucket. A job the index has not got (yet) is read from the
    three buckets. Changes (tags) read the record with its revision: `load_job`."""
    index = request.app.get(INDEX)
    indexed = index.get(ids.job_key(jid)) if index is not None and index.ready else None
    if indexed is None:
        try:
            sub, _, rec, sched = await load_job(ctx_of(request), jid)
        except NotFound:  # a finished job whose live records left the buckets: from the history
            from services.rest import history_reads  # (late: it imports the history's wiring)
            found = await history_reads.read(request, jid)
            if found is None:
                raise
            return found[0], found[1], None
        return sub, rec, sched
    got = await get_json(await ctx_of(request).bus.kv(Bucket.JOB_STATUS), ids.job_key(jid), JobRecord)
    return indexed.record(), got[0] if got else None, indexed.schedule


def may_read_output(request: web.Request, sub: SubmittedJob) -> bool:
    """A job's output (logs, and the lines of them that explain a failure), its config
    and its attempts are for its owner and admins: they can show what its secrets printed."""
    user = request[USER]
    return user.admin or user.username == sub.user


def require_owner_or_admin(request: web.Request, sub: SubmittedJob, what: str) -> None:
    if not may_read_output(request, sub):
        raise Forbidden(f"only {sub.user} or an admin may {what} {sub.job}")


def waiting_reason(rec, sched) -> str | None:
    """Why the job's current attempt waits, as the scheduler last said."""
    if sched is None:
        return "submitted; the scheduler has not taken it up yet"
    if sched.placed or (rec is not None and sched.attempt != rec.attempt):
        return None
    return sched.reason or None


def _int_param(request: web.Request, name: str) -> int:
    raw = request.match_info[name]
    try:
        return int(raw)
    except ValueError:
        raise bad_field(name, "type", f"{name} must be an integer, got {raw[:40]!r}") from None


# --- one attempt, its tasks, their logs ----------------------------------------------------


def _attempt_view(sub: SubmittedJob, rec: JobRecord | None, attempt: int) -> dict[str, Any]:
    for shown in views.job_attempts(rec):
        if shown["attemptIndex"] == attempt:
            roles = shown["taskRoles"]
            return shown | {
                "jobName": sub.name,
                "frameworkName": sub.job,
                "userName": sub.user,
                "totalTaskRoleNumber": len(sub.spec.taskRoles),
                "totalTaskNumber": sub.spec.task_count,
                "totalGpuNumber": sum(r.instances * r.resources.gpu for r in sub.spec.taskRoles),
                "taskRoles": {name: {"taskRoleStatus": {"name": name}, "taskStatuses": tasks}
                              for name, tasks in roles.items()},
            }
    have = ", ".join(str(a.attempt) for a in rec.attempts) if rec and rec.attempts else "none yet"
    raise NotFound(f"job {sub.job} has no attempt {attempt} (its attempts: {have})")


def _task_of(sub: SubmittedJob, rec: JobRecord | None, attempt: int, role: str, index: int) -> dict[str, Any]:
    shown = _attempt_view(sub, rec, attempt)
    tasks = shown["taskRoles"].get(role)
    if tasks is None:
        roles = ", ".join(r.name for r in sub.spec.taskRoles)
        raise NotFound(f"job {sub.job} has no task role {role[:64]!r} (its roles: {roles})")
    for task in tasks["taskStatuses"]:
        if task["taskIndex"] == index:
            return task
    raise NotFound(f"attempt {attempt} of {sub.job} has no task {role}[{index}]")


async def get_task(request: web.Request) -> web.Response:
    sub, rec, _ = await read_job(request, job_param(request))
    require_owner_or_admin(request, sub, "read the tasks of")
    task = _task_of(sub, rec, _int_param(request, "attempt"), request.match_info["role"], _int_param(request, "index"))
    return json_response(task | {"taskRoleName": request.match_info["role"]})


async def get_task_log(request: web.Request) -> web.StreamResponse:
    ctx = ctx_of(request)
    jid = job_param(request)
    sub, rec, _ = await read_job(request, jid)
    require_owner_or_admin(request, sub, "read the logs of")
    attempt, role, index = _int_param(request, "attempt"), request.match_info["role"], _int_param(request, "index")
    _task_of(sub, rec, attempt, role, index)  # 404 naming what does not exist
    tail_bytes = _optional_count(request, "tailBytes")
    task_attempt = _optional_count(request, "taskAttempt")
    return await log_response(request, ctx.bus, LogRequest(job=jid, attempt=attempt, role=role, index=index,
                                                           tailBytes=tail_bytes, taskAttempt=task_attempt))


def _optional_count(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise bad_field(name, "type", f"{name} must be an integer, got {raw[:40]!r}") from None
    if value < 0:
        raise bad_field(name, "minimum", f"{name} must be >= 0")
    return value


# --- tags ------------------------------------------------------------------------------


def _tag_of(body: dict[str, Any]) -> str:
    if set(body) != {"value"}:
        raise bad_field("value", "required", 'the body must be {"value": "<tag>"} and nothing else')
    value = body["value"]
    if not isinstance(value, str):
        raise bad_field("value", "type", "the tag must be a string")
    if not 1 <= len(value) <= MAX_TAG_LENGTH:
        raise bad_field("value", "maxLength", f"a tag is 1 to {MAX_TAG_LENGTH} characters, got {len(value)}")
    if not TAG_PATTERN.match(value):
        raise bad_field("value", "pattern", "a tag is letters, digits and _ . : - (starting with a letter or digit)")
    return value


async def _change_tags(request: web.Request, change) -> web.Response:
    jid = job_param(request)
    body = await read_json_object(request, what="the tag", example='{"value": "baseline"}')
    tag = _tag_of(body)
    message = await change_tags(request.app, jid, tag, change,
                                allow=lambda sub: require_owner_or_admin(request, sub, "change the tags of"))
    return json_response(Message(message=message))


async def change_tags(app: web.Application, jid: str, tag: str, change, *, allow) -> str:
    """Change `jid`'s tags (`change`: `add_tag` or `remove_tag`) where `allow(sub)`
    does not raise; the message saying what was done. The tag route's, and the
    monitor's tag-job requests' over the bus (services/rest/tag_requests.py)."""
    ctx = app[CTX]
    kv = await ctx.bus.kv(Bucket.JOBS)
    key = ids.job_key(jid)
    for _ in range(TAG_UPDATE_ATTEMPTS):  # compare-and-set: a concurrent change of the record wins, then we retry
        try:
            sub, revision, _, _ = await load_job(ctx, jid)
        except NotFound:  # its live records expired: the history holds its tags alone
            done = await _change_archived_tags(app, jid, tag, change, allow)
            if done is None:
                raise
            if done is False:
                continue
            return done
        allow(sub)
        tags, message = change(sub.tags, tag, sub.job)
        if tags == sub.tags:
            return message
        changed = _encoder.encode(msgspec.structs.replace(sub, tags=tags))
        try:
            await kv.update(key, changed, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            continue
        index = app.get(INDEX)
        if index is not None:
            index.put_submission(key, changed)
        await _tags_to_history(app, jid, tags)
        return message
    raise Transient(f"the record of {jid} kept changing; try again")


async def _change_archived_tags(app: web.Application, jid: str, tag: str, change, allow) -> str | bool | None:
    """The tag change on an archived job (history_reads): its message; False where the
    tags changed meanwhile (read again); None where the history has no such job."""
    from services.rest import history_reads  # (late: it imports the history's wiring)

    found = await history_reads.archived(app, jid)
    if found is None:
        return None
    sub, expected = found
    allow(sub)
    tags, message = change(sub.tags, tag, sub.job)
    if tags == sub.tags:
        return message
    return message if await history_reads.change_tags(app, jid, tags, expected) else False


async def _tags_to_history(app: web.Application, jid: str, tags: list[str]) -> None:
    """The history's copy of the tags (the tags filter reads it). Not reached (database
    away, or the job not projected yet): the list's settling writes them later
    (`settle_once`), as the index's row differs from the database's until then."""
    history = app.get(HISTORY)
    engine = history.engine if history is not None else None
    if engine is None:
        return
    try:
        await history_store.set_tags(engine, jid, tags)
    except (SQLAlchemyError, OSError) as exc:
        log.warning("tags of %s not written to the history database yet (%r)", jid, exc)


def _add_tag(tags: list[str], tag: str, jid: str) -> tuple[list[str], str]:
    if tag in tags:
        return tags, f"{jid} is already tagged {tag}"
    if len(tags) >= MAX_TAGS_PER_JOB:
        raise bad_field("value", "maxItems", f"a job has at most {MAX_TAGS_PER_JOB} tags; {jid} has {len(tags)}")
    return [*tags, tag], f"tagged {jid} {tag}"


def _remove_tag(tags: list[str], tag: str, jid: str) -> tuple[list[str], str]:
    if tag not in tags:
        return tags, f"{jid} is not tagged {tag}"
    return [t for t in tags if t != tag], f"removed tag {tag} from {jid}"


async def put_tag(request: web.Request) -> web.Response:
    return await _change_tags(request, _add_tag)


async def delete_tag(request: web.Request) -> web.Response:
    return await _change_tags(request, _remove_tag)


# --- deleting a finished job (services/rest/deletion.py) ------------------------------


async def delete_job(request: web.Request) -> web.Response:
    """DELETE /api/v2/jobs/{job}: a finished job's records, logs and files, by its owner or an admin."""
    ctx = ctx_of(request)
    jid = job_param(request)
    try:
        sub, _, rec, _ = await load_job(ctx, jid)
    except NotFound:  # its live records expired: found in the history, finished
        return await _delete_archived(request, jid)
    require_owner_or_admin(request, sub, "delete")
    if rec is None or not rec.state.is_final:
        state = rec.state.value if rec is not None else JobState.WAITING.value
        raise Conflict(f"job {jid} is {state}: only a finished job (SUCCEEDED, FAILED or STOPPED) can be deleted; "
                       f"stop it first (pai stop {jid}, or PUT /api/v2/jobs/{jid}/executionType "
                       '{"value": "STOP"}), then delete it', details={"state": state})
    await ctx.bus.publish(deletion.deleted_event(sub, request[USER].username))
    await deletion.remove_records(ctx, jid, sub.submittedAt)  # at once; the event makes every owner do its part
    index = request.app.get(INDEX)
    if index is not None:
        index.purged[ids.job_key(jid)] = time.time()  # its name held (the watch brings the purge's own time)
        index.delete_submission(ids.job_key(jid))  # and gone from this replica's list before the answer
    return json_response(Message(message=f"deleted {jid}: its records, logs and files are being removed"))


async def _delete_archived(request: web.Request, jid: str) -> web.Response:
    """DELETE of a job only the history holds (archived: finished long enough ago). The
    same JobDeleted (the launcher may still hold its record and logs, rest its secrets),
    and its history rows removed at once, so the answer is true when it comes."""
    from services.rest import history_reads  # (late: it imports the history's wiring)

    ctx = ctx_of(request)
    found = await history_reads.archived(request.app, jid)
    if found is None:
        raise NotFound(f"job {jid} not found")
    sub = found[0]
    require_owner_or_admin(request, sub, "delete")
    await ctx.bus.publish(deletion.deleted_event(sub, request[USER].username))
    await deletion.remove_records(ctx, jid, sub.submittedAt)  # its secrets (its record went at archiving)
    await history_reads.delete(request, sub)
    index = request.app.get(INDEX)
    if index is not None:
        index.purged[ids.job_key(jid)] = time.time()  # its name held, as after a live deletion
        index.unsettled.add(ids.job_key(jid))  # hidden from the list until the history lost it too
    return json_response(Message(message=f"deleted {jid}: its records, logs and files are being removed"))


# --- events ---------------------------------------------------------------------------


def job_events(sub: SubmittedJob, rec: JobRecord | None, reason: str | None, now: float) -> list[JobEvent]:
    """What happened to the job, oldest first: submission, every state change, every
    task attempt that ended badly, and (while it waits) why it waits now."""
    events = [JobEvent(type="Normal", reason="Submitted", message=f"submitted to virtual cluster {sub.vc}",
                       firstTimestamp=_ms(sub.submittedAt), lastTimestamp=_ms(sub.submittedAt), attempt=1,
                       involvedObject=sub.job)]
    if rec is not None:
        for change in rec.history:
            bad = change.to in (JobState.FAILED, JobState.STOPPED) or "retry" in change.why
            text = f"{change.from_.value if change.from_ else 'new'} -> {change.to.value}"
            events.append(JobEvent(type="Warning" if bad else "Normal", reason=change.to.value.capitalize(),
                                   message=f"{text}: {change.why}" if change.why else text,
                                   firstTimestamp=_ms(change.at), lastTimestamp=_ms(change.at),
                                   attempt=change.attempt, involvedObject=sub.job))
        for attempt in rec.attempts:
            for task in attempt.tasks:
                for ended in [*task.taskAttempts, task]:
                    code = ended.exitCode
                    if code is None or code == 0 or ended.completedTime is None:
                        continue
                    phrase = ended.exitSpec.phrase if ended.exitSpec is not None else "exited"
                    events.append(JobEvent(
                        type="Warning", reason="TaskFailed",
                        message=f"task {task.role}[{task.index}] exited with code {code} ({phrase})",
                        firstTimestamp=_ms(ended.completedTime), lastTimestamp=_ms(ended.completedTime),
                        attempt=attempt.attempt, involvedObject=f"{sub.job}/{task.role}/{task.index}"))
    if reason and (rec is None or rec.state == JobState.WAITING):
        events.append(JobEvent(type="Normal", reason="Waiting", message=reason, firstTimestamp=_ms(now),
                               lastTimestamp=_ms(now), attempt=rec.attempt if rec else 1, involvedObject=sub.job))
    events.sort(key=lambda e: e.firstTimestamp)
    return events


def _ms(t: float) -> int:
    return int(t * 1000)


async def from_history(request: web.Request, jid: str, what: str, gone: NotFound) -> AsyncEngine:
    """The history database for a job whose live records are gone (finished, expired from
    the buckets), after the same owner-or-admin check; `gone` again when it has not the job."""
    engine = history_engine(request)
    if engine is None:
        raise gone
    try:
        row = await history_query.get_job(engine, jid)
    except (SQLAlchemyError, OSError):
        raise gone from None
    if row is None:
        raise gone
    user = request[USER]
    if not (user.admin or user.username == row["username"]):
        raise Forbidden(f"only {row['username']} or an admin may {what} {jid}")
    return engine


# Events of a live job that only the history holds: its terminal sessions, which the
# launcher records as events (services/launcher/terminals.py) and keeps nowhere else.
HISTORY_ONLY_REASONS = ("TerminalOpened", "TerminalClosed")


async def _terminal_sessions(request: web.Request, sub: SubmittedJob) -> list[JobEvent]:
    engine = history_engine(request)
    if engine is None:
        return []
    try:
        stored = await history_query.job_events(engine, sub.job, reasons=HISTORY_ONLY_REASONS, since=sub.submittedAt)
    except (SQLAlchemyError, OSError):
        return []  # the history away: the live events still answer
    return msgspec.convert(stored, list[JobEvent])


async def get_job_events(request: web.Request) -> web.Response:
    jid = job_param(request)
    wanted = request.query.get("type")
    if wanted is not None and wanted not in ("Normal", "Warning"):
        raise bad_field("type", "enum", f"type is Normal or Warning, got {wanted[:40]!r}")
    try:
        sub, rec, sched = await read_job(request, jid)
    except NotFound as gone:
        engine = await from_history(request, jid, "read the events of", gone)
        stored = await history_query.job_events(engine, jid, type_=wanted)
        return json_response(JobEvents(data=msgspec.convert(stored, list[JobEvent])))
    require_owner_or_admin(request, sub, "read the events of")
    events = job_events(sub, rec, waiting_reason(rec, sched), time.time())
    events += await _terminal_sessions(request, sub)
    events.sort(key=lambda e: e.firstTimestamp)
    if wanted is not None:
        events = [e for e in events if e.type == wanted]
    return json_response(JobEvents(data=events))


def history_attempts(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history's attempts (query.job_attempts: oldest first, every task attempt) in
    GET /api/v2/jobs/{id}/job-attempts' shape (views.job_attempts): newest first, each
    task's last attempt with the earlier ones under taskAttempts (pure)."""
    out = []
    latest = max((a["attemptIndex"] for a in stored), default=0)
    for attempt in reversed(stored):
        roles: dict[str, list[dict[str, Any]]] = {}
        tasks: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for task in attempt["tasks"]:
            tasks.setdefault((task["taskRoleName"], task["taskIndex"]), []).append(task)
        for (role, index), tried in tasks.items():
            last = tried[-1]
            roles.setdefault(role, []).append({
                "taskIndex": index, "taskState": last["taskState"], "retries": last["taskAttempt"],
                "containerNodeName": last["containerNodeName"], "containerExitCode": last["containerExitCode"],
                "containerExitSpec": None if last["containerExitSpecCode"] is None else {
                    "code": last["containerExitSpecCode"], "phrase": last["containerExitPhrase"]},
                "launchedTime": last["launchedTime"], "completedTime": last["completedTime"],
                "taskAttempts": [{"taskAttempt": t["taskAttempt"], "state": t["taskState"],
                                  "node": t["containerNodeName"], "exitCode": t["containerExitCode"],
                                  "launchedTime": t["launchedTime"], "completedTime": t["completedTime"]}
                                 for t in tried[:-1]],
            })
        out.append({
            "attemptIndex": attempt["attemptIndex"], "isLatest": attempt["attemptIndex"] == latest,
            "state": attempt["state"], "createdTime": attempt["createdTime"], "launchedTime": attempt["launchedTime"],
            "completedTime": attempt["completedTime"], "exitCode": attempt["exitCode"],
            "exitSpec": None if attempt["exitPhrase"] is None else {"phrase": attempt["exitPhrase"]},
            "taskRoles": roles, "fromHistory": True,
        })
    return out


# --- the cluster: info, sku types, one VC, nodes -----------------------------------------


async def cluster_view(ctx: ServiceContext) -> ClusterView:
    got = await get_json(await ctx.bus.kv(Bucket.CLUSTER), CLUSTER_VCS_KEY, ClusterView)
    return got[0] if got else ClusterView()


async def check_against_cluster(request: web.Request, check) -> ClusterView:
    """Run `check(view)` (it raises what it refuses) on the scheduler's cluster view as
    rest's watch holds it (no round trip). That copy may lag the bucket by the watch's
    delivery: it may accept what the stored view would refuse (the scheduler judges the
    job again and says why it waits), but a refusal is always judged again on the
    stored view, so a VC just added is never refused. Returns the view judged on."""
    watched = request.app.get(CLUSTER_VIEW)
    held = watched.value if watched is not None else None
    if held is not None:
        try:
            check(held)
            return held
        except (BadInput, Forbidden, NoVirtualCluster):
            pass
    view = await cluster_view(ctx_of(request))
    check(view)
    return view


@functools.cache  # the installed version does not change while rest runs; looking it up scans sys.path (~0.7 ms)
def _version() -> str:
    try:
        return importlib.metadata.version("pai")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


async def get_info(request: web.Request) -> web.Response:
    backend = ctx_of(request).config.backend
    return json_response(ClusterInfo(name="PAI RESTful API", version=_version(),
                             launcherType="k8s" if backend == "kubernetes" else backend, authnMethod="basic"))


async def get_sku_types(request: web.Request) -> web.Response:
    view = await cluster_view(ctx_of(request))
    skus = view.skuTypes
    vc_name = request.query.get("vc")
    if vc_name is not None:
        vc = _find_vc(view, vc_name)
        skus = {s["sku"]: skus[s["sku"]] for s in vc.get("skus", []) if s["sku"] in skus}
    return json_response({name: SkuTypeInfo(gpu=int(s.get("gpu", 0)), cpu=int(s.get("cpu", 0)), memory=int(s.get("memory", 0)))
                  for name, s in skus.items()})


async def get_vc_sku_types(request: web.Request) -> web.Response:
    """GET /api/v2/virtual-clusters/{vc}/sku-types (OpenPAI's SDK asks it): the sku types of one VC."""
    view = await cluster_view(ctx_of(request))
    vc = _find_vc(view, request.match_info["vc"])
    return json_response({s["sku"]: SkuTypeInfo(gpu=int(view.skuTypes[s["sku"]].get("gpu", 0)),
                                                cpu=int(view.skuTypes[s["sku"]].get("cpu", 0)),
                                                memory=int(view.skuTypes[s["sku"]].get("memory", 0)))
                          for s in vc.get("skus", []) if s["sku"] in view.skuTypes})


def _find_vc(view: ClusterView, name: str) -> dict[str, Any]:
    for vc in view.virtualClusters:
        if vc.get("name") == name:
            return vc
    known = ", ".join(sorted(str(v.get("name")) for v in view.virtualClusters)) or "none yet"
    raise NoVirtualCluster(f"virtual cluster {name[:64]!r} does not exist; known: {known}")


def vc_detail(vc: dict[str, Any], sku_types: dict[str, dict[str, Any]]) -> VirtualClusterDetail:
    """OpenPAI's capacity figures of one VC from its cells per sku (pure)."""
    skus = [VcSku(sku=s["sku"], guaranteed=int(s.get("guaranteed", 0)), used=int(s.get("used", 0)),
                  opportunistic=int(s.get("opportunistic", 0)), total=int(s.get("total", 0)),
                  unhealthy=int(s.get("unhealthy", 0))) for s in vc.get("skus", [])]

    def resources(count) -> Resources:
        cpu = memory = gpu = 0
        for s in skus:
            cell = sku_types.get(s.sku, {})
            n = count(s)
            cpu, memory, gpu = cpu + n * int(cell.get("cpu", 0)), memory + n * int(cell.get("memory", 0)), \
                gpu + n * int(cell.get("gpu", 0))
        return Resources(cpu=cpu, memory=memory, gpu=gpu)

    total_cells = sum(s.total for s in skus)
    guaranteed = sum(s.guaranteed for s in skus)
    used = sum(s.used + s.opportunistic for s in skus)

    def percent(n: int) -> float:
        return round(100.0 * n / total_cells, 2) if total_cells else 0.0

    return VirtualClusterDetail(
        name=str(vc.get("name")), capacity=percent(guaranteed), usedCapacity=percent(used), maxCapacity=100.0,
        dedicated=False, resourcesGuaranteed=resources(lambda s: s.guaranteed),
        resourcesUsed=resources(lambda s: s.used + s.opportunistic), resourcesTotal=resources(lambda s: s.total),
        skus=skus, queued=int(vc.get("queued", 0)), running=int(vc.get("running", 0)),
    )


async def list_virtual_clusters(request: web.Request) -> web.Response:
    """Every VC by name, each as GET /api/v2/virtual-clusters/{vc} shows it."""
    view = await cluster_view(ctx_of(request))
    return json_response({str(vc.get("name")): vc_detail(vc, view.skuTypes) for vc in view.virtualClusters})


async def get_virtual_cluster(request: web.Request) -> web.Response:
    view = await cluster_view(ctx_of(request))
    return json_response(vc_detail(_find_vc(view, request.match_info["vc"]), view.skuTypes))


# --- the job list: filters, order, paging --------------------------------------------------


ORDER_FIELDS = {
    "submissionTime": "createdTime", "createdTime": "createdTime", "completionTime": "completedTime",
    "completedTime": "completedTime", "name": "name", "jobName": "name", "username": "username",
    "userName": "username", "vc": "virtualCluster", "virtualCluster": "virtualCluster", "state": "state",
    "status": "state", "retries": "retries", "totalGpuNumber": "totalGpuNumber", "gpu": "totalGpuNumber",
    "totalTaskNumber": "totalTaskNumber", "priority": "priority",
}


class ListQuery(msgspec.Struct, frozen=True, kw_only=True):
    """GET /api/v2/jobs's query, as OpenPAI's: every filter optional, lists comma-separated."""

    username: str | None = None
    vc: str | None = None
    states: frozenset[str] = frozenset()
    keyword: str | None = None
    tags_any: frozenset[str] = frozenset()  # `tags` or OpenPAI's `tagsContain`: at least one of them
    tags_none: frozenset[str] = frozenset()  # `tagsNotContain`: none of them
    order_field: str = "createdTime"
    descending: bool = True
    offset: int = 0
    limit: int = DEFAULT_LIST_LIMIT
    with_total: bool = False


def _csv(value: str | None) -> frozenset[str]:
    return frozenset(v.strip() for v in (value or "").split(",") if v.strip())


def parse_list_query(q) -> ListQuery:
    """The query string of GET /api/v2/jobs, or a 400 naming the parameter (pure)."""
    try:
        offset = int(q.get("offset", 0))
        limit = int(q.get("limit", DEFAULT_LIST_LIMIT))
    except ValueError:
        raise bad_field("offset", "type", "offset and limit must be integers") from None
    if offset < 0:
        raise bad_field("offset", "minimum", "offset must be >= 0")
    if offset > MAX_LIST_OFFSET:
        raise bad_field("offset", "maximum", f"offset must be at most {MAX_LIST_OFFSET}")
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise bad_field("limit", "maximum", f"limit must be between 1 and {MAX_LIST_LIMIT}")
    states = frozenset(s.upper() for s in _csv(q.get("state")))
    unknown = states - {s.value for s in JobState}
    if unknown:
        raise bad_field("state", "enum", f"unknown state(s) {', '.join(sorted(unknown))[:80]}; "
                        f"use {', '.join(s.value for s in JobState)}")
    field, descending = "createdTime", True
    if q.get("order"):
        name, _, direction = q["order"].partition(",")
        if name not in ORDER_FIELDS:
            raise bad_field("order", "enum", f"cannot order by {name[:40]!r}; use one of {', '.join(ORDER_FIELDS)}")
        if direction.upper() not in ("", "ASC", "DESC"):
            raise bad_field("order", "enum", "the direction after the comma is ASC or DESC")
        field, descending = ORDER_FIELDS[name], direction.upper() != "ASC"
    return ListQuery(
        username=q.get("username") or None, vc=q.get("vc") or None, states=states,
        keyword=(q.get("keyword") or "").lower() or None,
        tags_any=_csv(q.get("tags")) | _csv(q.get("tagsContain")), tags_none=_csv(q.get("tagsNotContain")),
        order_field=field, descending=descending, offset=offset, limit=limit,
        with_total=q.get("withTotalCount", "").lower() in ("1", "true", "yes"),
    )


def _matches(query: ListQuery, sub: Listed, row: JobRow) -> bool:
    if query.username is not None and sub.user != query.username:
        return False
    if query.vc is not None and sub.vc != query.vc:
        return False
    if query.states and row.state.value not in query.states:
        return False
    if query.tags_any and not query.tags_any & set(sub.tags):
        return False
    if query.tags_none and query.tags_none & set(sub.tags):
        return False
    if query.keyword is not None and query.keyword not in sub.job.lower():
        return False
    return True


def order_jobs(jobs: list[tuple[Listed, JobRow]], field: str, descending: bool
               ) -> list[tuple[Listed, JobRow]]:
    """The jobs ordered by a row field; jobs without it (not completed yet) last, ties by job id (pure)."""
    present = [j for j in jobs if getattr(j[1], field) is not None]
    missing = [j for j in jobs if getattr(j[1], field) is None]
    present.sort(key=lambda j: (getattr(j[1], field), j[1].debugId), reverse=descending)
    missing.sort(key=lambda j: j[1].debugId)
    return present + missing


def _filtered(query: ListQuery) -> bool:
    return bool(query.username or query.vc or query.states or query.keyword or query.tags_any or query.tags_none)


def select_jobs(query: ListQuery, ordered: list[tuple[Listed, JobRow]]) -> tuple[int, list[JobRow]]:
    """(how many match, the page asked for) of jobs already in the query's order (pure)."""
    end = query.offset + query.limit
    if not _filtered(query):
        return len(ordered), [row for _, row in ordered[query.offset:end]]
    rows = [row for sub, row in ordered if _matches(query, sub, row)]
    return len(rows), rows[query.offset:end]


def job_row(sub: Listed, status, schedule) -> JobRow:
    summary = views.job_summary(sub, status, waiting_reason(status, schedule))
    return JobRow(**(summary | {"state": JobState(summary["state"])}), tags=list(sub.tags))


async def _rows_from_buckets(ctx: ServiceContext, query: ListQuery) -> list[tuple[Listed, JobRow]]:
    """Without the index (still loading, or NATS just came back): read the buckets."""
    keys = await all_keys(await ctx.bus.kv(Bucket.JOBS))
    if query.username is not None:
        keys = [k for k in keys if k.split(".", 1)[0] == query.username]

    # Bounded: ten thousand jobs read all at once are thirty thousand requests in
    # flight, and NATS answers some of them only after the client gave up.
    reading = asyncio.Semaphore(FALLBACK_READS_IN_FLIGHT)

    async def one(key: str):
        async with reading:
            try:
                sub, _, rec, sched = await load_job(ctx, ids.job_id_from_key(key))
            except NotFound:
                return None  # deleted between listing and reading
        return sub, job_row(sub, rec, sched)

    return [got for got in await asyncio.gather(*(one(k) for k in keys)) if got is not None]


def _indexed_row(job: IndexedJob) -> JobRow:
    return job_row(job.brief, job.status, job.schedule)


def row_of(job: IndexedJob) -> JobRow:
    """The job's list row, made when first asked for and kept until the job changes
    (the index drops it then: job_index.JobIndex._relist)."""
    if job.row is None:
        job.row = _indexed_row(job)
    return job.row


def _ordered_from_index(index: JobIndex, field: str, descending: bool):
    """The index's (brief, row) pairs in this order: sorted once, then kept sorted through
    every change (job_index.OrderedView: a page reads a slice, not every row)."""
    return index.ordered(field, descending, _indexed_row)


def history_engine(request: web.Request) -> AsyncEngine | None:
    history = request.app.get(HISTORY)
    return history.engine if history is not None else None


def _order_rows(field: str, descending: bool) -> Any:
    return lambda rows: [row for _, row in order_jobs([(None, row) for row in rows], field, descending)]


async def _list_from_history(engine: AsyncEngine, index: JobIndex,
                             query: ListQuery) -> tuple[int, list[JobRow], bool]:
    """The page from the history database, with the index's rows of jobs the database may
    not have as they are now laid over it (services/rest/history/overlay.py): a job just
    submitted, or just changed, shows at its latest state; a job just deleted does not show.
    (total, page, whether the total is a lower bound: a keyword's count stops at a cap)."""
    keys = list(index.unsettled)
    overlaid = []
    for key in keys:
        job = index.jobs.get(key)
        if job is None:
            continue
        row = row_of(job)
        if _matches(query, job.brief, row):
            overlaid.append(row)
    start, count = overlay.window(query.offset, query.limit, len(overlaid))
    found = history_query.JobFilter(
        user=query.username, vc=query.vc, states=query.states, keyword=query.keyword, tags_any=query.tags_any,
        tags_none=query.tags_none, order_field=query.order_field, descending=query.descending, offset=start,
        limit=count)
    order = _order_rows(query.order_field, query.descending)
    # A window longer than the page (rows laid over it may come before any of its rows):
    # only its rows that land on the page are read in full.
    place = (lambda window: overlay.on_page(window, start, overlaid, query.offset, query.limit, order)
             ) if count > query.limit else None
    total, rows, skipped = await history_query.list_page(
        engine, found, excluding={ids.job_id_from_key(k) for k in keys}, place=place)
    db_rows = [msgspec.convert(row, JobRow) for row in rows]
    page = overlay.page(db_rows, start + skipped, overlaid, query.offset, query.limit, order)
    return (total.n if total else 0) + len(overlaid), page, bool(total and total.capped)


async def list_jobs(request: web.Request) -> web.Response:
    query = parse_list_query(request.query)
    index = request.app.get(INDEX)
    engine = history_engine(request)
    if engine is not None and index is not None and index.ready and len(index.unsettled) <= MAX_OVERLAY:
        try:
            total, page, capped = await _list_from_history(engine, index, query)
            return _list_response(query, total, page, capped=capped)
        except (SQLAlchemyError, OSError) as exc:  # the database away: the index answers
            log.warning("job list: the history database did not answer (%r); listing from the index", exc)
    if index is not None and index.ready:
        ordered = _ordered_from_index(index, query.order_field, query.descending)
        if _filtered(query):
            # The same filter again, with the index unchanged (lists far outnumber
            # changes, e.g. a portal page polling), costs a slice: the matches are kept.
            filters = msgspec.structs.replace(query, offset=0, limit=1, with_total=False)
            ordered = index.memo(("matching", filters),
                                 lambda: [(sub, row) for sub, row in ordered if _matches(query, sub, row)])
            query = msgspec.structs.replace(query, username=None, vc=None, states=frozenset(), keyword=None,
                                            tags_any=frozenset(), tags_none=frozenset())
    else:
        ordered = order_jobs(await _rows_from_buckets(ctx_of(request), query), query.order_field, query.descending)
    total, page = select_jobs(query, ordered)
    return _list_response(query, total, page)


def _list_response(query: ListQuery, total: int, page: list[JobRow], *, capped: bool = False) -> web.Response:
    headers = {"X-Total-Count": str(total)}
    if capped:  # at least this many match
        headers["X-Total-Count-Capped"] = "true"
    if query.with_total:
        return json_response(JobPage(totalCount=total, data=page, totalCountCapped=capped), headers=headers)
    return json_response(page, headers=headers)


async def settle(index: JobIndex, history: Any, stopping: asyncio.Event, *, every: float = SETTLE_SECONDS,
                 quiet: float = SETTLE_QUIET_SECONDS) -> None:
    """Keep the index's unsettled set to the jobs the history database does not have as
    the index has them: a row found equal there leaves it (until it changes again); a
    deleted job leaves it once the database dropped it too. Tags are not events: a row
    that differs only in them (tagged before its submission was projected) gets the
    index's tags written (store.set_tags), and settles on the next pass."""
    while not stopping.is_set():
        await asyncio.sleep(every)
        engine = history.engine if history is not None else None
        if engine is None or not index.ready or not index.unsettled:
            continue
        try:
            await settle_once(index, engine, quiet=quiet)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("job list: comparing with the history database failed (%r)", exc)


async def settle_once(index: JobIndex, engine: AsyncEngine, *, quiet: float = 0.0) -> None:
    """One settling pass over the rows unchanged for `quiet` seconds."""
    keys = index.unsettled.quiet(quiet)
    for at in range(0, len(keys), SETTLE_BATCH):
        batch = keys[at:at + SETTLE_BATCH]
        stored = await history_query.rows_of(engine, [ids.job_id_from_key(k) for k in batch])
        # Archived (its record purged from pai_jobs, which the index takes for a deletion):
        # the history's row is the truth, the list shows it.
        gone = [jid for jid in stored if ids.job_key(jid) not in index.jobs]
        archived = await history_store.archived_among(engine, gone) if gone else set()
        retag: list[tuple[str, list[str]]] = []
        for key in batch:  # no await from here to the discards: the index is as compared
            jid = ids.job_id_from_key(key)
            job, row = index.jobs.get(key), stored.get(jid)
            if job is None:
                if row is None or jid in archived:  # deleted here and there, or archived
                    index.unsettled.discard(key)
                continue
            if row is None:
                continue
            live = msgspec.to_builtins(row_of(job))
            if live == row:
                index.unsettled.discard(key)
            elif live | {"tags": row["tags"]} == row:
                retag.append((jid, live["tags"]))
        for jid, tags in retag:
            await history_store.set_tags(engine, jid, tags)


# --- submit-time capacity check -----------------------------------------------------------


def check_fits(spec: JobSpec, view: ClusterView) -> None:
    """400 when the job can never fit its VC even empty (services/rest/capacity.py)."""
    problem = capacity.never_fits(spec, view)
    if problem is not None:
        raise BadInput(f"{problem.path}: {problem.message}",
                       details={"errors": [{"path": problem.path, "rule": "never_fits", "message": problem.message}]})


# --- wiring -------------------------------------------------------------------------------




def setup(app: web.Application, ctx: ServiceContext) -> None:
    """Routes, the job index, the watched cluster view and the sweep of unpublished
    submissions (started and stopped with the app)."""
    from services.rest import openapi  # the document lists these routes; imported here to avoid a cycle

    quotas.setup(app)  # (the job routes: services/rest/routes/jobs.py; the cluster's: routes/cluster.py)
    app.add_routes(openapi.routes)  # public: auth.PUBLIC_PATHS
    index = JobIndex()
    app[INDEX] = index
    app[INTAKE] = submissions = intake.Intake(ctx, index)
    view = WatchedValue(Bucket.CLUSTER, CLUSTER_VCS_KEY, ClusterView, ClusterView())
    app[CLUSTER_VIEW] = view

    async def run_index(_: web.Application):
        stopping = asyncio.Event()
        tasks = [asyncio.ensure_future(index.run(ctx.bus, stopping)),
                 asyncio.ensure_future(view.run(ctx.bus, stopping)),
                 # Records whose JobSubmitted may not be out, found through the index.
                 asyncio.ensure_future(submissions.run_sweep(stopping)),
                 # Which index rows the history database has as they are (the list's overlay).
                 asyncio.ensure_future(settle(index, app.get(HISTORY), stopping)),
                 asyncio.ensure_future(deletion.consume(ctx, stopping))]
        yield
        stopping.set()
        for task in tasks:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    app.cleanup_ctx.append(run_index)
