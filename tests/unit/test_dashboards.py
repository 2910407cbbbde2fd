"""Every PromQL expression in the chart's Grafana dashboards names only metrics PAI
exports: a renamed or removed metric fails here instead of leaving an empty panel.

What PAI exports is read from the prometheus-client registry after importing
every service's metrics module (and the monitor's alerts package, where the
alert engineer's metrics live), expanded to the sample names Prometheus stores
(`_total`, `_bucket`, `_sum`, `_count`, `_created`).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "deploy/helm/pai/dashboards").glob("*.json"))
SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")
# Series Prometheus makes itself for every target or alert, not PAI.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS", "ALERTS_FOR_STATE"}

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}
_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "atan2",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_GRAFANA_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def exported_names() -> set[str]:
    for service in SERVICES:
        importlib.import_module(f"services.{service}.metrics")
    alerts = REPO / "services/monitor/alerts"
    if alerts.is_dir():
        for module in pkgutil.iter_modules([str(alerts)]):
            importlib.import_module(f"services.monitor.alerts.{module.name}")
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (functions, keywords, labels and numbers left out)."""
    text = _GRAFANA_VAR.sub("1", _STRING.sub('""', expr))
    text = _RANGE.sub("", _MATCHERS.sub("", _LABEL_LIST.sub("", text)))
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or word in _PROMQL_WORDS:
            continue  # a function call or a keyword
        names.add(word)
    return names


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target (rows' nested panels too) and every query variable."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel {panel.get('title')!r}", target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        # label_values(metric{...}, label) / query_result(expr): the metric part.
        inner = re.match(r"\s*(?:label_values|query_result)\s*\((.*)\)\s*$", query or "", re.S)
        if inner:
            args = inner.group(1)
            found.append((f"variable {variable['name']!r}", args.rsplit(",", 1)[0] if "label_values" in query else args))
    return found


@pytest.mark.parametrize(
    "expr, names",
    [
        ('sum by (vc, state) (pai_jobs{vc=~"$vc"})', {"pai_jobs"}),
        ("histogram_quantile(0.95, sum by (le) (rate(pai_x_bucket[$__rate_interval])))", {"pai_x_bucket"}),
        ('sum(a{type="volatile_double"}) or vector(0)', {"a"}),
        ("rate(b_total[5m]) / on (instance) group_left (node) c", {"b_total", "c"}),
    ],
    ids=["by-and-matchers", "histogram", "or-vector", "on-group-left"],
)
def test_metric_names_are_read_out_of_promql(expr, names):
    assert metric_names(expr) == names


def test_there_are_the_dashboards_people_need():
    titles = {json.loads(path.read_text())["uid"] for path in DASHBOARDS}
    assert {"pai-vc", "pai-job", "pai-node", "pai-services"} <= titles
    job = json.loads((REPO / "deploy/helm/pai/dashboards/pai-job.json").read_text())
    node = json.loads((REPO / "deploy/helm/pai/dashboards/pai-node.json").read_text())
    assert "job" in {v["name"] for v in job["templating"]["list"]}
    assert "node" in {v["name"] for v in node["templating"]["list"]}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_every_expression_uses_metrics_pai_exports(path: Path):
    dashboard = json.loads(path.read_text())
    exported = exported_names() | PROMETHEUS_OWN
    found = expressions(dashboard)
    assert found, f"{path.name} has no PromQL"
    unknown = [
        f"{where}: {name} (in {expr})"
        for where, expr in found
        for name in sorted(metric_names(expr))
        if name not in exported
    ]
    assert not unknown, f"{path.name} reads metrics PAI does not export:\n" + "\n".join(unknown)


def test_panel_ids_are_unique_per_dashboard():
    for path in DASHBOARDS:
        ids: list[int] = []

        def walk(panels: list[dict], ids: list[int]) -> None:
            for panel in panels:
                ids.append(panel["id"])
                walk(panel.get("panels", []), ids)

        walk(json.loads(path.read_text())["panels"], ids)
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
