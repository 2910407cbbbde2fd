"""Alert rules: what an admin writes, checked and turned into typed rules.

PAI does not evaluate PromQL. Each rule names one built-in condition (`when`)
with its parameters (`threshold`, `window`), which the pure core
(`services.monitor.alerts.core`) evaluates over node samples, job events,
service readiness and the clock. Everything else follows Prometheus and
Alertmanager: `for` (how long a condition must hold before the alert fires),
`severity`, `labels`, a `summary` template, grouping, a repeat interval,
resolve notices and inhibition, plus OpenPAI's alert-handler actions.

A rule document (YAML):

    repeatInterval: 4h          # default for every rule
    inhibit:
    - source: NodeNotReady      # while this fires for a node ...
      targets: [JobFailed]      # ... these alerts about that node or its jobs stay quiet
    rules:
    - name: NodeNotReady
      when: node_not_ready
      threshold: 120            # seconds without a sample
      for: 1m
      severity: critical
      summary: "node {node} is not ready: {reason}"
      actions: [email-admin]

Every problem is reported with the rule's name and the field, e.g.
`rules[3] (PaiJobPending).threshold: must be a number of seconds`.
"""

from __future__ import annotations

import re
import string
from enum import StrEnum
from typing import Any

import msgspec
import yaml

MAX_RULES = 200
MAX_TEXT = 2000


class Condition(StrEnum):
    """The built-in conditions a rule can name, and what they are about."""

    GPU_ECC_DOUBLE_BIT = "gpu_ecc_double_bit"  # a GPU reported uncorrectable ECC errors
    GPU_EXTERNAL_PROCESS = "gpu_external_process"  # a GPU process that is no PAI task
    NODE_NOT_READY = "node_not_ready"  # unhealthy NodeStatus, or silent for `threshold` s
    NODE_DISK_USAGE = "node_disk_usage"  # percent used >= threshold
    NODE_MEMORY_USAGE = "node_memory_usage"
    NODE_CPU_USAGE = "node_cpu_usage"
    JOB_WAITING = "job_waiting"  # WAITING for more than `threshold` seconds
    JOB_FAILED = "job_failed"  # FAILED within the last `window` seconds
    JOB_LOW_GPU_UTILIZATION = "job_low_gpu_utilization"  # mean GPU % over `window` < threshold
    SERVICE_NOT_READY = "service_not_ready"  # a PAI service's /readyz is not 200

    @property
    def subject(self) -> str:
        """"node", "job" or "service": which labels its alerts carry."""
        if self.value.startswith(("gpu_", "node_")):
            return "node"
        if self.value.startswith("job_"):
            return "job"
        return "service"


class Action(StrEnum):
    """OpenPAI alert-handler actions."""

    EMAIL_ADMIN = "email-admin"
    EMAIL_OWNER = "email-owner"  # the owner of the job the alert is about
    TAG_JOB = "tag-job"
    STOP_JOB = "stop-job"
    CORDON_NODE = "cordon-node"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


# Which parameters a condition needs (None: not used), with their defaults.
PARAMETERS: dict[Condition, tuple[float | None, float | None]] = {
    # (threshold, window)
    Condition.GPU_ECC_DOUBLE_BIT: (0, None),  # more than `threshold` errors
    Condition.GPU_EXTERNAL_PROCESS: (0, None),  # more than `threshold` processes
    Condition.NODE_NOT_READY: (120, None),  # seconds without a sample
    Condition.NODE_DISK_USAGE: (90, None),
    Condition.NODE_MEMORY_USAGE: (95, None),
    Condition.NODE_CPU_USAGE: (95, None),
    Condition.JOB_WAITING: (3600, None),
    Condition.JOB_FAILED: (None, 3600),
    Condition.JOB_LOW_GPU_UTILIZATION: (10, 3600),
    Condition.SERVICE_NOT_READY: (None, None),
}

# The words a summary template may use, per subject.
TEMPLATE_FIELDS = {
    "node": {"node", "value", "threshold", "reason", "rule", "severity", "gpu"},
    "job": {"job", "user", "vc", "value", "threshold", "reason", "solution", "rule", "severity", "nodes", "state"},
    "service": {"service", "value", "reason", "rule", "severity"},
}

ACTIONS_FOR = {
    "node": {Action.EMAIL_ADMIN, Action.CORDON_NODE},
    "job": {Action.EMAIL_ADMIN, Action.EMAIL_OWNER, Action.TAG_JOB, Action.STOP_JOB},
    "service": {Action.EMAIL_ADMIN},
}

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


