"""The alert core: readings, events and the clock in; alert transitions,
notifications and actions out. Pure: no I/O, no asyncio, the time is passed in.

Inputs: `node_sampled` (one node's latest reading), `node_status` (the
monitor's node health verdicts), `service_probed` (a PAI service's readiness),
`handle(event)` (job events from the bus) and `evaluate(now)`.

Contracts:
- An alert fires once its rule's condition has held for `for` seconds, and
  resolves the first evaluation the condition no longer holds; the same
  condition holding again later is a new alert (new `startsAt`).
- Notifications are per group (rule + the `groupBy` labels): one when an alert
  of the group fires, one when one resolves (if the rule sends resolve
  notices), and a reminder every `repeatInterval` while any fires. `restore`
  takes the alerts and group states stored before a restart, so a restart
  neither fires an alert again nor mails a group before its repeat interval.
- Inhibition: while an inhibiting (node) rule fires for node N, its target
  alerts about N, or about a job with a task on N, notify nobody and run no
  action; they are still listed, with `inhibitedBy`.
- A non-mail action (stop, tag, cordon) is due once per alert, when it fires.
- `handle` is idempotent: a redelivered event changes nothing twice, and a
  job-state notification carries the id `job/attempt/state`, which the shell
  records before mailing so that it is sent once.
"""

from __future__ import annotations

import bisect
import hashlib
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from libs.common.alerts_messages import RECENT_SECONDS, AlertRecord, AlertState
from libs.common.messages import (
    Event,
    ExitSpec,
    JobPlaced,
    JobState,
    JobStateChanged,
    JobSubmitted,
    JobWaiting,
    NodeCondition,
    NodeStatus,
    TaskStarted,
)
from services.monitor.alerts.rules import Action, AlertRule, Condition, RuleSet, render_summary

# What an owner asking for status-change mail with `true` hears about (OpenPAI's
# words: "retried" is a new attempt going back to WAITING). WAITING and STOPPING
# are steps on the way, mailed only to those who list them.
DEFAULT_NOTIFY_STATES = ("running", "succeeded", "failed", "stopped", "retried")
# GPU utilisation history kept for the low-utilisation rule, at most.
MAX_HISTORY_SECONDS = 24 * 3600.0
# A job that succeeded or was stopped is in no rule: its view stays only while an event
# of it may still come again (the bus redelivers an unacked event within minutes:
# MAX_DELIVER tries ACK_WAIT_SECONDS apart), so a late one finds it final and changes
# nothing rather than making it anew. Kept a week, such views were the monitor's
# memory growing with the jobs run: 1.0-1.2 MiB per 1,000 (benchmarks/service_rss.py).
ENDED_VIEW_SECONDS = 3600.0


# --- inputs ----------------------------------------------------------------------------


class NodeReading(msgspec.Struct, frozen=True, kw_only=True):
    """What the rules need from one node sample (the shell converts `NodeSample`)."""

    node: str
    at: float
    cpuPercent: float | None = None
    memoryPercent: float | None = None
    diskPercent: float | None = None
    eccDoubleBit: dict[int, int] = {}  # GPU index -> uncorrectable ECC error count
    externalProcesses: int = 0  # GPU processes that belong to no PAI task
    gpuUtilization: dict[int, float] = {}  # GPU index -> percent


