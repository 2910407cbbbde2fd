"""The bus's KV helpers: reading a key, a few keys, or a whole bucket in pages
from a store that is ready (`read_pages`, `load_all`, `all_keys`), what a new
watch delivers first (`stored_when_watch_began`), and watches that stand again
after every reconnect (`keep_watching`, `watch_key`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.kv import KeyValue

from libs.common.bus.link import Received
from libs.common.bus.pull import ANSWER_ENDED, Puller, delivery
from libs.common.bus.wire import kv_parts, watcher_subscription
from libs.common.errors import Transient
from libs.common.subjects import Bucket

if TYPE_CHECKING:  # the layer below kv's helpers at run time (connection imports none of them)
    from libs.common.bus.connection import Connection

log = logging.getLogger("pai.bus")


async def get_json(kv: KeyValue, key: str, type_: type[Any]) -> tuple[Any, int] | None:
    """Value and revision of a key, decoded as `type_`; None when absent or deleted."""
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    return msgspec.json.decode(entry.value, type=type_), entry.revision or 0


async def get_many(kv: KeyValue, keys: Sequence[str], type_: type[Any], *,
                   skip_undecodable: bool = False) -> dict[str, Any]:
    """The values of `keys` (those present), decoded as `type_`: a page of gets in
    flight at a time, so a restore that needs a few keys of a big bucket reads only
    those, never the whole bucket."""
    found: dict[str, Any] = {}
    for start in range(0, len(keys), RESTORE_PAGE_ENTRIES):
        page = keys[start:start + RESTORE_PAGE_ENTRIES]
        got = await asyncio.gather(*(_get_raw(kv, key) for key in page))
        for key, raw in zip(page, got, strict=True):
            if raw is not None and (value := _decoded(kv, key, raw, type_, skip_undecodable)) is not _UNDECODABLE:
                found[key] = value
        await asyncio.sleep(0)
    return found


async def _get_raw(kv: KeyValue, key: str) -> bytes | None:
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    return entry.value or None


# Restoring state: a bucket is read in pages of at most this many entries (and
# bytes), each a pull request of an ephemeral consumer of its own (flow control:
# nothing comes that was not asked for, so no read of any size overruns the
# connection), decoded and handed on a page at a time, the event loop (and the
# lease renewal with it) getting a turn between two pages.
RESTORE_PAGE_ENTRIES = 256
RESTORE_PAGE_BYTES = 2 * 1024 * 1024
# How long a store still coming back may keep a read from progressing (no page
# came) before the service gives up and its supervisor starts it again; a read
# that progresses, however long, is never cut.
RESTORE_TIMEOUT_SECONDS = 60.0
# How long one page's answer may take.
RESTORE_PAGE_SECONDS = 5.0
# How long a watch's stored entries may pause between two (readers that still watch).
RESTORE_ENTRY_TIMEOUT_SECONDS = 5.0
# The pager's consumer disappears this long after its reader died.
RESTORE_CONSUMER_IDLE_SECONDS = 30.0


class KvEntry(NamedTuple):
    key: str
    value: bytes | None  # None: deleted or purged (a marker)
    seq: int  # its sequence in the bucket's stream


async def read_pages(kv: KeyValue, *, prefix: str = "", headers_only: bool = False) -> AsyncIterator[list[KvEntry]]:
    """Every entry of a bucket (only keys starting with `prefix`, which ends in a
    dot, when given), delete markers included, in pages of at most
    `RESTORE_PAGE_ENTRIES`, in stream order; `headers_only`: keys alone (values b"").

    A bucket keeps one message per key (history 1), so its stream in order is
    its keys, each at its latest value: an ephemeral pull consumer (no acks)
    reads it, one page per request. A key written while the read goes on comes
    again later in it, at its newer value: a reader keeps the last it saw.

    Read only from a store that is ready (docs/architecture.md, "State and recovery"): the
    stream must answer, and a consumer made on it must find as many entries as
    the stream said it holds; an empty or short answer of a JetStream still
    recovering is retried, never taken for "nothing to restore". A read that
    fails half-way goes on after the last entry handed out. Past
    `RESTORE_TIMEOUT_SECONDS` without a page, raises `Transient`.
    """
    parts = kv_parts(kv)
    subjects = f"{parts.prefix}{prefix}>"
    after = 0  # the stream sequence of the last entry handed out
    progress_at = time.monotonic()
    while True:
        try:
            consumer, pending = await _restore_consumer(kv, subjects, after, headers_only)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, _NotReady) as exc:
            problem = repr(exc)
        else:
            problem = ""
            puller = await Puller.open(parts.nc, parts.stream, consumer)
            try:
                while pending > 0:
                    page, pending = await _next_page(puller, kv, pending, headers_only)
                    if not page:
                        problem = "a page came back empty"
                        break
                    after = page[-1].seq
                    progress_at = time.monotonic()
                    yield page
                    await asyncio.sleep(0)  # the event loop's turn: lease renewal, health checks
            except (TimeoutError, nats.errors.Error) as exc:
                problem = repr(exc)
            finally:
                await puller.close()
                with contextlib.suppress(Exception):
                    await parts.js.delete_consumer(parts.stream, consumer)
            if not problem:
                return
        if time.monotonic() - progress_at > RESTORE_TIMEOUT_SECONDS:
            raise Transient(f"bucket {parts.name} is not ready to restore from: {problem}")
        log.warning("bucket %s not ready to restore from (%s); trying again", parts.name, problem)
        await asyncio.sleep(0.5)


class _NotReady(Exception):
    """The bucket's stream answered with less than it holds (JetStream recovering)."""


