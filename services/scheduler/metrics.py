"""Every metric the scheduler exports."""

from prometheus_client import Counter, Histogram

DECISIONS = Counter("pai_scheduler_decisions_total", "Scheduling decisions by kind", ["kind"])
BATCH_EVENTS = Histogram(
    "pai_scheduler_batch_events",
    "Events handled together in one core call (one fetched batch)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
ENTRIES_WRITTEN = Counter(
    "pai_scheduler_schedule_writes_total", "Entries of pai_schedule stored or deleted (one per touched job per batch)"
)
