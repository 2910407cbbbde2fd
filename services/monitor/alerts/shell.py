"""The alerts' async shell in the cluster monitor: readings in, the core's
decisions out as bucket writes, events, mail and action requests.

- Evaluates the rules every `alert_evaluate_seconds` over the node samples in
  `pai_nodes`, the job events the monitor consumes, and the readiness of the
  PAI services (their `/readyz`).
- Writes every alert to `pai_alerts` and publishes `AlertFiring` /
  `AlertResolved` (ids `<fingerprint>@<startsAt>/firing|resolved`, so a
  repeat after a crash is deduplicated by JetStream).
- Mails through one sender task, so a slow or absent mail server delays mail,
  never evaluation or event handling. What was mailed is stored first (group
  state, `sent.` claims): after a crash a mail may be lost, never sent twice.
- Sends the alerts to Alertmanager and the notifications to a webhook, each
  receiver from its own task with its own retries (senders.py, outbound.py).
- Runs the actions: stop-job and cordon-node publish the requests the API
  publishes; tag-job (tag `alert:<rule>`) asks rest over the bus
  (`pai.rpc.v1.job_tag`), which tags the job as its tag route does: the
  monitor holds no API token.
- Answers `pai.rpc.v1.alerts` (rules, report) as one of the queue group
  "monitor"; every replica watches the rule document.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
import nats.errors
import nats.js.errors

from libs.common import documents
from libs.common.alerts_messages import (
    ALERTS_QUEUE,
    ALERTS_SUBJECT,
    AlertAction,
    AlertRecord,
    AlertsReply,
    AlertsRequest,
    AlertState,
    Outcome,
    Problem,
)
from libs.common.bus import load_all, read_pages
from libs.common.config import Config
from libs.common.errors import Transient
from libs.common.ids import EventId, JobId, NodeName, VcName
from libs.common.job_tags import TagReply, TagRequest
from libs.common.messages import (
    AlertFiring,
    AlertResolved,
    Event,
    JobState,
    NodeCordonChanged,
    StopRequested,
)
from libs.common.records import JobRecord
from libs.common.schedule import ScheduleEntry
from libs.common.service import ServiceContext
from libs.common.subjects import JOB_TAG_SUBJECT, Bucket
from services.monitor import metrics
from services.monitor.alerts.compose import compose, compose_report
from services.monitor.alerts.core import (
    ActionDue,
    AlertCore,
    AlertEnded,
    AlertFired,
    JobView,
    NodeReading,
    Notification,
    ServiceReading,
)
from services.monitor.alerts.mailer import Mailer, MailSettings
from services.monitor.alerts.report import build_report, weekly_report_due
from services.monitor.alerts.rules import Action, InvalidRules, load_rules_text
from services.monitor.alerts.senders import AlertmanagerSender, WebhookSender
from services.monitor.alerts.store import (
    REPORT_PREFIX,
    SENT_PREFIX,
    AlertStore,
    RuleDocument,
    RulesKey,
    Snapshot,
)
from services.monitor.core.samples import NodeSample
from services.monitor.core.updates import RaiseAlert

log = logging.getLogger("pai.monitor.alerts")

DEFAULT_RULES_FILE = Path(__file__).with_name("default_rules.yaml")
PROBED_SERVICES = ("rest", "scheduler", "launcher", "runtime")
PROBE_TIMEOUT_SECONDS = 5.0
REPORT_CHECK_SECONDS = 600.0
TAG_ATTEMPTS = 5
MAX_TAG_LENGTH = 64  # the API's limit on a job tag
NATS_TROUBLE = (nats.errors.Error, asyncio.TimeoutError, OSError, Transient)

_sample_decoder = msgspec.json.Decoder(NodeSample)
_record_decoder = msgspec.json.Decoder(JobRecord)


class _RecordTimes(msgspec.Struct):
    state: JobState = JobState.WAITING  # the record leaves its defaults out
    createdTime: float = 0.0
    completedTime: float | None = None


_times_decoder = msgspec.json.Decoder(_RecordTimes)
_schedule_decoder = msgspec.json.Decoder(ScheduleEntry)


class _User(msgspec.Struct, kw_only=True):
    email: str = ""


def baseline(config: Config) -> tuple[str, str]:
    """The rule document in effect while admins changed nothing: (yaml, source)."""
    if config.alert_rules_file:
        return Path(config.alert_rules_file).read_text(), "file"
    return DEFAULT_RULES_FILE.read_text(), "defaults"


def reading_of(sample: NodeSample) -> NodeReading:
    """The rules' view of a node sample (fields the agent may not fill are optional)."""

    def percent(used: int, total: int) -> float | None:
        return 100.0 * used / total if total else None

    gpus = sample.gpus
    return NodeReading(
        node=sample.node, at=sample.at, cpuPercent=sample.cpuPercent,
        memoryPercent=percent(sample.memoryUsedBytes, sample.memoryTotalBytes),
        diskPercent=percent(sample.diskUsedBytes, sample.diskTotalBytes),
        eccDoubleBit={g.index: n for g in gpus if (n := getattr(g, "eccErrors", {}).get("volatile_double", 0))},
        externalProcesses=len(getattr(sample, "externalGpuProcesses", [])),
        gpuUtilization={g.index: g.utilizationGpuPercent for g in gpus if g.utilizationGpuPercent is not None},
    )


