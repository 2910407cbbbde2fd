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

from libs.common.bus import Bus, stored_when_watch_began
from libs.common.subjects import Bucket

log = logging.getLogger("pai.rest.watched")

T = TypeVar("T")
CHECK_SECONDS = 1.0


class WatchedValue(Generic[T]):
    def __init__(self, bucket: Bucket, key: str, type_: type[T], empty: T):
        self.bucket, self.key, self.type, self.empty = bucket, key, type_, empty
        self._value: T | None = None
        self._connection = -1
        self._bus: Bus | None = None

    @property
    def value(self) -> T | None:
        """The current value (`empty` when the key is absent), or None when not known now."""
        if self._bus is None or self._bus.nc.stats.get("reconnects", 0) != self._connection:
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
        while not stopping.is_set():
            reconnects = bus.nc.stats.get("reconnects", 0)
            watcher = None
            try:
                kv = await bus.kv(self.bucket)
                watcher = await kv.watch(self.key)
                reader = asyncio.ensure_future(self._read(watcher, bus, reconnects))
                try:
                    while not stopping.is_set() and not reader.done() and bus.nc.is_connected \
                            and bus.nc.stats.get("reconnects", 0) == reconnects:
                        await asyncio.sleep(CHECK_SECONDS)
                finally:
                    reader.cancel()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away or restarting: callers read the bucket meanwhile
                log.warning("watch of %s/%s failed (%r); starting it again", self.bucket, self.key, exc)
            finally:
                self._value, self._bus = None, None
                if watcher is not None:
                    try:
                        await watcher.stop()
                    except Exception as exc:  # the connection may be gone already
                        log.debug("stopping a watch: %r", exc)
            if not stopping.is_set():
                await asyncio.sleep(CHECK_SECONDS)

    async def _read(self, watcher: Any, bus: Bus, reconnects: int) -> None:
        if await stored_when_watch_began(watcher) == 0:  # the key has no value
            self._apply(None)
            self._bus, self._connection = bus, reconnects
        async for entry in watcher:
            if entry is None:  # nats-py's end-of-stored marker: it may come before the value
                continue
            deleted = entry.operation in ("DEL", "PURGE")
            self._apply(None if deleted else entry.value)
            self._bus, self._connection = bus, reconnects
