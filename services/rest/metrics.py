"""Every metric rest exports."""

from prometheus_client import Counter, Histogram

JOBS_SUBMITTED = Counter("pai_rest_jobs_submitted_total", "Jobs accepted at intake", ["vc"])
REQUESTS = Histogram("pai_rest_request_seconds", "HTTP request latency", ["method", "route", "status"])