class AlertRule(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    when: Condition
    threshold: float | None = None
    window: float | None = None  # seconds
    for_: float = 0.0  # seconds the condition holds before the alert fires
    severity: Severity = Severity.WARNING
    labels: dict[str, str] = {}
    summary: str = ""
    actions: tuple[Action, ...] = ()
    repeatInterval: float = 4 * 3600.0
    # Labels whose values split the rule's alerts into separate notifications;
    # the subject's own label (node, job, service) by default.
    groupBy: tuple[str, ...] = ()
    sendResolved: bool = True
    enabled: bool = True

    @property
    def subject(self) -> str:
        return self.when.subject


class Inhibition(msgspec.Struct, frozen=True, kw_only=True):
    """While `source` fires for a node, alerts of `targets` about that node, or
    about a job with a task on it, notify nobody (they still show as firing)."""

    source: str
    targets: tuple[str, ...]


class RuleSet(msgspec.Struct, frozen=True, kw_only=True):
    rules: tuple[AlertRule, ...]
    inhibit: tuple[Inhibition, ...] = ()

    def rule(self, name: str) -> AlertRule | None:
        for rule in self.rules:
            if rule.name == name:
                return rule
        return None


class RuleProblem(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # e.g. "rules[2] (JobFailed).threshold"
    message: str


class InvalidRules(Exception):
    def __init__(self, problems: list[RuleProblem]):
        self.problems = problems
        super().__init__("; ".join(f"{p.path}: {p.message}" for p in problems))


def parse_duration(value: Any) -> float:
    """Seconds from 90, "90s", "5m", "1.5h", "7d"; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(value)
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    raise ValueError(value)


def load_rules_text(text: str) -> RuleSet:
    """Parse and check a rule document; raises InvalidRules naming every problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidRules([RuleProblem(path="", message=f"not valid YAML: {error}")]) from None
    return check_rules(data)


def check_rules(data: Any) -> RuleSet:
    problems: list[RuleProblem] = []
    if not isinstance(data, dict):
        raise InvalidRules([RuleProblem(path="", message="the document must be a mapping with a `rules:` list")])
    unknown = set(data) - {"rules", "inhibit", "repeatInterval"}
    for key in sorted(map(str, unknown)):
        problems.append(RuleProblem(path=key, message="unknown field (expected rules, inhibit, repeatInterval)"))
    default_repeat = 4 * 3600.0
    if "repeatInterval" in data:
        try:
            default_repeat = parse_duration(data["repeatInterval"])
        except ValueError:
            problems.append(RuleProblem(path="repeatInterval", message="must be a duration like 30m or 4h"))
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        problems.append(RuleProblem(path="rules", message="must be a non-empty list of rules"))
        raise InvalidRules(problems)
    if len(raw_rules) > MAX_RULES:
        problems.append(RuleProblem(path="rules", message=f"at most {MAX_RULES} rules, got {len(raw_rules)}"))
        raise InvalidRules(problems)
    rules: list[AlertRule] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_rules):
        rule = _check_rule(index, raw, default_repeat, problems)
        if rule is None:
            continue
        if rule.name in seen:
            problems.append(RuleProblem(path=f"rules[{index}] ({rule.name}).name", message="another rule has this name"))
        seen.add(rule.name)
        rules.append(rule)
    inhibit = _check_inhibit(data.get("inhibit", []), {r.name: r for r in rules}, problems)
    if problems:
        raise InvalidRules(problems)
    return RuleSet(rules=tuple(rules), inhibit=tuple(inhibit))


def _check_rule(index: int, raw: Any, default_repeat: float, problems: list[RuleProblem]) -> AlertRule | None:
    where = f"rules[{index}]"
    if not isinstance(raw, dict):
        problems.append(RuleProblem(path=where, message="must be a mapping"))
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(RuleProblem(path=f"{where}.name", message="must be a name of letters, digits and _ (at most 80)"))
        return None
    where = f"{where} ({name})"
    before = len(problems)

    def bad(field: str, message: str) -> None:
        problems.append(RuleProblem(path=f"{where}.{field}", message=message))

    known = {"name", "when", "threshold", "window", "for", "severity", "labels", "summary", "actions",
             "repeatInterval", "groupBy", "sendResolved", "enabled"}
    for key in sorted(map(str, set(raw) - known)):
        bad(key, f"unknown field (expected one of {', '.join(sorted(known))})")
    try:
        when = Condition(str(raw.get("when")))  # anything but a condition's name is refused
    except ValueError:
        bad("when", f"must be one of {', '.join(c.value for c in Condition)}, got {raw.get('when')!r}")
        return None
    default_threshold, default_window = PARAMETERS[when]
    threshold = _number(raw, "threshold", default_threshold, bad,
                        duration=when in (Condition.NODE_NOT_READY, Condition.JOB_WAITING))
    window = _number(raw, "window", default_window, bad, duration=True)
    if default_threshold is None and "threshold" in raw:
        bad("threshold", f"{when.value} takes no threshold")
    if default_window is None and "window" in raw:
        bad("window", f"{when.value} takes no window")
    if when in (Condition.NODE_DISK_USAGE, Condition.NODE_MEMORY_USAGE, Condition.NODE_CPU_USAGE,
                Condition.JOB_LOW_GPU_UTILIZATION) and threshold is not None and not 0 <= threshold <= 100:
        bad("threshold", f"is a percentage: 0 to 100, got {threshold}")
    for_ = _duration(raw, "for", 0.0, bad)
    repeat = _duration(raw, "repeatInterval", default_repeat, bad)
    if repeat is not None and repeat < 60:
        bad("repeatInterval", "must be at least 1m (60 s)")
    severity = raw.get("severity", "warning")
    if severity not in {s.value for s in Severity}:
        bad("severity", f"must be one of critical, warning, info, got {severity!r}")
    labels = raw.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and _LABEL.match(k) and isinstance(v, (str, int, float)) for k, v in labels.items()
    ):
        bad("labels", "must map label names (letters, digits, _) to plain values")
        labels = {}
    summary = raw.get("summary", "")
    if not isinstance(summary, str) or len(summary) > MAX_TEXT:
        bad("summary", f"must be text of at most {MAX_TEXT} characters")
        summary = ""
    else:
        for field in _template_fields(summary, bad):
            if field not in TEMPLATE_FIELDS[when.subject]:
                bad("summary", f"unknown placeholder {{{field}}}; {when.value} offers "
                               + ", ".join("{" + f + "}" for f in sorted(TEMPLATE_FIELDS[when.subject])))
    actions = raw.get("actions", [])
    checked_actions: list[Action] = []
    if not isinstance(actions, list):
        bad("actions", "must be a list")
    else:
        for i, action in enumerate(actions):
            try:
                act = Action(action)
            except ValueError:
                bad(f"actions[{i}]", f"must be one of {', '.join(a.value for a in Action)}, got {action!r}")
                continue
            if act not in ACTIONS_FOR[when.subject]:
                bad(f"actions[{i}]", f"{act.value} does not apply to {when.subject} alerts ({when.value})")
            checked_actions.append(act)
    group_by = raw.get("groupBy", [when.subject])
    if not isinstance(group_by, list) or not all(isinstance(g, str) for g in group_by):
        bad("groupBy", "must be a list of label names")
        group_by = [when.subject]
    for flag in ("sendResolved", "enabled"):
        if flag in raw and not isinstance(raw[flag], bool):
            bad(flag, "must be true or false")
    if len(problems) > before:
        return None
    return AlertRule(
        name=name, when=when, threshold=threshold, window=window, for_=for_ or 0.0,
        severity=Severity(severity), labels={str(k): str(v) for k, v in labels.items()}, summary=summary,
        actions=tuple(dict.fromkeys(checked_actions)), repeatInterval=repeat or default_repeat,
        groupBy=tuple(group_by), sendResolved=raw.get("sendResolved", True), enabled=raw.get("enabled", True),
    )


