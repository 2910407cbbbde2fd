"""A bounded memory of event ids, to count each event once.

JetStream redelivers an event whose ack was lost, usually within the consumer's
ack wait and always after the events that followed it were delivered at most a
few thousand messages later; remembering the last `capacity` ids is enough to
recognise those redeliveries without keeping every id ever seen.
"""

from __future__ import annotations

from collections import deque

DEFAULT_CAPACITY = 20_000


class RecentIds:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._order: deque[str] = deque()
        self._ids: set[str] = set()

    def add(self, event_id: str) -> bool:
        """Remember `event_id`; True when it was not remembered already."""
        if event_id in self._ids:
            return False
        self._ids.add(event_id)
        self._order.append(event_id)
        if len(self._order) > self.capacity:
            self._ids.discard(self._order.popleft())
        return True

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids
