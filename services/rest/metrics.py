"""Every metric rest exports."""

from prometheus_client import Counter, Histogram

JOBS_SUBMITTED = Counter("pai_rest_jobs_submitted_total", "Jobs accepted at intake", ["vc"])
REQUESTS = Histogram("pai_rest_request_seconds", "HTTP request latency", ["method", "route", "status"])
RATE_LIMITED = Counter("pai_rest_rate_limited_total", "Requests refused with 429 by the per-token rate limit")