def _number(raw: dict, field: str, default: float | None, bad, *, duration: bool) -> float | None:
    if field not in raw:
        return default
    value = raw[field]
    try:
        return parse_duration(value) if duration else _plain_number(value)
    except ValueError:
        bad(field, "must be a duration like 90s, 5m or 1h" if duration else f"must be a number, got {value!r}")
        return default


def _plain_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    return float(value)


def _duration(raw: dict, field: str, default: float, bad) -> float | None:
    if field not in raw:
        return default
    try:
        return parse_duration(raw[field])
    except ValueError:
        bad(field, f"must be a duration like 90s, 5m or 1h, got {raw[field]!r}")
        return None


def _template_fields(template: str, bad) -> list[str]:
    try:
        return [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as error:
        bad("summary", f"is not a valid template ({error}); write {{{{ and }}}} for literal braces")
        return []


def _check_inhibit(raw: Any, rules: dict[str, AlertRule], problems: list[RuleProblem]) -> list[Inhibition]:
    if not isinstance(raw, list):
        problems.append(RuleProblem(path="inhibit", message="must be a list of {source, targets}"))
        return []
    found: list[Inhibition] = []
    for index, entry in enumerate(raw):
        where = f"inhibit[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str) or not isinstance(entry.get("targets"), list):
            problems.append(RuleProblem(path=where, message="must be {source: RULE, targets: [RULE, ...]}"))
            continue
        source = rules.get(entry["source"])
        if source is None:
            problems.append(RuleProblem(path=f"{where}.source", message=f"no rule named {entry['source']!r}"))
            continue
        if source.subject != "node":
            problems.append(RuleProblem(path=f"{where}.source", message="must be a node rule (inhibition is by node)"))
        for i, target in enumerate(entry["targets"]):
            if target not in rules:
                problems.append(RuleProblem(path=f"{where}.targets[{i}]", message=f"no rule named {target!r}"))
        found.append(Inhibition(source=source.name, targets=tuple(map(str, entry["targets"]))))
    return found


def render_summary(rule: AlertRule, fields: dict[str, Any]) -> str:
    """The rule's summary with the alert's fields; a default sentence if it has none."""
    values = {"rule": rule.name, "severity": rule.severity.value, "threshold": rule.threshold, **fields}
    if not rule.summary:
        about = fields.get(rule.subject, "")
        return f"{rule.name} on {about}" + (f": {fields['reason']}" if fields.get("reason") else "")
    # Checked at load: only plain field names, so format_map is safe (and fast).
    try:
        return rule.summary.format_map(_Missing(values))
    except (ValueError, TypeError) as error:  # a format spec that does not fit the value, e.g. {reason:.1f}
        return f"{rule.summary} [cannot fill in: {error}]"


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "-"
