"""One KV value kept current in rest's memory by a watch, e.g. the scheduler's cluster
view, which every submission checks (does the VC exist, can the job ever fit).

A cache, never a store: `value` is None until the watch has delivered the key's
value, and again whenever the watch is down (rest starting, NATS away or just back);
callers then read the bucket as without it. The watch delivers a change about a
millisecond after it is stored.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Generic, TypeVar

import msgspec

from libs.common.bus import Bus, connection_number, watch_key
from libs.common.subjects import Bucket

log = logging.getLogger("pai.rest.watched")

T = TypeVar("T")


class WatchedValue(Generic[T]):
    def __init__(self, bucket: Bucket, key: str, type_: type[T], empty: T):
        self.bucket, self.key, self.type, self.empty = bucket, key, type_, empty
        self._value: T | None = None
        self._connection = -1
        self._bus: Bus | None = None

    @property
    def value(self) -> T | None:
        """The current value (`empty` when the key is absent), or None when not known now."""
        if self._bus is None or connection_number(self._bus.nc) != self._connection:
            return None
        return self._value

    def _apply(self, raw: bytes | None) -> None:
        try:
            self._value = self.empty if not raw else msgspec.json.decode(raw, type=self.type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("cannot decode %s/%s (%s): reading the bucket instead", self.bucket, self.key, exc)
            self._value = None

    async def run(self, bus: Bus, stopping: asyncio.Event) -> None:
        """Keep `value` current until `stopping`; start again after every reconnect."""

        watching_on = [-1]  # the connection the watch stands on: what it delivers is current on it alone

        def began(connection: int, stored: int) -> None:
            watching_on[0] = connection
            if stored == 0:  # the key has no value
                self._apply(None)
                self._bus, self._connection = bus, connection

        def changed(entry: Any) -> None:
            self._apply(None if entry.operation in ("DEL", "PURGE") else entry.value)
            self._bus, self._connection = bus, watching_on[0]

        def ended() -> None:
            self._value, self._bus = None, None

        await watch_key(bus, self.bucket, stopping, changed, key=self.key, on_start=began, on_end=ended)