async def _restore_consumer(kv: KeyValue, subjects: str, after: int, headers_only: bool) -> tuple[str, int]:
    """An ephemeral pull consumer reading the bucket after sequence `after`; its
    name and how many entries it has to deliver."""
    parts = kv_parts(kv)
    info = await parts.js.stream_info(parts.stream)
    held = info.state.messages
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after else api.DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
        filter_subject=subjects,
        headers_only=headers_only or None,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=RESTORE_CONSUMER_IDLE_SECONDS,
    )
    created = await parts.js.add_consumer(parts.stream, config)
    pending = created.num_pending or 0
    whole = not after and subjects == f"{parts.prefix}>"
    if whole and pending < held:
        with contextlib.suppress(Exception):
            await parts.js.delete_consumer(parts.stream, created.name)
        raise _NotReady(f"its consumer found {pending} of the {held} entries its stream holds")
    return created.name, pending


async def _next_page(puller: Puller, kv: KeyValue, pending: int, headers_only: bool) -> tuple[list[KvEntry], int]:
    """The next page, and how many entries wait after it."""
    most = min(RESTORE_PAGE_ENTRIES, pending)
    msgs: list[Received] = []
    # A full answer may still be followed by the status that ends its request,
    # which would end the next answer at once: that one is asked again.
    for _ in range(3):
        waiting = puller.received.items
        while waiting and waiting[0] is ANSWER_ENDED:
            waiting.popleft()
        await puller.request({"batch": most, "no_wait": True, "max_bytes": RESTORE_PAGE_BYTES})
        msgs = await puller.answer(most, RESTORE_PAGE_SECONDS)
        if msgs:
            break
    if not msgs:
        return [], pending
    cut = len(kv_parts(kv).prefix)
    page = []
    for msg in msgs:
        # A delete or purge carries KV-Operation; a value never does.
        deleted = msg._raw_headers is not None and b"KV-Operation" in msg._raw_headers
        value = None if deleted else (b"" if headers_only else msg.data)
        page.append(KvEntry(msg._subject[cut:].decode(), value, delivery(msg).stream_seq))
    return page, delivery(msgs[-1]).pending


async def all_keys(kv: KeyValue, prefix: str = "") -> list[str]:
    """The live keys of a bucket (only those starting with `prefix`, which ends in
    a dot, when given: the server filters them), every one of them, read in pages
    (`read_pages`, headers only).

    Not nats-py's `KeyValue.keys()`: it ends its listing at a marker it decides
    from consumer info, and when the server has already sent every entry but the
    client has not read them yet, that marker comes first and the listing is
    empty or short (a test that purged a bucket of 300 keys this way left them
    all); nor a push watch, whose whole bucket at once overruns the connection."""
    live: dict[str, bool] = {}
    async for page in read_pages(kv, prefix=prefix, headers_only=True):
        for entry in page:
            live.pop(entry.key, None)  # a key written again meanwhile: its place is its last
            live[entry.key] = entry.value is not None
    return [key for key, alive in live.items() if alive]


async def stored_when_watch_began(watcher: KeyValue.KeyWatcher) -> int:
    """How many entries (deletes included) a new watch (not ignoring deletes)
    delivers before the changes made after it began: its consumer's delivered
    plus pending. nats-py's end-of-stored marker (None) is not to be trusted
    for this."""
    info = await watcher_subscription(watcher).consumer_info()
    return int(info.num_pending) + int(info.delivered.consumer_seq)


async def load_all(kv: KeyValue, type_: type[Any], *, skip_undecodable: bool = False) -> dict[str, Any]:
    """Every live value of a bucket, decoded: `read_pages`, decoded a page at a time.

    For a bucket that stays small (nodes, rules, alerts); a service restoring
    from a bucket that grows with the jobs reads it with `read_pages` and keeps
    only what it needs. A value that does not decode as `type_` fails the load,
    unless `skip_undecodable` (for a bucket another service owns: its bad value
    must not stop this one), when it is left out with a warning."""
    values: dict[str, Any] = {}
    async for page in read_pages(kv):
        for entry in page:
            values.pop(entry.key, None)
            if entry.value:
                value = _decoded(kv, entry.key, entry.value, type_, skip_undecodable)
                if value is not _UNDECODABLE:
                    values[entry.key] = value
    return values


