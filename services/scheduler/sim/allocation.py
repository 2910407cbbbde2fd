"""GPUs held over virtual time: exact time-weighted averages per fixed interval (e.g. hourly).

Each interval's value is the average number of GPUs held during it, not a sample
at one instant, so short jobs are counted for exactly the time they ran.
"""

from __future__ import annotations


class AllocationTracker:
    def __init__(self, origin: float, interval: float, keys: list[str]):
        self.origin = origin
        self.interval = interval
        self._level = {key: 0 for key in keys}
        self._since = {key: origin for key in keys}
        self._area: dict[str, list[float]] = {key: [] for key in keys}  # GPU-seconds per interval

    def change(self, now: float, key: str, delta: int) -> None:
        self._accumulate(key, now)
        self._level[key] += delta

    def _accumulate(self, key: str, now: float) -> None:
        level = self._level[key]
        start = self._since[key]
        self._since[key] = now
        if level == 0 or now <= start:
            return
        area = self._area[key]
        interval = self.interval
        position = start
        while position < now:
            bucket = int((position - self.origin) // interval)
            bucket_end = self.origin + (bucket + 1) * interval
            upto = min(now, bucket_end)
            while len(area) <= bucket:
                area.append(0.0)
            area[bucket] += level * (upto - position)
            position = upto

    def finish(self, end: float) -> None:
        """Close every series at `end` (the last moment of the simulation)."""
        for key in self._level:
            self._accumulate(key, end)

    def mean_gpus(self, key: str, buckets: int) -> list[float]:
        """Average GPUs held in each of the first `buckets` intervals."""
        area = self._area[key]
        return [(area[index] if index < len(area) else 0.0) / self.interval for index in range(buckets)]

    def gpu_seconds(self, key: str) -> float:
        return sum(self._area[key])
