"""Alert rule documents: the shipped defaults load, and every mistake an admin
can make is refused with the rule and the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.monitor.alerts.rules import (
    Action,
    Condition,
    InvalidRules,
    load_rules_text,
    parse_duration,
    render_summary,
)

DEFAULTS = Path(__file__).resolve().parents[3] / "services/monitor/alerts/default_rules.yaml"


def test_the_shipped_rules_load_with_openpais_alerts():
    rules = load_rules_text(DEFAULTS.read_text())
    names = {rule.name for rule in rules.rules}
    assert {
        "NvidiaSmiDoubleEccError", "GpuUsedByExternalProcess", "NodeNotReady", "NodeFilesystemUsage",
        "NodeMemoryUsage", "NodeCPUUsage", "PaiJobPending", "ServiceDown", "JobFailed", "LowGpuUtilization",
    } <= names
    pending = rules.rule("PaiJobPending")
    assert pending.when is Condition.JOB_WAITING and pending.threshold == 3600
    assert Action.EMAIL_OWNER in pending.actions
    assert rules.inhibit[0].source == "NodeNotReady"


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        pytest.param("rules: []", ("rules", "non-empty"), id="no-rules"),
        pytest.param("rules: [{name: A, when: gpu_melted}]", ("rules[0] (A).when", "must be one of"), id="unknown-condition"),
        pytest.param("rules: [{name: A, when: job_waiting, threshold: soon}]", ("rules[0] (A).threshold", "duration"),
                     id="threshold-not-duration"),
        pytest.param("rules: [{name: A, when: node_disk_usage, threshold: 140}]", ("rules[0] (A).threshold", "0 to 100"),
                     id="percent-over-100"),
        pytest.param("rules: [{name: A, when: job_failed, for: forever}]", ("rules[0] (A).for", "duration"), id="bad-for"),
        pytest.param("rules: [{name: A, when: job_failed, severity: loud}]", ("rules[0] (A).severity", "critical"),
                     id="bad-severity"),
        pytest.param("rules: [{name: A, when: node_cpu_usage, actions: [stop-job]}]",
                     ("rules[0] (A).actions[0]", "does not apply to node"), id="job-action-on-node-rule"),
        pytest.param("rules: [{name: A, when: job_failed, actions: [page-someone]}]",
                     ("rules[0] (A).actions[0]", "email-admin"), id="unknown-action"),
        pytest.param("rules: [{name: A, when: job_failed, summary: 'job {jobb}'}]",
                     ("rules[0] (A).summary", "{jobb}"), id="unknown-placeholder"),
        pytest.param("rules: [{name: A, when: service_not_ready, threshold: 3}]",
                     ("rules[0] (A).threshold", "takes no threshold"), id="parameter-not-taken"),
        pytest.param("rules: [{name: A, when: job_failed}, {name: A, when: job_waiting}]",
                     ("rules[1] (A).name", "another rule"), id="duplicate-name"),
        pytest.param("rules: [{name: A, when: job_failed, repeatInterval: 5s}]",
                     ("rules[0] (A).repeatInterval", "at least"), id="repeat-too-often"),
        pytest.param("rules: [{name: A, when: job_failed, colour: red}]", ("rules[0] (A).colour", "unknown field"),
                     id="unknown-field"),
        pytest.param("rules: [{name: A, when: job_failed}]\ninhibit: [{source: A, targets: [A]}]",
                     ("inhibit[0].source", "node rule"), id="inhibit-by-job-rule"),
        pytest.param("rules: [{name: A, when: node_not_ready}]\ninhibit: [{source: A, targets: [B]}]",
                     ("inhibit[0].targets[0]", "no rule named 'B'"), id="inhibit-unknown-target"),
        pytest.param("rules: [{when: job_failed}]", ("rules[0].name", "must be a name"), id="no-name"),
        pytest.param("rules: [", ("", "not valid YAML"), id="not-yaml"),
    ],
)
def test_a_mistake_is_refused_naming_the_rule_and_field(text, wanted):
    with pytest.raises(InvalidRules) as caught:
        load_rules_text(text)
    path, words = wanted
    assert any(p.path == path and words in p.message for p in caught.value.problems), caught.value.problems


def test_every_problem_is_reported_at_once():
    with pytest.raises(InvalidRules) as caught:
        load_rules_text("rules: [{name: A, when: job_failed, severity: loud, for: x}, {name: B, when: nope}]")
    assert {p.path for p in caught.value.problems} == {"rules[0] (A).severity", "rules[0] (A).for", "rules[1] (B).when"}


@pytest.mark.parametrize(("text", "seconds"), [(90, 90.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), ("7d", 604800.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_summary_template_fills_fields_and_marks_missing_ones():
    rules = load_rules_text("rules: [{name: A, when: job_waiting, summary: '{job} waits: {reason} ({vc})'}]")
    assert render_summary(rules.rules[0], {"job": "alice~x", "reason": "VC full"}) == "alice~x waits: VC full (-)"


def test_a_format_spec_that_does_not_fit_the_value_does_not_break_evaluation():
    rules = load_rules_text("rules: [{name: A, when: job_waiting, summary: 'waits: {reason:.1f} ({value:>6})'}]")
    text = render_summary(rules.rules[0], {"reason": "VC full", "value": "3h"})
    assert text.startswith("waits: {reason:.1f}") and "cannot fill in" in text
    rules = load_rules_text("rules: [{name: A, when: node_disk_usage, summary: '{node} at {value:.0f}%'}]")
    assert render_summary(rules.rules[0], {"node": "n1", "value": 93.4}) == "n1 at 93%"
