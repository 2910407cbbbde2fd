"""Every metric the runtime exports."""

from prometheus_client import Counter, Histogram

EXITS = Counter(
    "pai_runtime_exits_total",
    'Task exits seen: "failed" ones get a verdict, "succeeded" ones (exit 0) need none',
    ["outcome"],
)
VERDICTS = Counter("pai_runtime_verdicts_total", "Verdicts given on failed tasks", ["phrase", "reaction"])
CLASSIFY_SECONDS = Histogram(
    "pai_runtime_classify_seconds",
    "Time to classify one task exit",
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1),
)