def job_view_of(record: JobRecord) -> JobView:
    """A job as the launcher recorded it, for a restarted monitor. A finished job's
    view keeps what rules read of it (its state, its times as the live view has
    them: `waitingSince` dates a finished job's forgetting; when and why it failed,
    and a failed job's nodes: its JobFailed alert names them and a lost one's
    NodeNotReady inhibits it), not its GPUs or mail settings: it never runs or
    changes state again."""
    current = record.attempts[-1] if record.attempts else None
    tasks = current.tasks if current else []
    waiting_since = (current.createdTime if current else record.createdTime) or record.createdTime
    failed = record.state is JobState.FAILED
    nodes = tuple(dict.fromkeys(sys.intern(t.node) for t in tasks if t.node))
    common = dict(state=record.state, attempt=record.attempt, waitingSince=waiting_since,
                  runningSince=record.launchedTime, failedAt=record.completedTime if failed else None,
                  exitSpec=record.appExitSpec if failed else None,
                  exitCode=record.appExitCode if failed else None)
    if record.state.is_final:
        return JobView.new(record.job, record.user, record.vc, endedAt=record.completedTime,
                           nodes=nodes if failed else (), **common)
    return JobView.new(
        record.job, record.user, record.vc, **common,
        gpus=tuple((t.node, g) for t in tasks if t.node for g in t.gpus), nodes=nodes,
        notify=record.spec.notifyOnStateChange, notifyStates=tuple(record.spec.notifyStates),
        notifyEmails=tuple(record.spec.notifyEmails),
    )


