"""Every metric the launcher exports."""

from prometheus_client import Counter

TASKS_STARTED = Counter("pai_launcher_tasks_started_total", "Task instances the launcher ordered started")
