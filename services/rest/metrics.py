"""Every metric rest exports."""

from prometheus_client import Counter, Histogram

JOBS_SUBMITTED = Counter("pai_rest_jobs_submitted_total", "Jobs accepted at intake", ["vc"])
REQUESTS = Histogram("pai_rest_request_seconds", "HTTP request latency", ["method", "route", "status"])
RATE_LIMITED = Counter("pai_rest_rate_limited_total", "Requests refused with 429 by the per-token rate limit")


# The histogram's child per (method, route, status), so a request does not look its
# labels up again (`labels()` takes a lock and builds the key: a few µs per request).
_REQUEST_CHILDREN: dict[tuple[str, str, int], object] = {}
MAX_REQUEST_CHILDREN = 4096  # methods are the client's to choose: past this, start over


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    child = _REQUEST_CHILDREN.get((method, route, status))
    if child is None:
        if len(_REQUEST_CHILDREN) >= MAX_REQUEST_CHILDREN:
            _REQUEST_CHILDREN.clear()
        child = _REQUEST_CHILDREN[(method, route, status)] = REQUESTS.labels(
            method=method, route=route, status=str(status))
    child.observe(seconds)
