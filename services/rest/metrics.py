"""Every metric rest exports."""

from typing import Any

from prometheus_client import Counter, Histogram

JOBS_SUBMITTED = Counter("pai_rest_jobs_submitted_total", "Jobs accepted at intake", ["vc"])
REQUESTS = Histogram("pai_rest_request_seconds", "HTTP request latency", ["method", "route", "status"])
RATE_LIMITED = Counter("pai_rest_rate_limited_total", "Requests refused with 429 by the per-token rate limit")

# Each labelled metric's child per label values, so a request does not look its labels
# up again (`labels()` takes a lock and builds its key: a few µs per call). Label values
# come from requests (a method is the client's to choose): past this many, start over.
MAX_REMEMBERED_CHILDREN = 4096
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        if len(_children) >= MAX_REMEMBERED_CHILDREN:
            _children.clear()
        child = _children[key] = metric.labels(*values)
    return child


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    _child(REQUESTS, method, route, str(status)).observe(seconds)


def job_submitted(vc: str) -> None:
    _child(JOBS_SUBMITTED, vc).inc()