_UNDECODABLE = object()


def _decoded(kv: KeyValue, key: str, raw: bytes, type_: type[Any], skip_undecodable: bool) -> Any:
    try:
        return msgspec.json.decode(raw, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        if not skip_undecodable:
            raise
        log.warning("bucket %s: skipping %s, which does not decode: %s", kv_parts(kv).name, key, exc)
        return _UNDECODABLE



# How often a standing watch checks that its connection is still the one it began on.
WATCH_CHECK_SECONDS = 1.0


def connection_number(nc: NatsClient) -> int:
    """Which connection `nc` is on now: nats-py's count of its reconnects. A watch
    (and what it fed) belongs to one: after a reconnect it may have missed changes."""
    return int(nc.stats.get("reconnects", 0))


async def keep_watching(
    bus: Connection, what: str, stopping: asyncio.Event, *,
    start: Callable[[int], Awaitable[list[Stoppable]]],
    standing: Callable[[], bool] = lambda: True,
    ended: Callable[[], None] = lambda: None,
) -> None:
    """Keep watches standing until `stopping`, starting them again after every
    reconnect or failure: the one loop behind every KV watch of the platform.

    `start(connection)` starts them (on the connection numbered `connection`)
    and returns what to stop; they stand while the bus is connected on that same
    connection and `standing()` says so; then `ended()` (what they fed is no
    longer known current) and they are stopped, and after `WATCH_CHECK_SECONDS`
    started again. NATS away or restarting is waited out, logged."""
    nc = bus.nc
    while not stopping.is_set():
        connection = connection_number(nc)
        started: list[Stoppable] = []
        try:
            started = await start(connection)
            while not stopping.is_set() and standing() and nc.is_connected and connection_number(nc) == connection:
                await asyncio.sleep(WATCH_CHECK_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NATS away or restarting: readers read the bucket meanwhile
            log.warning("watch of %s failed (%r); starting it again", what, exc)
        finally:
            ended()
            for watch in started:
                try:
                    await watch.stop()
                except Exception as exc:  # the connection may be gone already
                    log.debug("stopping a watch of %s: %r", what, exc)
        if not stopping.is_set():
            await asyncio.sleep(WATCH_CHECK_SECONDS)


async def watch_key(
    bus: Connection, bucket: Bucket, stopping: asyncio.Event, on_entry: Callable[[KeyValue.Entry], None], *,
    key: str | None = None, meta_only: bool = False,
    on_start: Callable[[int, int], None] = lambda connection, stored: None,
    on_end: Callable[[], None] = lambda: None,
) -> None:
    """Watch `key` of `bucket` (every key when None; `meta_only`: without values)
    until `stopping`, started again after every reconnect (`keep_watching`).

    Each start calls `on_start(connection, stored)`: the connection it stands
    on, and how many stored entries come before the changes made after it began
    (`stored_when_watch_began`); then every entry goes to `on_entry` (nats-py's
    end-of-stored marker, which may come early, left out). When it ends,
    `on_end()`: what it fed is no longer known current."""
    reader: list[asyncio.Future[None]] = []

    async def start(connection: int) -> list[Stoppable]:
        kv = await bus.kv(bucket)
        watcher = await (kv.watch(key, meta_only=meta_only) if key is not None else kv.watchall(meta_only=meta_only))
        try:
            on_start(connection, await stored_when_watch_began(watcher))
        except BaseException:
            with contextlib.suppress(Exception):
                await cast(Stoppable, watcher).stop()  # nats-py's stop() is not annotated
            raise
        reader[:] = [asyncio.ensure_future(_read(watcher, on_entry))]
        return [_Reading(watcher, reader[0])]

    await keep_watching(bus, f"{bucket.value}/{key or '>'}", stopping, start=start,
                        standing=lambda: bool(reader) and not reader[0].done(), ended=on_end)


async def _read(watcher: KeyValue.KeyWatcher, on_entry: Callable[[KeyValue.Entry], None]) -> None:
    async for entry in watcher:
        if entry is not None:  # nats-py's end-of-stored marker
            on_entry(entry)


class Stoppable(Protocol):
    async def stop(self) -> None: ...


class _Reading:
    """A KV watch and the task reading it: stopped together."""

    def __init__(self, watcher: KeyValue.KeyWatcher, reader: asyncio.Future[None]) -> None:
        self._watcher, self._reader = watcher, reader

    async def stop(self) -> None:
        self._reader.cancel()
        await cast(Stoppable, self._watcher).stop()  # nats-py's stop() is not annotated
