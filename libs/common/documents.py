"""An admin-editable document: one KV key, changed by compare-and-set, watched by
every replica of the service that applies it, each edit's outcome answered over
request/reply. The runtime's failure rules (`pai_rules`) and the monitor's alert
rules (`pai_alert_rules`) are two (docs/architecture.md, "The bus").

- `DocumentStore`: the key, typed by a msgspec Struct (or `bytes`, for a service
  whose core reads the stored bytes itself and says what is wrong with them):
  `read`, `write(last=)` (refused when someone wrote since `last`), `edit` (read,
  plan, write; a lost race planned again on top of the winner's value), and
  `follow` (the value now, then every change, again after every reconnect: the
  bus's `watch_key`).
- `subscribe`, `serve`, `answering`: a queue group answering the commands (one
  replica each), an undecodable command or NATS away answered, never raised.
- `ask`: the caller's side; no answer is `Transient`.
The outcomes and their HTTP errors are `libs.common.document_messages` (no nats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.subscription import Subscription
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from libs.common.bus.connection import Connection
from libs.common.bus.kv import watch_key
from libs.common.bus.wire import kv_parts
from libs.common.document_messages import Outcome
from libs.common.errors import Transient
from libs.common.subjects import Bucket

log = logging.getLogger("pai.documents")

T = TypeVar("T")
X = TypeVar("X")
R = TypeVar("R")

# What goes wrong talking to NATS; anything else is a bug.
NATS_TROUBLE = (nats.errors.Error, asyncio.TimeoutError, OSError, Transient)
# Two admins editing at the very same moment: the loser plans its edit again on top
# of the winner's, after a random pause that grows each round, so that one replica
# cannot keep beating another.
EDIT_PAUSE_SECONDS = 0.01
EDIT_PAUSE_MAX_SECONDS = 0.2
# Validating and storing a document takes milliseconds; retries on a busy key add
# a little. Past this the service is down or stuck.
REQUEST_TIMEOUT_SECONDS = 10.0


class Snapshot(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """The key's value at one revision."""

    value: T | None  # None: nothing stored (never written, deleted, or not readable as the type)
    revision: int  # 0: never written (or its history is gone)


@dataclass(frozen=True)
class Write(Generic[T, X]):
    """What an edit's plan writes (`value`), and what the caller keeps of it (`then`)."""

    value: T
    then: X


