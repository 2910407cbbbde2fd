"""Every metric the scheduler exports."""

from prometheus_client import Counter

DECISIONS = Counter("pai_scheduler_decisions_total", "Scheduling decisions by kind", ["kind"])
