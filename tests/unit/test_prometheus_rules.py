"""PAI's alert rules as the chart's PrometheusRule, checked by Debian's promtool
(`make alerting-deps`): the rendered rules load, and `promtool test rules` fires
them on series as PAI exports them (ServiceDown from up{} on Kubernetes included)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.monitor.alerts.promrules import CHART_FILE, DEFAULT_RULES, render
from services.monitor.alerts.rules import load_rules_text
from tests.tools_helm import KubeTools, ToolsUnavailable, kube_tools

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "pai"
RELEASE, NAMESPACE = "ml", "pai-system"
FULLNAME = "ml-pai"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (make alerting-deps)")


@pytest.fixture(scope="module")
def tools() -> KubeTools:
    try:
        return kube_tools()
    except ToolsUnavailable as exc:
        pytest.skip(f"helm not available: {exc}")


def rendered(tools: KubeTools, *args: str) -> list[dict]:
    done = subprocess.run([str(tools.helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_the_charts_rule_file_is_generated_from_the_shipped_rules():
    expected = render(load_rules_text(DEFAULT_RULES.read_text()))
    assert CHART_FILE.read_text() == expected, "run `python -m services.monitor.alerts.promrules`"


def test_no_prometheus_rule_unless_asked(tools):
    assert not [d for d in rendered(tools) if d["kind"] == "PrometheusRule"]


@pytest.fixture(scope="module")
def rule_file(tools, tmp_path_factory) -> Path:
    [rule] = [d for d in rendered(tools, "--set", "metrics.prometheusRule.enabled=true",
                                  "--set", "metrics.prometheusRule.labels.release=prom")
              if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "prom"
    path = tmp_path_factory.mktemp("rules") / "pai-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


@needs_promtool
def test_promtool_checks_the_rendered_rules(rule_file):
    done = subprocess.run([PROMTOOL, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout
    names = {r["alert"] for r in yaml.safe_load(rule_file.read_text())["groups"][0]["rules"]}
    assert {"ServiceDown", "NodeFilesystemUsage", "NvidiaSmiDoubleEccError", "LowGpuUtilization"} <= names
    assert not names & {"PaiJobPending", "JobFailed"}, "per-job state is in no series: the monitor keeps those"


@needs_promtool
def test_the_rules_fire_on_series_as_pai_exports_them(rule_file, tmp_path):
    """promtool's own rule unit tests: ten minutes of series, the alerts expected."""
    tests = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'pai_node_data_disk_used_bytes{node="gpu-1"}', "values": "95x10"},
                {"series": 'pai_node_data_disk_total_bytes{node="gpu-1"}', "values": "100x10"},
                {"series": 'pai_node_data_disk_used_bytes{node="gpu-2"}', "values": "10x10"},
                {"series": 'pai_node_data_disk_total_bytes{node="gpu-2"}', "values": "100x10"},
                {"series": 'pai_node_up{node="gpu-3"}', "values": "1 1 0x8"},
                # rest's two replicas both down; scheduler has one of two up; the
                # launcher is not scraped at all; runtime and monitor are fine.
                {"series": f'up{{namespace="{NAMESPACE}", service="{FULLNAME}-rest", pod="a"}}', "values": "0x10"},
                {"series": f'up{{namespace="{NAMESPACE}", service="{FULLNAME}-rest", pod="b"}}', "values": "0x10"},
                {"series": f'up{{namespace="{NAMESPACE}", service="{FULLNAME}-scheduler", pod="a"}}', "values": "0x10"},
                {"series": f'up{{namespace="{NAMESPACE}", service="{FULLNAME}-scheduler", pod="b"}}', "values": "1x10"},
                {"series": f'up{{namespace="{NAMESPACE}", service="{FULLNAME}-runtime", pod="a"}}', "values": "1x10"},
                {"series": f'up{{namespace="{NAMESPACE}", service="{FULLNAME}-monitor", pod="a"}}', "values": "1x10"},
                # Another release's rest is down: not this release's alert.
                {"series": f'up{{namespace="other", service="{FULLNAME}-rest", pod="a"}}', "values": "0x20"},
                # The event stream fills up; a bucket stays low.
                {"series": f'pai_jetstream_stream_bytes{{namespace="{NAMESPACE}", stream="PAI_EVENTS", bucket=""}}',
                 "values": "950x20"},
                {"series": f'pai_jetstream_stream_max_bytes{{namespace="{NAMESPACE}", stream="PAI_EVENTS", bucket=""}}',
                 "values": "1000x20"},
                {"series": f'pai_jetstream_stream_bytes{{namespace="{NAMESPACE}", stream="KV_pai_jobs", '
                           'bucket="pai_jobs"}', "values": "10x20"},
                {"series": f'pai_jetstream_stream_max_bytes{{namespace="{NAMESPACE}", stream="KV_pai_jobs", '
                           'bucket="pai_jobs"}', "values": "1000x20"},
                # The launcher's leader goes, its standby does not take over; the scheduler's does.
                {"series": f'pai_leader{{namespace="{NAMESPACE}", service="launcher", pod="l1"}}', "values": "1 1 0x18"},
                {"series": f'pai_leader{{namespace="{NAMESPACE}", service="launcher", pod="l2"}}', "values": "0x20"},
                {"series": f'pai_leader{{namespace="{NAMESPACE}", service="scheduler", pod="s1"}}', "values": "1 1 0x18"},
                {"series": f'pai_leader{{namespace="{NAMESPACE}", service="scheduler", pod="s2"}}', "values": "0 0 1x18"},
            ],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": "NodeFilesystemUsage", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "pai_source": "prometheus", "node": "gpu-1"},
                    "exp_annotations": {"summary": "the data file system of node gpu-1 is 95% full (threshold 90%)"},
                }]},
                {"eval_time": "4m", "alertname": "NodeFilesystemUsage", "exp_alerts": []},  # `for: 5m` not yet
                {"eval_time": "5m", "alertname": "NodeNotReady", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "pai_source": "prometheus", "node": "gpu-3"},
                    "exp_annotations": {"summary": "node gpu-3 is not ready: the PAI monitor holds it unhealthy "
                                                   "(pai_node_up 0)"},
                }]},
                {"eval_time": "3m", "alertname": "ServiceDown", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "pai_source": "prometheus", "namespace": NAMESPACE,
                                    "service": f"{FULLNAME}-{service}"},
                     "exp_annotations": {"summary": f"PAI service {FULLNAME}-{service} is not ready: no target of "
                                                    "its Service answers Prometheus' scrape"}}
                    for service in ("rest", "launcher")
                ]},
                {"eval_time": "12m", "alertname": "PaiStoreNearlyFull", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "pai_source": "prometheus", "namespace": NAMESPACE,
                                   "stream": "PAI_EVENTS"},  # an empty label is no label
                    "exp_annotations": {"summary": "JetStream stream PAI_EVENTS is 95% of its byte limit: full, it "
                                                   "refuses writes (raise the nats_* limit or let retention catch up)"},
                }]},
                {"eval_time": "5m", "alertname": "PaiLeaderMissing", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "pai_source": "prometheus", "namespace": NAMESPACE,
                                   "service": "launcher"},
                    "exp_annotations": {"summary": "0 replicas of PAI's launcher hold its leader lease (one should)"},
                }]},
            ],
        }],
    }
    path = tmp_path / "pai-rules-test.yaml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