class AlertShell:
    def __init__(self, ctx: ServiceContext, *, clock: Callable[[], float] = time.time, mailer: Mailer | None = None):
        self.ctx = ctx
        self.config = ctx.config
        self.clock = clock
        self.settings = MailSettings.from_config(ctx.config)
        self.mailer = mailer or Mailer(self.settings)
        self.baseline_yaml, self.baseline_source = baseline(ctx.config)
        self.core = AlertCore(load_rules_text(self.baseline_yaml),
                              max_job_alerts_per_user=ctx.config.alert_max_job_alerts_per_user)
        self.document = Snapshot(value=None, revision=0)
        self.outbox: asyncio.Queue[Notification] = asyncio.Queue()
        self.tags: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()  # (job, tag, by)
        self.written: dict[str, AlertRecord] = {}
        self._lock = asyncio.Lock()  # one evaluation or event at a time
        self._background: set[asyncio.Task] = set()
        am_urls = [u.strip() for u in self.config.alertmanager_urls.split(",") if u.strip()]
        self.alertmanager = AlertmanagerSender(
            am_urls, alerts=lambda: list(self.core.alerts.values()), clock=clock,
            resend_seconds=self.config.alertmanager_resend_seconds, portal_url=self.settings.portal_url,
        ) if am_urls else None
        self.webhook = WebhookSender(
            self.config.alert_webhook_url, token_file=self.config.alert_webhook_token_file,
            portal_url=self.settings.portal_url,
        ) if self.config.alert_webhook_url else None

    # --- start-up ----------------------------------------------------------------

    async def start(self) -> None:
        bus = self.ctx.bus
        self.rules_key = RulesKey(await bus.kv(Bucket.ALERT_RULES))
        self.store = AlertStore(await bus.kv(Bucket.ALERTS))
        self.users = await bus.kv(Bucket.USERS)
        self.follow(await self.rules_key.read())
        alerts, groups = await self.store.load()
        self.core.restore(alerts, groups)
        self.written = {a.fingerprint: a for a in alerts}
        reasons = await self._waiting_reasons()
        # Jobs that finished longer ago than the core keeps a final job's view are left out.
        async for records in self._job_records(since=self.clock() - self.core.final_view_seconds):
            for record in records:
                view = job_view_of(record)
                if view.state is JobState.WAITING:
                    view.waitingReason = reasons.get((view.job, view.attempt), "")
                self.core.restore_job(view)
        log.info("alerts: %d rule(s), %d stored alert(s), %d job(s) restored",
                 len(self.core.rules.rules), len(alerts), len(self.core.jobs))
        requests = await documents.subscribe(bus, ALERTS_SUBJECT, ALERTS_QUEUE)  # requests from here on find it
        answer = documents.answering(AlertsRequest, self._handle, AlertsReply, what="an alerts", store="alert store")
        self.ctx.spawn(documents.serve(requests, answer), "alert-requests")
        # Every change made through any replica taken up (again after a reconnect).
        self.ctx.spawn(self.rules_key.follow(bus, self.ctx.stopping, self.follow), "alert-rules")
        self.ctx.spawn(self._send_forever(), "alert-mail")
        if self.alertmanager is not None:  # after the restore: the stored alerts go out at once
            self.ctx.spawn(self.alertmanager.run(), "alertmanager")
        if self.webhook is not None:
            self.ctx.spawn(self.webhook.run(), "alert-webhook")
        self.ctx.spawn(self._tag_forever(), "alert-tags")
        self.ctx.spawn(self._evaluate_forever(), "alert-evaluation")
        if self.config.usage_report_weekday >= 0:
            self.ctx.spawn(self._weekly_report(), "usage-report")

    # --- rules ---------------------------------------------------------------------

    def follow(self, snapshot: Snapshot) -> None:
        """Install the rule document of `snapshot` (a bad one stored is logged and skipped)."""
        if snapshot.revision and snapshot.revision <= self.document.revision:
            return  # installed already (this replica wrote it), or older than what is
        if snapshot == self.document:
            return  # still nothing stored: the baseline is in effect (the resync asks every few seconds)
        text = snapshot.value.yaml if snapshot.value and snapshot.value.yaml else self.baseline_yaml
        try:
            rules = load_rules_text(text)
        except InvalidRules as error:
            log.error("ignoring alert rules revision %d: %s", snapshot.revision, error)
            return
        self.core.set_rules(rules)
        self.document = snapshot
        log.info("alert rules at revision %d: %d rule(s)", snapshot.revision, len(rules.rules))

    # --- commands ------------------------------------------------------------------

    async def _handle(self, request: AlertsRequest) -> AlertsReply:
        match request.action:
            case AlertAction.GET_RULES:
                self.follow(await self.rules_key.read())
                return self._rules_reply()
            case AlertAction.SET_RULES | AlertAction.RESET_RULES:
                return await self._set_rules(request)
            case AlertAction.REPORT:
                return await self._report(request)
        return AlertsReply(outcome=Outcome.INVALID, message=f"unknown action {request.action}")

    def _rules_reply(self, message: str = "") -> AlertsReply:
        document = self.document.value
        admin_yaml = document.yaml if document is not None else ""
        admin = bool(admin_yaml)
        return AlertsReply(
            outcome=Outcome.OK, message=message, rules=admin_yaml if admin else self.baseline_yaml,
            revision=self.document.revision, source="admin" if admin else self.baseline_source,
            changedBy=document.by if document else "", changedAt=document.at if document else 0.0,
        )

    async def _set_rules(self, request: AlertsRequest) -> AlertsReply:
        text = request.rules if request.action is AlertAction.SET_RULES else ""
        if text:
            try:
                load_rules_text(text)
            except InvalidRules as error:
                return AlertsReply(outcome=Outcome.INVALID, message=f"the alert rules are not valid: {error}",
                                   problems=[Problem(path=p.path, message=p.message) for p in error.problems])

        def plan(current: Snapshot) -> documents.Write[RuleDocument, RuleDocument] | AlertsReply:
            if request.revision is not None and request.revision != current.revision:
                return AlertsReply(outcome=Outcome.STALE, message=(
                    f"the alert rules changed since revision {request.revision} (now {current.revision}); "
                    "read them again and redo the change"))
            document = RuleDocument(yaml=text, by=request.by, at=self.clock())
            return documents.Write(document, document)

        done: tuple[RuleDocument, int] | AlertsReply | None = await self.rules_key.edit(plan)
        if done is None:
            return AlertsReply(outcome=Outcome.STALE,
                               message="someone changed the alert rules at the same moment; read them again")
        if isinstance(done, AlertsReply):
            return done
        document, revision = done
        self.follow(Snapshot(value=document, revision=revision))
        log.info("alert rules %s by %s: revision %d", "set" if text else "reset", request.by or "-", revision)
        return self._rules_reply()

    async def _report(self, request: AlertsRequest) -> AlertsReply:
        now = self.clock()
        report = await self.build_report(now - request.days * 86400, now)
        mailed = False
        if request.send and self.settings.enabled and self.settings.admins:
            # Sent in the background: retries against a slow mail server outlast the request.
            task = asyncio.create_task(self._mail_report(report, now))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            mailed = True
        return AlertsReply(outcome=Outcome.OK, report=report, mailed=mailed)

    async def build_report(self, start: float, end: float) -> dict:
        readings = await self._node_readings()
        records = [record async for page in self._job_records(since=start) for record in page]
        return build_report(records, readings, start=start, end=end)

    async def _mail_report(self, report: dict, now: float) -> bool:
        if not self.settings.admins:
            log.warning("no admin_emails: the usage report is not mailed")
            return False
        sent = await self.mailer.send(compose_report(report, sender=self.settings.sender,
                                                     to=list(self.settings.admins), now=now))
        metrics.alert_mails_total.labels(kind="report", outcome="sent" if sent else "not_sent").inc()
        return sent

    async def _weekly_report(self) -> None:
        while True:
            now = self.clock()
            week = weekly_report_due(now, self.config.usage_report_weekday)
            if week is not None:
                try:
                    if await self.store.claim(REPORT_PREFIX, week):
                        await self._mail_report(await self.build_report(now - 7 * 86400, now), now)
                except NATS_TROUBLE as error:
                    log.warning("weekly usage report: %r; trying again later", error)
            await asyncio.sleep(REPORT_CHECK_SECONDS)

    # --- events and evaluation -----------------------------------------------------------

    async def handle(self, *events: Event) -> None:
        """Follow a batch of events; claim and queue the status mail they call for.

        Claimed before the ack: a redelivered event or a restart mails nobody
        twice. The claims of a batch are in flight together. When the core raises
        on an event (a bug), the mail of the events before it is still claimed
        and queued (a redelivery of those would find nothing new to mail)."""
        notifications: list[Notification] = []
        failure: Exception | None = None
        async with self._lock:
            for event in events:
                try:
                    notifications.extend(self.core.handle(event))
                except Exception as exc:  # noqa: BLE001 -- re-raised below, once the mail before it is safe
                    failure = exc
                    break
        await self._claim_and_queue(notifications)
        if failure is not None:
            raise failure

    async def raised(self, *raised: RaiseAlert) -> None:
        """One-off alerts raised elsewhere in the monitor (dead-lettered events):
        listed (as resolved at once: there is no condition to watch end) and
        mailed to the admins, once each."""
        at = self.clock()
        notifications = []
        async with self._lock:
            for one in raised:
                alert = AlertRecord(
                    fingerprint=one.id, rule=one.rule, severity=one.severity, state=AlertState.RESOLVED,
                    summary=one.summary, labels={**one.labels, "alertname": one.rule, "severity": one.severity},
                    startsAt=at, endsAt=at, job=one.job, user=one.job.split("~")[0] if "~" in one.job else "",
                    reason=one.summary,
                )
                alert = self.core.alerts.setdefault(alert.fingerprint, alert)
                notifications.append(Notification(
                    id=alert.fingerprint, kind="alert", toAdmins=True, rule=alert.rule, severity=alert.severity,
                    firing=(alert,)))
        await self._claim_and_queue(notifications)
        await self._write_alerts()
        if self.alertmanager is not None:
            self.alertmanager.poke()

    async def _claim_and_queue(self, notifications: list[Notification]) -> None:
        if not notifications:
            return
        claims = await asyncio.gather(*(self.store.claim(SENT_PREFIX, n.id) for n in notifications),
                                      return_exceptions=True)
        for notification, claimed in zip(notifications, claims, strict=True):
            if claimed is True:  # claimed by someone before (False): mailed already, or being
                self._queue(notification)
        for claimed in claims:
            if isinstance(claimed, BaseException):
                raise claimed

    async def _evaluate_forever(self) -> None:
        period = max(0.05, self.config.alert_evaluate_seconds)
        probing = asyncio.create_task(self._probe_forever(period))
        try:
            while True:
                try:
                    await self.evaluate_once()
                except NATS_TROUBLE as error:
                    log.warning("alert evaluation: NATS trouble (%r); next round tries again", error)
                await asyncio.sleep(period)
        finally:
            probing.cancel()

    async def evaluate_once(self) -> None:
        for reading in await self._node_readings():
            self.core.node_sampled(reading)
        async with self._lock:
            with metrics.alert_evaluation_seconds.time():
                outputs = self.core.evaluate(self.clock())
        for (rule, user), count in self.core.held_back.items():
            log.warning("alerts: %s holds for %d more of %s's jobs than get an alert of their own "
                        "(alert_max_job_alerts_per_user %d)", rule, count, user, self.core.max_job_alerts_per_user)
        metrics.record_alerts_firing(dict(Counter(
            (a.rule, a.severity) for a in self.core.alerts.values() if a.state is AlertState.FIRING)))
        await self._write_alerts()
        for output in outputs:
            match output:
                case AlertFired(alert=alert):
                    await self.ctx.bus.publish(AlertFiring(
                        id=EventId(f"{alert.fingerprint}@{alert.startsAt:.3f}/firing"), job=JobId(alert.job),
                        at=alert.startsAt, rule=alert.rule, severity=alert.severity, summary=alert.summary,
                        labels=alert.labels))
                case AlertEnded(alert=alert):
                    await self.ctx.bus.publish(AlertResolved(
                        id=EventId(f"{alert.fingerprint}@{alert.startsAt:.3f}/resolved"), job=JobId(alert.job),
                        at=alert.endsAt or self.clock(), rule=alert.rule, summary=alert.summary, labels=alert.labels))
                case Notification(group=group):
                    if group is not None:
                        await self.store.put_group(group)  # before mailing: never twice
                    self._queue(output)
                case ActionDue():
                    await self._act(output)
        if self.alertmanager is not None and any(isinstance(o, (AlertFired, AlertEnded)) for o in outputs):
            self.alertmanager.poke()  # stored above (_write_alerts): a restart sends the same

    def _queue(self, notification: Notification) -> None:
        """To mail and to the webhook, each with its own sender task."""
        self.outbox.put_nowait(notification)
        if self.webhook is not None:
            self.webhook.put(notification)

    async def _write_alerts(self) -> None:
        current = dict(self.core.alerts)
        for fingerprint, alert in current.items():
            if self.written.get(fingerprint) != alert:
                await self.store.put_alert(alert)
                self.written[fingerprint] = alert
        for fingerprint in set(self.written) - set(current):
            await self.store.forget_alert(fingerprint)
            del self.written[fingerprint]

    async def _act(self, due: ActionDue) -> None:
        alert = due.alert
        by = f"alert {alert.rule}"
        match due.action:
            case Action.STOP_JOB if alert.job:
                await self.ctx.bus.publish(StopRequested(
                    id=EventId(f"{alert.job}/stop"), job=JobId(alert.job), vc=VcName(alert.vc), by=by, at=self.clock()))
                log.warning("stop of %s requested by %s", alert.job, by)
            case Action.TAG_JOB if alert.job:
                self.tags.put_nowait((alert.job, f"alert:{alert.rule}"[:MAX_TAG_LENGTH], by))
            case Action.CORDON_NODE if alert.node:
                await self.ctx.bus.publish(NodeCordonChanged(
                    id=EventId(f"node/{alert.node}/cordon/alert/{alert.rule}/{int(alert.startsAt * 1000)}"), job=JobId(""),
                    node=NodeName(alert.node), cordoned=True, reason=alert.summary, by=by, at=self.clock()))
                log.warning("node %s cordoned by %s", alert.node, by)

    async def _node_readings(self) -> list[NodeReading]:
        kv = await self.ctx.bus.kv(Bucket.NODES)
        readings = []
        for raw in (await load_all(kv, msgspec.Raw)).values():  # one pass over the bucket, not a get per node
            try:
                readings.append(reading_of(_sample_decoder.decode(raw)))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # the agent's; a newer agent's sample we cannot read is skipped
        return readings

    async def _waiting_reasons(self) -> dict[tuple[str, int], str]:
        """(job, attempt) -> why it waits, as the scheduler last said (pai_schedule)."""
        kv = await self.ctx.bus.kv(Bucket.SCHEDULE)
        reasons: dict[tuple[str, int], str] = {}
        for raw in (await load_all(kv, msgspec.Raw)).values():
            try:
                entry = _schedule_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # the scheduler's; a value we cannot read only costs a reason
            if not entry.placed and entry.reason:
                reasons[(entry.job, entry.attempt)] = entry.reason
        return reasons

    async def _job_records(self, *, since: float) -> AsyncIterator[list[JobRecord]]:
        """The launcher's records, a page at a time (`read_pages`), less those of
        jobs finished before `since` (never decoded whole). A key written again
        while the read goes on comes twice: a restore keeps the first view of a
        job, and the events after it bring it on."""
        kv = await self.ctx.bus.kv(Bucket.JOB_STATUS)
        oldest = since
        async for page in read_pages(kv):
            records = []
            for entry in page:
                if entry.value is None:
                    continue
                try:
                    times = _times_decoder.decode(entry.value)
                    if times.state.is_final and (times.completedTime or times.createdTime) < oldest:
                        continue
                    records.append(_record_decoder.decode(entry.value))
                except (msgspec.DecodeError, msgspec.ValidationError) as error:  # the launcher's; skip, say so
                    log.warning("skipping job record %s: %s", entry.key, error)
            yield records

    # --- services ---------------------------------------------------------------------

    def probe_targets(self) -> dict[str, str]:
        """service -> its /readyz URL (`alert_probe_urls` "name=url,..."; "-": probe none)."""
        configured = self.config.alert_probe_urls
        if configured.strip() == "-":
            return {}
        if configured:
            pairs = (item.split("=", 1) for item in configured.split(",") if "=" in item)
            return {name.strip(): url.strip() for name, url in pairs}
        if self.config.backend == "kubernetes":
            # Each service is its own pod behind its own Service name, which only
            # the chart knows: without alert_probe_urls, ServiceDown has nothing to probe.
            log.warning("alert_probe_urls is not set: the ServiceDown rule probes no service")
            return {}
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::", "") else self.config.host
        return {name: f"http://{host}:{self.config.port_of(name)}/readyz" for name in PROBED_SERVICES}

    async def _probe_forever(self, period: float) -> None:
        targets = self.probe_targets()
        if not targets:
            return
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                for name, url in targets.items():
                    self.core.service_probed(await _probe(http, name, url, self.clock))
                await asyncio.sleep(period)

    # --- job tags (rest changes them, asked over the bus: no API token) -------------------

    async def _tag_forever(self) -> None:
        while True:
            job, tag, by = await self.tags.get()
            await self._tag(job, tag, by)

    async def _tag(self, job: str, tag: str, by: str) -> None:
        """Ask rest to tag `job` (`pai.rpc.v1.job_tag`, libs/common/job_tags.py);
        asked again while rest is away or busy, never raising."""
        pause = 1.0
        for attempt in range(1, TAG_ATTEMPTS + 1):
            try:
                reply = await documents.ask(self.ctx.bus, JOB_TAG_SUBJECT, TagRequest(job=job, tag=tag, by=by), TagReply,
                                            who="rest", timeout=PROBE_TIMEOUT_SECONDS * 2)
            except NATS_TROUBLE as error:
                problem = repr(error)
            else:
                if reply.outcome is Outcome.OK:
                    log.info("tag-job: %s", reply.message)
                    return
                if reply.outcome in (Outcome.INVALID, Outcome.NOT_FOUND):  # refused: asking again changes nothing
                    log.warning("tag-job: rest refused tagging %s %s: %s", job, tag, reply.message)
                    return
                problem = reply.message
            if attempt < TAG_ATTEMPTS:
                log.warning("tag-job: tagging %s failed (%s); retrying in %.0f s", job, problem, pause)
                await asyncio.sleep(pause)
                pause = min(60.0, pause * 2)
        log.error("tag-job: gave up tagging %s %s after %d attempts", job, tag, TAG_ATTEMPTS)

    # --- mail -------------------------------------------------------------------------

    async def _send_forever(self) -> None:
        while True:
            notification = await self.outbox.get()
            try:
                to = await self._recipients(notification)
                if not to:
                    log.info("notification %s has nobody to mail", notification.id)
                    continue
                sent = await self.mailer.send(compose(notification, sender=self.settings.sender, to=to,
                                                      portal_url=self.settings.portal_url, now=self.clock()))
                metrics.alert_mails_total.labels(kind=notification.kind, outcome="sent" if sent else "not_sent").inc()
            except NATS_TROUBLE as error:
                log.error("notification %s not mailed: %r", notification.id, error)
            except Exception:  # a bug in composing one mail must not stop every later one
                log.exception("notification %s not mailed", notification.id)

    async def _recipients(self, notification: Notification) -> list[str]:
        to: list[str] = list(self.settings.admins) if notification.toAdmins else []
        for user in notification.toUsers:
            address = await self._email_of(user)
            if address:
                to.append(address)
            else:
                log.info("user %s has no mail address; not mailing them %s", user, notification.id)
        to += notification.toAddresses
        return list(dict.fromkeys(to))

    async def _email_of(self, user: str) -> str:
        try:
            entry = await self.users.get(f"user.{user}")
        except nats.js.errors.KeyNotFoundError:
            return ""
        try:
            return msgspec.json.decode(entry.value or b"{}", type=_User).email
        except (msgspec.DecodeError, msgspec.ValidationError):
            return ""


async def _probe(http: aiohttp.ClientSession, name: str, url: str, clock: Callable[[], float]) -> ServiceReading:
    try:
        async with http.get(url) as response:
            ready = response.status == 200
            reason = "" if ready else f"{url} answered {response.status}: {(await response.text())[:200]}"
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        ready, reason = False, f"{url} did not answer: {error.__class__.__name__} {error}".strip()
    return ServiceReading(service=name, ready=ready, at=clock(), reason=reason)

