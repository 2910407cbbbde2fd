"""Every metric the launcher exports."""

from prometheus_client import Counter, Histogram

TASKS_STARTED = Counter("pai_launcher_tasks_started_total", "Task instances the launcher ordered started")
FORGED_BELLS = Counter(
    "pai_launcher_forged_bells_total",
    "Reports to the local backend's doorbell dropped because no shim sent them (another uid: a task)",
)
BATCH_EVENTS = Histogram(
    "pai_launcher_batch_events",
    "Events applied by one transaction of the launcher core (a batch of bus or backend events)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
GROUPED_CALLERS = Histogram(
    "pai_launcher_grouped_callers",
    "Callers (bus batches, backend reports, timers) whose events one transaction of the core applied together",
    buckets=(1, 2, 3, 4, 6, 8, 16),
)
