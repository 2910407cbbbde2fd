"""PAI's alert rules as Prometheus alerting rules (the chart's PrometheusRule).

PAI evaluates its rules in the cluster monitor (core.py), over its own readings.
For a cluster that runs the Prometheus Operator, the same rules are also written as
PromQL over the series PAI exports (docs/monitoring.md), so Prometheus evaluates
them next to everything else the operators watch. One source: the shipped rule
document (`default_rules.yaml`) is translated here, and
`python -m services.monitor.alerts.promrules` writes the chart's
`files/prometheus-rules.yaml` (a test checks that the file is current, and
promtool checks it).

Conditions and their PromQL:

| condition | expression |
|---|---|
| gpu_ecc_double_bit | `nvidiasmi_ecc_error_count{type="volatile_double"} > T` |
| gpu_external_process | `count by (node) (gpu_used_by_external_process_count) > T` |
| node_not_ready | `pai_node_up == 0` (the monitor's node health) |
| node_disk_usage, node_memory_usage | used / total of the node's `pai_node_*` series, in %, `>= T` |
| node_cpu_usage | `pai_node_cpu_percent >= T` |
| job_low_gpu_utilization | the job's tasks' `task_gpu_percent` averaged over the window `< T` |
| service_not_ready | the release's Services scraped with `up == 0` on every target, or none at all |

Two rules exist here alone, about the platform itself: PaiStoreNearlyFull (a stream or
bucket over 90 % of its byte limit: at 100 % it refuses writes, discard-new) and
PaiLeaderMissing (a single-active service with no replica leading, or more than one).

`job_waiting` and `job_failed` read the launcher's and scheduler's per-job state,
which no series carries: they stay the monitor's (sent to Alertmanager through
`alertmanager_urls`). Each alert carries `pai_source: prometheus`, so a receiver
tells these from the monitor's own. The release's namespace and Service names are
placeholders the chart's template fills in.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from services.monitor.alerts.rules import AlertRule, Condition, RuleSet, load_rules_text

NAMESPACE = "__PAI_NAMESPACE__"
FULLNAME = "__PAI_FULLNAME__"
SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")
GROUP = "pai"
CHART_FILE = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "pai" / "files" / "prometheus-rules.yaml"
DEFAULT_RULES = Path(__file__).with_name("default_rules.yaml")

# PAI's template words as Prometheus' templates say them.
_JOB = "{{ $labels.username }}~{{ $labels.job_name }}"
WORDS = {
    "node": "{{ $labels.node }}", "gpu": "{{ $labels.minor_number }}", "value": "{{ $value | humanize }}",
    "service": "{{ $labels.service }}", "job": _JOB, "user": "{{ $labels.username }}",
    "vc": "{{ $labels.virtual_cluster }}", "nodes": "-", "solution": "-", "state": "RUNNING",
}
REASONS = {
    Condition.NODE_NOT_READY: "the PAI monitor holds it unhealthy (pai_node_up 0)",
    Condition.SERVICE_NOT_READY: "no target of its Service answers Prometheus' scrape",
}
_WORD = re.compile(r"\{(\w+)\}")


def _services_up() -> str:
    services = "|".join(SERVICES)
    return f'up{{namespace="{NAMESPACE}", service=~"{FULLNAME}-({services})"}}'


def expression(rule: AlertRule) -> str | None:
    """The rule's condition in PromQL; None for a condition no series carries."""
    t = _number(rule.threshold)
    match rule.when:
        case Condition.GPU_ECC_DOUBLE_BIT:
            return f'nvidiasmi_ecc_error_count{{type="volatile_double"}} > {t}'
        case Condition.GPU_EXTERNAL_PROCESS:
            return f"count by (node) (gpu_used_by_external_process_count) > {t}"
        case Condition.NODE_NOT_READY:
            return "pai_node_up == 0"
        case Condition.NODE_DISK_USAGE:
            return f"100 * pai_node_data_disk_used_bytes / pai_node_data_disk_total_bytes >= {t}"
        case Condition.NODE_MEMORY_USAGE:
            return f"100 * pai_node_memory_used_bytes / pai_node_memory_total_bytes >= {t}"
        case Condition.NODE_CPU_USAGE:
            return f"pai_node_cpu_percent >= {t}"
        case Condition.JOB_LOW_GPU_UTILIZATION:
            window = f"{int(rule.window or 3600)}s"
            return (f"avg by (username, job_name, virtual_cluster) "
                    f"(avg_over_time(task_gpu_percent[{window}])) < {t}")
        case Condition.SERVICE_NOT_READY:
            # Every target of a Service down, or the Service not scraped at all (no
            # ready pod behind it): absent() keeps the labels its selector names.
            absent = " or ".join(f'absent(up{{namespace="{NAMESPACE}", service="{FULLNAME}-{s}"}})' for s in SERVICES)
            return f"(max by (namespace, service) ({_services_up()}) == 0) or {absent}"
    return None