class ServiceReading(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    ready: bool
    at: float
    reason: str = ""


class JobView(msgspec.Struct, kw_only=True):
    """What the rules know about one job (mutable, the core's own)."""

    job: str
    user: str
    vc: str
    state: JobState = JobState.WAITING
    attempt: int = 1
    waitingSince: float = 0.0
    waitingReason: str = ""
    runningSince: float | None = None
    failedAt: float | None = None
    endedAt: float | None = None  # when it reached a final state (dates its forgetting)
    exitSpec: ExitSpec | None = None
    exitCode: int | None = None
    # Tuples: a view's are replaced, never changed in place, and every view without GPUs,
    # nodes or mail settings (most) shares the one empty tuple (an empty list each was a
    # tenth of a view's memory).
    # (node, gpu index) of every placed task of the current attempt.
    gpus: tuple[tuple[str, int], ...] = ()
    nodes: tuple[str, ...] = ()
    notify: bool = False
    notifyStates: tuple[str, ...] = ()  # empty: DEFAULT_NOTIFY_STATES
    notifyEmails: tuple[str, ...] = ()

    @classmethod
    def new(cls, job: str, user: str, vc: str, **fields: Any) -> JobView:
        """A view, its user's and VC's names interned (each decoded event or record has
        its own copy of them; views of one user's jobs then share one)."""
        return cls(job=job, user=sys.intern(user), vc=sys.intern(vc), **fields)


# --- outputs ---------------------------------------------------------------------------


class AlertFired(msgspec.Struct, frozen=True, kw_only=True):
    alert: AlertRecord


class AlertEnded(msgspec.Struct, frozen=True, kw_only=True):
    alert: AlertRecord


class GroupState(msgspec.Struct, frozen=True, kw_only=True):
    """What was last mailed about one group: stored, so a restart does not mail again."""

    key: str
    rule: str
    lastSentAt: float
    firing: tuple[str, ...]  # fingerprints mailed as firing


class Notification(msgspec.Struct, frozen=True, kw_only=True):
    """A mail to send: about a group of alerts, or about a job's new state."""

    id: str
    kind: str  # "alert" or "job_state"
    toAdmins: bool = False
    toUsers: tuple[str, ...] = ()  # PAI user names; the shell looks their addresses up
    toAddresses: tuple[str, ...] = ()
    rule: str = ""
    severity: str = ""
    firing: tuple[AlertRecord, ...] = ()
    resolved: tuple[AlertRecord, ...] = ()
    reminder: bool = False
    group: GroupState | None = None  # store this before mailing
    # job_state:
    job: str = ""
    user: str = ""
    vc: str = ""
    state: str = ""
    attempt: int = 0
    exitCode: int | None = None
    exitSpec: ExitSpec | None = None


class ActionDue(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    alert: AlertRecord


Output = AlertFired | AlertEnded | Notification | ActionDue


class _History:
    """One GPU's readings, oldest first, with running sums, so the mean over any
    recent window is two lookups rather than a pass over every reading (the
    low-utilisation rule asks for every GPU of the cluster at each evaluation)."""

    __slots__ = ("times", "sums")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.sums: list[float] = [0.0]  # sums[i]: total of the first i readings

    def append(self, at: float, percent: float) -> None:
        if self.times and at <= self.times[-1]:
            return  # a reading delivered twice or late
        self.times.append(at)
        self.sums.append(self.sums[-1] + percent)
        if self.times[0] < at - MAX_HISTORY_SECONDS and len(self.times) > 64:
            drop = bisect.bisect_left(self.times, at - MAX_HISTORY_SECONDS)
            base = self.sums[drop]
            self.times = self.times[drop:]
            self.sums = [total - base for total in self.sums[drop:]]

    def mean_since(self, cutoff: float) -> float | None:
        first = bisect.bisect_left(self.times, cutoff)
        count = len(self.times) - first
        return (self.sums[-1] - self.sums[first]) / count if count else None


class _Candidate(msgspec.Struct, kw_only=True):
    """A condition holding now, before `for` and inhibition."""

    fingerprint: str
    labels: dict[str, str]
    fields: dict[str, object]
    node: str = ""
    job: JobView | None = None
    service: str = ""


def fingerprint_key(fingerprint: str) -> str:
    """A bucket key for any fingerprint (job ids hold characters keys refuse)."""
    return hashlib.sha1(fingerprint.encode()).hexdigest()


class AlertCore:
    def __init__(self, rules: RuleSet, *, max_job_alerts_per_user: int = 0):
        self.rules = rules
        self._failed_view_seconds = _failed_view_seconds(rules)
        # At most this many of one user's jobs have an alert of one job rule at once (0: no bound).
        self.max_job_alerts_per_user = max_job_alerts_per_user
        # (rule, user) -> how many of the user's jobs met the rule in the last evaluation
        # but got no alert of their own: the user was at the bound.
        self.held_back: dict[tuple[str, str], int] = {}
        self.nodes: dict[str, NodeReading] = {}
        self.unhealthy: dict[str, str] = {}  # node -> reason, from NodeStatus
        self.services: dict[str, ServiceReading] = {}
        self.jobs: dict[str, JobView] = {}
        # The jobs in each state (insertion-ordered), so a job rule looks only at
        # the jobs its condition can hold for; `_index` keeps it in step with `jobs`.
        self._jobs_in: dict[JobState, dict[str, JobView]] = {state: {} for state in JobState}
        # (node, gpu) -> its recent utilisation readings
        self.gpu_history: dict[tuple[str, int], _History] = {}
        self.pending: dict[str, float] = {}  # fingerprint -> since when its condition holds
        self.alerts: dict[str, AlertRecord] = {}  # firing, and resolved within RECENT_SECONDS
        self.groups: dict[str, GroupState] = {}
        # What each firing alert's record was rendered from, so an evaluation where
        # nothing about it changed renders nothing (most rounds of a big cluster).
        self._rendered_from: dict[str, tuple] = {}
        # Set by whatever can change inhibition or a mail group beyond what one
        # evaluation sees (new rules, a restore): the next evaluation re-derives all.
        self._everything_changed = True
        # No resolved alert or final job can be forgotten before this time.
        self._forget_due = 0.0

    # --- inputs ------------------------------------------------------------------

    def set_rules(self, rules: RuleSet) -> None:
        """New rules apply from the next evaluation; alerts of removed rules resolve then."""
        self.rules = rules
        self._failed_view_seconds = _failed_view_seconds(rules)
        self._forget_due = 0.0  # a failed job's view may go sooner, or later, than it was due
        self._rendered_from.clear()
        self._everything_changed = True

    def restore(self, alerts: Iterable[AlertRecord], groups: Iterable[GroupState]) -> None:
        for alert in alerts:
            self.alerts[alert.fingerprint] = alert
            if alert.state is AlertState.FIRING:
                self.pending[alert.fingerprint] = alert.startsAt
        for group in groups:
            self.groups[group.key] = group
        self._everything_changed = True
        self._forget_due = 0.0

    def node_sampled(self, reading: NodeReading) -> None:
        previous = self.nodes.get(reading.node)
        if previous is not None and previous.at > reading.at:
            return  # an older sample, delivered late
        self.nodes[reading.node] = reading
        for gpu, percent in reading.gpuUtilization.items():
            history = self.gpu_history.get((reading.node, gpu))
            if history is None:
                history = self.gpu_history[(reading.node, gpu)] = _History()
            history.append(reading.at, percent)

    def node_status(self, node: str, healthy: bool, reason: str) -> None:
        if healthy:
            self.unhealthy.pop(node, None)
        else:
            self.unhealthy[node] = reason or "reported unhealthy"

    def service_probed(self, reading: ServiceReading) -> None:
        self.services[reading.service] = reading

    def restore_job(self, view: JobView) -> None:
        if view.job not in self.jobs:
            self.jobs[view.job] = view
            self._jobs_in[view.state][view.job] = view
        self._forget_due = 0.0

    def handle(self, event: Event) -> list[Notification]:
        """Follow one job or node event; the owner's status mail it calls for, if any."""
        view: JobView | None
        match event:
            case JobSubmitted(spec=spec):
                if event.job not in self.jobs:
                    view = self.jobs[event.job] = JobView.new(
                        event.job, spec.user, spec.virtualCluster, waitingSince=event.at,
                        notify=spec.notifyOnStateChange, notifyStates=tuple(spec.notifyStates),
                        notifyEmails=tuple(spec.notifyEmails),
                    )
                    self._jobs_in[view.state][view.job] = view
            case JobWaiting(attempt=attempt, reason=reason):
                view = self.jobs.get(event.job)
                if view is not None and attempt >= view.attempt:
                    view.waitingReason = reason
            case JobPlaced(attempt=attempt, tasks=tasks, partial=partial):
                view = self.jobs.get(event.job)
                if view is not None and attempt >= view.attempt:
                    placed: tuple[tuple[str, int], ...] = tuple((t.node, gpu) for t in tasks for gpu in t.gpus)
                    nodes: tuple[str, ...] = tuple(t.node for t in tasks)
                    if partial and attempt == view.attempt:
                        placed = view.gpus + tuple(p for p in placed if p not in view.gpus)
                        nodes = view.nodes + nodes
                    view.gpus = placed
                    view.nodes = tuple(dict.fromkeys(nodes))
            case TaskStarted(attempt=attempt, node=node):
                view = self.jobs.get(event.job)
                if view is not None and attempt == view.attempt and node and node not in view.nodes:
                    view.nodes = (*view.nodes, node)
            case JobStateChanged():
                return self._state_changed(event)
            case NodeStatus(node=node, healthy=healthy, reason=reason, conditions=conditions):
                # Only a lost node is not ready: disk or memory pressure, an ECC
                # error or a cordon keep work away but have rules (or an admin) of their own.
                self.node_status(node, healthy or bool(conditions) and NodeCondition.LOST not in conditions, reason)
        return []

    def _state_changed(self, event: JobStateChanged) -> list[Notification]:
        view = self.jobs.get(event.job)
        if view is None:
            view = self.jobs[event.job] = JobView.new(event.job, event.user, event.vc, waitingSince=event.at)
            self._jobs_in[view.state][view.job] = view
        if (event.attempt, _RANK[event.state]) < (view.attempt, _RANK[view.state]):
            return []  # older than what we know
        if (event.attempt, event.state) == (view.attempt, view.state) and event.state is not JobState.WAITING:
            return []  # redelivered
        if event.attempt > view.attempt or event.state is JobState.WAITING and view.state is not JobState.WAITING:
            view.waitingSince = event.at
            view.waitingReason = ""
            view.gpus, view.nodes = (), ()
        if event.state is not view.state:
            del self._jobs_in[view.state][view.job]
            self._jobs_in[event.state][view.job] = view
        view.attempt, view.state = event.attempt, event.state
        if event.state is JobState.RUNNING:
            view.runningSince = event.at
        if event.state is JobState.FAILED:
            view.failedAt = event.at
            view.exitSpec, view.exitCode = event.exitSpec, event.exitCode
        if event.state.is_final:
            view.endedAt = event.at
            if event.state is not JobState.FAILED:  # no rule reads where a job that did not fail ran
                view.gpus, view.nodes = (), ()
            self._forget_due = min(self._forget_due, self._forget_at(view))
        word = "retried" if event.state is JobState.WAITING and event.attempt > 1 else event.state.value.lower()
        if not view.notify or word not in (view.notifyStates or DEFAULT_NOTIFY_STATES):
            return []
        return [Notification(
            id=f"{view.job}/{event.attempt}/{event.state.value}", kind="job_state",
            toUsers=(view.user,), toAddresses=tuple(view.notifyEmails), job=view.job, user=view.user, vc=view.vc,
            state=event.state.value, attempt=event.attempt, exitCode=event.exitCode, exitSpec=event.exitSpec,
        )]

    # --- evaluation ------------------------------------------------------------------

    def evaluate(self, now: float) -> list[Output]:
        outputs: list[Output] = []
        holding: dict[str, tuple[AlertRule, _Candidate]] = {}
        window_means: dict[float, dict[tuple[str, int], float]] = {}
        self.held_back = {}
        for rule in self.rules.rules:
            if not rule.enabled:
                continue
            for candidate in self._per_user_bound(rule, self._candidates(rule, now, window_means)):
                holding[candidate.fingerprint] = (rule, candidate)
        # Conditions that stopped holding: drop pending, resolve firing.
        for fingerprint in list(self.pending):
            if fingerprint not in holding:
                del self.pending[fingerprint]
                self._rendered_from.pop(fingerprint, None)
                alert = self.alerts.get(fingerprint)
                if alert is not None and alert.state is AlertState.FIRING:
                    ended = msgspec.structs.replace(alert, state=AlertState.RESOLVED, endsAt=now)
                    self.alerts[fingerprint] = ended
                    outputs.append(AlertEnded(alert=ended))
                    self._forget_due = min(self._forget_due, now + RECENT_SECONDS)
        fired: list[AlertRecord] = []
        records_changed = False
        for fingerprint, (rule, candidate) in holding.items():
            since = self.pending.setdefault(fingerprint, now)
            alert = self.alerts.get(fingerprint)
            if alert is not None and alert.state is AlertState.FIRING:
                source = _render_source(rule, candidate)
                if self._rendered_from.get(fingerprint) == source:
                    continue  # rendered from the same facts: the same record
                self._rendered_from[fingerprint] = source
                record = self._record(rule, candidate, since)
                if alert.summary != record.summary or alert.severity != record.severity:
                    self.alerts[fingerprint] = msgspec.structs.replace(
                        record, startsAt=alert.startsAt, inhibitedBy=alert.inhibitedBy)
                    records_changed = True
                continue
            if now - since >= rule.for_:
                record = self._record(rule, candidate, since)
                self._rendered_from[fingerprint] = _render_source(rule, candidate)
                self.alerts[fingerprint] = record
                fired.append(record)
        # Inhibition and mail groups change only when an alert fired, resolved or
        # was re-rendered (its nodes may differ), or rules or a restore changed them:
        # otherwise the only mail due is a reminder.
        if not (fired or outputs or records_changed or self._everything_changed):
            outputs += self._reminders(now)
            self._forget_old(now)
            return outputs
        self._everything_changed = False
        # Inhibition once every alert of this round is known.
        inhibiting = self._inhibiting()
        for fingerprint, alert in list(self.alerts.items()):
            by = self._inhibited_by(alert, inhibiting)
            if alert.inhibitedBy != by:
                self.alerts[fingerprint] = msgspec.structs.replace(alert, inhibitedBy=by)
        for record in fired:
            record = self.alerts[record.fingerprint]
            outputs.append(AlertFired(alert=record))
            if not record.inhibitedBy:
                fired_rule = self.rules.rule(record.rule)
                for action in fired_rule.actions if fired_rule else ():
                    if action not in (Action.EMAIL_ADMIN, Action.EMAIL_OWNER):
                        outputs.append(ActionDue(action=action, alert=record))
        ended_now = [o.alert for o in outputs if isinstance(o, AlertEnded)]
        outputs += self._notifications(now, ended_now)
        self._forget_old(now)
        return outputs

    def _per_user_bound(self, rule: AlertRule, candidates: Iterable[_Candidate]) -> Iterator[_Candidate]:
        """The rule's candidates with at most `max_job_alerts_per_user` of one user's jobs:
        those already pending or firing first (an alert never resolves to make room), then
        the others in the order the rule found them (for JobFailed: the earliest failures).
        One tenant's thousands of failing jobs would otherwise be thousands of alerts, mails
        and tags, each kept a day once resolved. The rest are counted in `held_back`; they
        get their alert as the user's alerts resolve, while the condition still holds."""
        bound = self.max_job_alerts_per_user
        if bound <= 0:
            yield from candidates
            return
        counted: Counter[str] = Counter()
        later: list[tuple[str, _Candidate]] = []  # (its job's user, a candidate not yet alerting)
        for candidate in candidates:
            if candidate.job is None:
                yield candidate
            elif candidate.fingerprint in self.pending:
                counted[candidate.job.user] += 1
                yield candidate
            else:
                later.append((candidate.job.user, candidate))
        for user, candidate in later:
            if counted[user] < bound:
                counted[user] += 1
                yield candidate
            else:
                self.held_back[(rule.name, user)] = self.held_back.get((rule.name, user), 0) + 1

    def _candidates(self, rule: AlertRule, now: float, window_means: dict) -> Iterable[_Candidate]:
        threshold = rule.threshold if rule.threshold is not None else 0.0
        match rule.when:
            case Condition.GPU_ECC_DOUBLE_BIT:
                for node, reading in self.nodes.items():
                    for gpu, count in reading.eccDoubleBit.items():
                        if count > threshold:
                            yield _node(rule, node, {"value": count, "gpu": gpu}, suffix=f"/gpu{gpu}")
            case Condition.GPU_EXTERNAL_PROCESS:
                for node, reading in self.nodes.items():
                    if reading.externalProcesses > threshold:
                        yield _node(rule, node, {"value": reading.externalProcesses})
            case Condition.NODE_NOT_READY:
                for node in set(self.nodes) | set(self.unhealthy):
                    seen = self.nodes.get(node)
                    if node in self.unhealthy:
                        yield _node(rule, node, {"reason": self.unhealthy[node], "value": 0})
                    elif seen is not None and now - seen.at > threshold:
                        silent = now - seen.at
                        yield _node(rule, node, {"reason": f"no sample from its agent for {_human(silent)}",
                                                 "value": round(silent)})
            case Condition.NODE_DISK_USAGE | Condition.NODE_MEMORY_USAGE | Condition.NODE_CPU_USAGE:
                field = _PERCENT_FIELD[rule.when]
                for node, reading in self.nodes.items():
                    value = getattr(reading, field)
                    if value is not None and value >= threshold:
                        yield _node(rule, node, {"value": round(value, 1)})
            case Condition.JOB_WAITING:
                for view in self._jobs_in[JobState.WAITING].values():
                    if now - view.waitingSince > threshold:
                        yield _job(rule, view, {"value": _human(now - view.waitingSince),
                                                "reason": view.waitingReason or "no reason given yet"})
            case Condition.JOB_FAILED:
                window = rule.window or 0.0
                for view in self._jobs_in[JobState.FAILED].values():
                    if view.failedAt is not None and now - view.failedAt < window:
                        spec = view.exitSpec
                        reason = (spec.reason or spec.phrase) if spec else f"exit code {view.exitCode}"
                        solution = list(spec.solution) if spec else []
                        yield _job(rule, view, {"reason": reason, "solution": "; ".join(solution),
                                                "value": view.exitCode, "_solution": solution})
            case Condition.JOB_LOW_GPU_UTILIZATION:
                window = rule.window or 0.0
                means = window_means.get(window)
                if means is None:
                    means = window_means[window] = self._gpu_means(now, window)
                for view in self._jobs_in[JobState.RUNNING].values():
                    if not view.gpus or view.runningSince is None or now - view.runningSince < window:
                        continue
                    known = [means[g] for g in view.gpus if g in means]
                    if known and len(known) == len(view.gpus):
                        mean = sum(known) / len(known)
                        if mean < threshold:
                            yield _job(rule, view, {"value": round(mean, 1)})
            case Condition.SERVICE_NOT_READY:
                for name, service in self.services.items():
                    if not service.ready:
                        yield _Candidate(fingerprint=f"{rule.name}/{name}", labels={"service": name},
                                         fields={"service": name, "reason": service.reason or "not ready"},
                                         service=name)

    def _gpu_means(self, now: float, window: float) -> dict[tuple[str, int], float]:
        means: dict[tuple[str, int], float] = {}
        for key, history in self.gpu_history.items():
            mean = history.mean_since(now - window)
            if mean is not None:
                means[key] = mean
        return means

    def _record(self, rule: AlertRule, candidate: _Candidate, since: float) -> AlertRecord:
        view = candidate.job
        fields = {k: v for k, v in candidate.fields.items() if not k.startswith("_")}
        solution = candidate.fields.get("_solution")
        if view is not None:
            fields.update(job=view.job, user=view.user, vc=view.vc, nodes=", ".join(view.nodes) or "-",
                          state=view.state.value)
        if candidate.node:
            fields["node"] = candidate.node
        return AlertRecord(
            fingerprint=candidate.fingerprint, rule=rule.name, severity=rule.severity.value,
            state=AlertState.FIRING, summary=render_summary(rule, fields),
            labels={**rule.labels, **candidate.labels, "alertname": rule.name, "severity": rule.severity.value},
            startsAt=since, node=candidate.node, service=candidate.service,
            job=view.job if view else "", user=view.user if view else "", vc=view.vc if view else "",
            nodes=list(view.nodes) if view else ([candidate.node] if candidate.node else []),
            reason=str(candidate.fields.get("reason", "")), solution=list(solution) if isinstance(solution, list) else [],
        )

    def _inhibiting(self) -> dict[str, dict[str, str]]:
        """target rule -> {node: fingerprint of the firing source alert}."""
        found: dict[str, dict[str, str]] = {}
        for inhibition in self.rules.inhibit:
            nodes = {a.node: a.fingerprint for a in self.alerts.values()
                     if a.rule == inhibition.source and a.state is AlertState.FIRING and a.node}
            for target in inhibition.targets:
                found.setdefault(target, {}).update(nodes)
        return found

    def _inhibited_by(self, alert: AlertRecord, inhibiting: dict[str, dict[str, str]]) -> str:
        if alert.state is not AlertState.FIRING:
            return alert.inhibitedBy
        by_node = inhibiting.get(alert.rule, {})
        for node in alert.nodes:
            if node in by_node and by_node[node] != alert.fingerprint:
                return by_node[node]
        return ""

    def _notifications(self, now: float, ended_now: list[AlertRecord]) -> list[Notification]:
        notifications: list[Notification] = []
        by_group: dict[str, list[AlertRecord]] = {}
        rules = {rule.name: rule for rule in self.rules.rules}
        for alert in self.alerts.values():
            rule = rules.get(alert.rule)
            if rule is None or alert.state is not AlertState.FIRING or alert.inhibitedBy or not _mails(rule):
                continue
            by_group.setdefault(_group_key(rule, alert), []).append(alert)
        ended_by_group: dict[str, list[AlertRecord]] = {}
        for alert in ended_now:
            rule = rules.get(alert.rule)
            if rule is not None and _mails(rule):
                ended_by_group.setdefault(_group_key(rule, alert), []).append(alert)
        for key in set(by_group) | set(ended_by_group) | set(self.groups):
            firing = sorted(by_group.get(key, []), key=lambda a: a.fingerprint)
            state = self.groups.get(key)
            rule = rules.get(firing[0].rule if firing else (state.rule if state else ended_by_group[key][0].rule))
            if rule is None:
                self.groups.pop(key, None)
                continue
            before = set(state.firing) if state else set()
            fingerprints = tuple(a.fingerprint for a in firing)
            resolved = [a for a in ended_by_group.get(key, []) if a.fingerprint in before] if rule.sendResolved else []
            new = set(fingerprints) - before
            due_reminder = bool(firing) and state is not None and now - state.lastSentAt >= rule.repeatInterval
            if not (new or resolved or due_reminder):
                if state is not None and not firing:
                    del self.groups[key]  # nothing fires and nothing left to say
                elif state is not None and set(fingerprints) != before:
                    self.groups[key] = msgspec.structs.replace(state, firing=fingerprints)
                continue
            group = GroupState(key=key, rule=rule.name, lastSentAt=now, firing=fingerprints)
            self.groups[key] = group
            owners = tuple(sorted({a.user for a in [*firing, *resolved] if a.user}))
            notifications.append(Notification(
                id=f"{key}@{now:.0f}", kind="alert", rule=rule.name, severity=rule.severity.value,
                toAdmins=Action.EMAIL_ADMIN in rule.actions,
                toUsers=owners if Action.EMAIL_OWNER in rule.actions else (),
                firing=tuple(firing), resolved=tuple(resolved), reminder=not new and not resolved, group=group,
            ))
            if not firing:
                del self.groups[key]
        return notifications

    def _reminders(self, now: float) -> list[Notification]:
        """The notifications of a round in which no alert fired, resolved, changed
        or was (un)inhibited: each group's firing set is then the one last stored
        (`_notifications` keeps it so), and only reminders can be due."""
        notifications: list[Notification] = []
        rules = {rule.name: rule for rule in self.rules.rules}
        for key, state in list(self.groups.items()):
            rule = rules.get(state.rule)
            if rule is None or not state.firing or now - state.lastSentAt < rule.repeatInterval:
                continue
            firing = tuple(self.alerts[fp] for fp in state.firing)
            group = msgspec.structs.replace(state, lastSentAt=now)
            self.groups[key] = group
            owners = tuple(sorted({a.user for a in firing if a.user}))
            notifications.append(Notification(
                id=f"{key}@{now:.0f}", kind="alert", rule=rule.name, severity=rule.severity.value,
                toAdmins=Action.EMAIL_ADMIN in rule.actions,
                toUsers=owners if Action.EMAIL_OWNER in rule.actions else (),
                firing=firing, resolved=(), reminder=True, group=group,
            ))
        return notifications

    def _forget_old(self, now: float) -> None:
        if now < self._forget_due:
            return
        due = float("inf")
        for fingerprint, alert in list(self.alerts.items()):
            if alert.state is AlertState.RESOLVED and alert.endsAt is not None:
                if now - alert.endsAt > RECENT_SECONDS:
                    del self.alerts[fingerprint]
                else:
                    due = min(due, alert.endsAt + RECENT_SECONDS)
        for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED):
            views = self._jobs_in[state]
            for job, view in list(views.items()):
                if now > self._forget_at(view):
                    del self.jobs[job]
                    del views[job]
                else:
                    due = min(due, self._forget_at(view))
        self._forget_due = due

    @property
    def final_view_seconds(self) -> float:
        """The longest a final job's view is kept (a failed one's: the rules decide)."""
        return self._failed_view_seconds

    def _forget_at(self, view: JobView) -> float:
        """When a final job's view goes: a failed one's once the longest JobFailed window
        has passed (`_failed_view_seconds`), any other's ENDED_VIEW_SECONDS after it ended."""
        if view.state is JobState.FAILED:
            return (view.failedAt or view.waitingSince) + self._failed_view_seconds
        return (view.endedAt or view.waitingSince) + ENDED_VIEW_SECONDS

    def validate_state(self) -> None:
        for fingerprint, alert in self.alerts.items():
            assert alert.fingerprint == fingerprint
            assert (alert.state is AlertState.FIRING) == (alert.endsAt is None), alert
            if alert.state is AlertState.FIRING:
                assert fingerprint in self.pending, f"firing {fingerprint} has no pending entry"
        for key, group in self.groups.items():
            assert group.key == key
        for state, views in self._jobs_in.items():
            assert all(self.jobs.get(job) is view and view.state is state for job, view in views.items()), state
        assert sum(map(len, self._jobs_in.values())) == len(self.jobs), "a job missing from the state index"


_RANK = {
    JobState.WAITING: 0, JobState.RUNNING: 1, JobState.STOPPING: 2,
    JobState.SUCCEEDED: 3, JobState.FAILED: 3, JobState.STOPPED: 3,
}
_PERCENT_FIELD = {
    Condition.NODE_DISK_USAGE: "diskPercent",
    Condition.NODE_MEMORY_USAGE: "memoryPercent",
    Condition.NODE_CPU_USAGE: "cpuPercent",
}


def _failed_view_seconds(rules: RuleSet) -> float:
    """How long a failed job's view is kept: as long as the longest JobFailed window
    (`job_failed` lists a job that long after its failure, and no other rule reads a
    failed job), and never less than any ended job's ENDED_VIEW_SECONDS.

    It was a week whatever the rules said: a tenant whose jobs fail fast grew the
    monitor's memory, and each evaluation's walk over the failed jobs, for a week."""
    windows = [rule.window or 0.0 for rule in rules.rules if rule.when is Condition.JOB_FAILED]
    return max([ENDED_VIEW_SECONDS, *windows])


def _render_source(rule: AlertRule, candidate: _Candidate) -> tuple:
    """Everything an alert's record is rendered from (see `_record`)."""
    view = candidate.job
    if view is None:
        return (rule, candidate.fields)
    return (rule, candidate.fields, view.state, tuple(view.nodes))


def _node(rule: AlertRule, node: str, fields: dict, *, suffix: str = "") -> _Candidate:
    labels = {"node": node}
    if "gpu" in fields:
        labels["gpu"] = str(fields["gpu"])
    return _Candidate(fingerprint=f"{rule.name}/{node}{suffix}", labels=labels, fields=fields, node=node)


def _job(rule: AlertRule, view: JobView, fields: dict) -> _Candidate:
    return _Candidate(
        fingerprint=f"{rule.name}/{view.job}/{view.attempt}",
        labels={"job": view.job, "user": view.user, "vc": view.vc}, fields=fields, job=view,
    )


def _mails(rule: AlertRule) -> bool:
    return Action.EMAIL_ADMIN in rule.actions or Action.EMAIL_OWNER in rule.actions


def _group_key(rule: AlertRule, alert: AlertRecord) -> str:
    return "/".join([rule.name, *(f"{label}={alert.labels.get(label, '')}" for label in rule.groupBy)])


def _human(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