class DocumentStore(Generic[T]):
    """Key `key` of a bucket, holding one `type_` (`bytes`: stored as given)."""

    def __init__(self, kv: KeyValue, key: str, type_: type[T]):
        self.kv, self.key, self.type = kv, key, type_
        self._decoder: msgspec.json.Decoder[T] | None = None if type_ is bytes else msgspec.json.Decoder(type_)

    async def read(self) -> Snapshot[T]:
        try:
            entry = await self.kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:  # also a deleted key
            return Snapshot(value=None, revision=0)
        return Snapshot(value=self._decoded(entry.value, entry.revision or 0), revision=entry.revision or 0)

    async def write(self, value: T, *, last: int) -> int:
        """Store `value` if the key is still at revision `last` (0: never written);
        its new revision. Raises nats.js.errors.KeyWrongLastSequenceError when
        someone wrote first."""
        data = value if isinstance(value, bytes) else msgspec.json.encode(value)
        if last == 0:
            return await self.kv.create(self.key, data)
        return await self.kv.update(self.key, data, last=last)

    async def edit(self, plan: Callable[[Snapshot[T]], Write[T, X] | R], *,
                   attempts: int = 1) -> tuple[X, int] | R | None:
        """Read, `plan` (a `Write`, or an answer that ends the edit unwritten), and
        write on the revision read: `(then, revision)` once written, the plan's
        answer as it is, or None when others wrote first `attempts` times running."""
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(random.uniform(0, min(EDIT_PAUSE_MAX_SECONDS, EDIT_PAUSE_SECONDS * 2**attempt)))
            snapshot = await self.read()
            planned = plan(snapshot)
            if not isinstance(planned, Write):
                return planned
            try:
                revision = await self.write(planned.value, last=snapshot.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            return planned.then, revision
        return None

    async def follow(self, bus: Connection, stopping: asyncio.Event, on_snapshot: Callable[[Snapshot[T]], None]) -> None:
        """The value now, then every change, to `on_snapshot` until `stopping`; the
        watch starts again (the value now first) after every reconnect or failure, and
        so does nats-py's ordered consumer when it restarts itself under load: a change
        overtaken by a newer one meanwhile may then not come, the newest always does."""

        def on_entry(entry: KeyValue.Entry) -> None:
            deleted = entry.operation in (KV_DEL, KV_PURGE)
            revision = entry.revision or 0
            on_snapshot(Snapshot(value=None if deleted else self._decoded(entry.value, revision), revision=revision))

        await watch_key(bus, Bucket(kv_parts(self.kv).name), stopping, on_entry, key=self.key)

    def _decoded(self, data: bytes | None, revision: int) -> T | None:
        if not data:
            return None
        if self._decoder is None:
            return data  # type: ignore[return-value]  # T is bytes
        try:
            return self._decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            log.error("%s/%s revision %d is not readable (%s); taken as nothing stored",
                      kv_parts(self.kv).name, self.key, revision, error)
            return None


# --- the commands over request/reply ---------------------------------------------------------


class Reply(Protocol):
    outcome: Outcome


async def subscribe(bus: Connection, subject: str, queue: str) -> Subscription:
    """This replica's place in the queue group answering `subject`, known to the
    server before this returns (so the service may say it is ready)."""
    subscription = await bus.nc.subscribe(subject, queue=queue)
    await bus.round_trip()
    return subscription


def answering(request_type: type[Any], handle: Callable[[Any], Awaitable[R]], reply_type: Callable[..., R], *,
              what: str, store: str) -> Callable[[bytes], Awaitable[R]]:
    """A command's bytes to its answer: `handle` the decoded `request_type`; an
    undecodable command is INVALID ("not a `what` request") and NATS away while
    handling it UNAVAILABLE ("the `store` is not reachable")."""
    decoder = msgspec.json.Decoder(request_type)

    async def answer(data: bytes) -> R:
        try:
            request = decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            return reply_type(outcome=Outcome.INVALID, message=f"not {what} request: {error}")
        try:
            return await handle(request)
        except NATS_TROUBLE as error:
            log.warning("%s request %s failed on NATS: %r", what, getattr(request, "action", ""), error)
            return reply_type(outcome=Outcome.UNAVAILABLE, message=f"the {store} is not reachable: {error!r}")

    return answer


async def serve(subscription: Subscription, answer: Callable[[bytes], Awaitable[Any]]) -> None:
    """Answer each command, one at a time per replica (the key's revision orders
    replicas among themselves)."""
    try:
        async for msg in subscription.messages:
            reply = await answer(msg.data)
            if msg.reply:
                with contextlib.suppress(*NATS_TROUBLE):
                    await msg.respond(msgspec.json.encode(reply))
    finally:
        with contextlib.suppress(*NATS_TROUBLE):
            await subscription.unsubscribe()  # the connection may be going away anyway


async def ask(bus: Connection, subject: str, request: msgspec.Struct, reply_type: type[R], *, who: str,
              timeout: float = REQUEST_TIMEOUT_SECONDS) -> R:
    """Send a command; its answer, decoded. No answer: Transient naming `who` should have."""
    try:
        msg = await bus.nc.request(subject, msgspec.json.encode(request), timeout=timeout)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise Transient(f"the {who} did not answer the {subject.rsplit('.', 1)[-1]} request; is it running?") from exc
    return msgspec.json.decode(msg.data, type=reply_type)