def _number(value: float | None) -> str:
    value = value or 0
    return str(int(value)) if float(value).is_integer() else str(value)


def summary(rule: AlertRule) -> str:
    words = {**WORDS, "rule": rule.name, "severity": rule.severity.value, "threshold": _number(rule.threshold),
             "reason": REASONS.get(rule.when, "-")}
    return _WORD.sub(lambda m: words.get(m.group(1), m.group(0)), rule.summary or rule.name)


def alerting_rule(rule: AlertRule) -> dict[str, Any] | None:
    expr = expression(rule)
    if expr is None or not rule.enabled:
        return None
    out: dict[str, Any] = {"alert": rule.name, "expr": expr}
    if rule.for_:
        out["for"] = f"{int(rule.for_)}s"
    out["labels"] = {**rule.labels, "severity": rule.severity.value, "pai_source": "prometheus"}
    out["annotations"] = {"summary": summary(rule)}
    return out


# The platform's own health, from series only Prometheus sees side by side.
PLATFORM_RULES: list[dict[str, Any]] = [
    {"alert": "PaiStoreNearlyFull",
     "expr": f'pai_jetstream_stream_bytes{{namespace="{NAMESPACE}"}} / pai_jetstream_stream_max_bytes > 0.9',
     "for": "600s", "labels": {"severity": "warning", "pai_source": "prometheus"},
     "annotations": {"summary": "JetStream stream {{ $labels.stream }} is {{ $value | humanizePercentage }} of its "
                                "byte limit: full, it refuses writes (raise the nats_* limit or let retention "
                                "catch up)"}},
    {"alert": "PaiLeaderMissing",
     "expr": f'sum by (namespace, service) (pai_leader{{namespace="{NAMESPACE}"}}) != 1',
     "for": "120s", "labels": {"severity": "critical", "pai_source": "prometheus"},
     "annotations": {"summary": "{{ $value }} replicas of PAI's {{ $labels.service }} hold its leader lease "
                                "(one should)"}},
]


def prometheus_rules(rules: RuleSet) -> dict[str, Any]:
    """The `spec` of a PrometheusRule (also a rule file promtool checks as is)."""
    translated = [r for r in (alerting_rule(rule) for rule in rules.rules) if r is not None]
    return {"groups": [{"name": GROUP, "rules": translated + PLATFORM_RULES}]}


def render(rules: RuleSet) -> str:
    head = ("# Generated from services/monitor/alerts/default_rules.yaml by\n"
            "# `python -m services.monitor.alerts.promrules`: do not edit. The chart's\n"
            f"# prometheusrule.yaml fills in {NAMESPACE} and {FULLNAME}.\n")
    return head + yaml.safe_dump(prometheus_rules(rules), sort_keys=False, width=1000)


def main() -> int:
    CHART_FILE.write_text(render(load_rules_text(DEFAULT_RULES.read_text())))
    print(f"wrote {CHART_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
