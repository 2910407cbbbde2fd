"""Publishing on the bus: events deduplicated by their id (`Nats-Msg-Id`), KV
writes, creates and deletes, many in flight at once with their acks awaited
together (`answers.StoreAcks`), what a retry can cure retried, and JetStream's
"no room" told apart (`store_is_full`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import nats.errors
import nats.js.errors
from nats.js import api
from nats.js.kv import KV_PURGE, MSG_ROLLUP_SUBJECT

from libs.common import telemetry
from libs.common.bus.answers import STORED, revision_of, store_outcome
from libs.common.bus.connection import Connection
from libs.common.errors import Transient
from libs.common.messages import Event, encode, subject_of
from libs.common.subjects import Bucket

# A publish stored with retries: subject, payload, headers, and what it is (for errors).
_Write = tuple[str, bytes, dict[str, str] | None, str]
# What a publish or KV write may meet that a retry can cure.
PUBLISH_TROUBLE = (
    nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,  # what nats-py makes of "no responders" to a JetStream publish
)
# How long a publish's ack may take before the publish is sent again.
PUBLISH_ACK_SECONDS = 5.0
# The header nats-py's KeyValue marks a delete with.
KV_OPERATION, KV_DELETE = "KV-Operation", "DEL"
# A message's own time to live (the buckets allow it): on a purge marker, how long it stays.
KV_TTL_HEADER = api.Header.MSG_TTL.value


def purge_marker(gone_after: float) -> dict[str, str]:
    """The headers of a KV purge whose marker expires after `gone_after` seconds (at
    least 1: JetStream counts whole seconds), as nats-py's `KeyValue.purge(key,
    msg_ttl=...)` sends them."""
    return {KV_OPERATION: KV_PURGE, api.Header.ROLLUP.value: MSG_ROLLUP_SUBJECT,
            KV_TTL_HEADER: str(max(1, int(gone_after)))}



# Stored only where the subject has no message yet: a KV create.
_CREATE_ONLY: dict[str, str] = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
# JetStream's "wrong last sequence" error codes (as nats-py's KeyValue reads them).
WRONG_LAST_SEQUENCE_CODES = frozenset({10071, 10164})


class Publisher(Connection):
    """The connection's publishes and KV writes."""

    async def publish(self, event: Event, *, attempts: int = 5) -> None:
        """Publish with `Nats-Msg-Id = event.id`: a retried publish is stored once."""
        await self._store_one(*_outgoing(event), f"publish of {event.id}", attempts=attempts)

    async def publish_many(self, events: Sequence[Event], *, attempts: int = 5) -> None:
        """Publish every event, all in flight at once, and return once all are stored.

        Pipelined: the publishes leave in order, one after another, and their
        acks are awaited together. One that fails is retried by itself (so it may
        be stored after a later one); past `attempts` this raises `Transient`.
        Every event has its `Nats-Msg-Id`, so a publish retried after an answer
        was lost -- by this method, or by the redelivered batch -- is stored once.
        """
        if len(events) == 1:
            await self.publish(events[0], attempts=attempts)
            return
        writes: list[_Write] = [(*_outgoing(event), f"publish of {event.id}") for event in events]
        await self._store_together(writes, attempts=attempts)

    async def kv_write_many(self, bucket: Bucket, writes: dict[str, bytes | None], *, attempts: int = 5,
                            gone_after: float | None = None) -> None:
        """Put (or, for None, delete) every key of `writes`, all in flight at once;
        return once all are stored, raise `Transient` when one could not be.

        A KV put is a publish on the key's subject, a delete one with a delete
        marker header (as nats-py's KeyValue writes them). `gone_after`: a delete
        is a purge marker that expires after that many seconds (as `KeyValue.purge`
        with `msg_ttl`), so nothing of the key stays in the bucket's stream."""
        await self.kv(bucket)  # the bucket must exist: a write to a missing one has no responder
        prefix = f"$KV.{bucket.value}."
        deleted = {KV_OPERATION: KV_DELETE} if gone_after is None else purge_marker(gone_after)
        await self._store_together(
            [(prefix + key, value or b"", None if value is not None else deleted,
              f"writing {bucket.value}/{key}") for key, value in writes.items()],
            attempts=attempts,
        )

    async def publish_each(self, events: Sequence[Event], *, attempts: int = 5) -> list[Exception | None]:
        """Publish every event, all in flight at once, as `publish_many`; but one that
        cannot be stored fails alone: per event, None once it is stored, or the
        `Transient` saying why not (raised from JetStream's answer: `store_is_full`
        reads it). For callers that answer each event's sender on its own (rest's intake)."""
        writes: list[_Write] = [(*_outgoing(event), f"publish of {event.id}") for event in events]
        answers = await self._send_together(writes)
        return await asyncio.gather(
            *(self._retried(write, answer, attempts) for write, answer in zip(writes, answers, strict=True)))

    async def kv_create_each(self, bucket: Bucket, entries: Sequence[tuple[str, bytes]]) -> list[int | Exception]:
        """Create every `(key, value)` of `entries`, all in flight at once, each only if the key
        has no history (JetStream's expected last subject sequence 0, the header
        nats-py's `KeyValue.create` sends). Per key: its revision, or why it was not
        created: `KeyWrongLastSequenceError` when the key has a history (it exists,
        or it was deleted: `KeyValue.create` tells the two apart), a NATS timeout when
        not answered (it may be stored), or JetStream's refusal. Not retried: a
        create whose answer was lost would be refused by its own retry."""
        await self.kv(bucket)  # the bucket must exist: a write to a missing one has no responder
        prefix = f"$KV.{bucket.value}."
        answers = await self._store_acks.send(
            [(prefix + key, value, _CREATE_ONLY) for key, value in entries], revision_of, PUBLISH_ACK_SECONDS)
        return [_created(answer) for answer in answers]

    async def _send_together(self, writes: list[_Write]) -> list[object]:
        """JetStream publishes `(subject, data, headers, what)`, sent one after another
        without waiting, their acks awaited together (`StoreAcks.send`). Per publish:
        `STORED`, the exception that refused it, or None when not answered within
        `PUBLISH_ACK_SECONDS`."""
        return await self._store_acks.send([write[:3] for write in writes], store_outcome, PUBLISH_ACK_SECONDS)

    async def _retried(self, write: _Write, answer: object,
                       attempts: int) -> Exception | None:
        """A publish of `_send_together` once more by itself where a retry can cure
        its answer; None once stored, else the `Transient` naming it."""
        subject, data, headers, what = write
        if answer is STORED:
            return None
        if answer is not None and not isinstance(answer, PUBLISH_TROUBLE):
            refused = Transient(f"{what} failed: {answer!r}")
            refused.__cause__ = answer if isinstance(answer, BaseException) else None
            return refused
        try:
            await self._store_one(subject, data, headers, what, attempts=attempts - 1)
        except Transient as exc:
            return exc
        return None

    async def _store_together(self, writes: list[_Write], *, attempts: int) -> None:
        """`_send_together`; what is refused, or not answered, is published again by
        itself, with retries; past `attempts` this raises `Transient` naming it."""
        answers = await self._send_together(writes)
        for write, answer in zip(writes, answers, strict=True):
            failed = await self._retried(write, answer, attempts)
            if failed is not None:
                raise failed

    async def _store_one(self, subject: str, data: bytes, headers: dict[str, str] | None, what: str, *, attempts: int) -> None:
        """One JetStream publish, retried on what a retry can cure; `Transient` naming `what` past `attempts`."""
        for attempt in range(max(attempts, 1)):
            try:
                await self.js.publish(subject, data, headers=headers, timeout=PUBLISH_ACK_SECONDS)
                return
            except PUBLISH_TROUBLE as exc:
                if attempt >= attempts - 1:
                    raise Transient(f"{what} failed: {exc!r}") from exc
                await asyncio.sleep(0.2 * (attempt + 1))


def _outgoing(event: Event) -> tuple[str, bytes, dict[str, str]]:
    """Subject, payload and headers of an event's publish: its id for dedupe, its job's trace."""
    headers: dict[str, str] = {"Nats-Msg-Id": event.id}
    telemetry.inject(headers, job=event.job)  # a job's events: one trace per job
    return subject_of(event), encode(event), headers



def _created(answer: object) -> int | Exception:
    """What `kv_create_each` says of one key: its revision or why it was not created."""
    if isinstance(answer, int):
        return answer
    if answer is None:
        return nats.errors.TimeoutError()
    if isinstance(answer, nats.js.errors.APIError) and answer.err_code in WRONG_LAST_SEQUENCE_CODES:
        return nats.js.errors.KeyWrongLastSequenceError(description=answer.description)
    return answer if isinstance(answer, Exception) else Transient(f"unexpected answer {answer!r}")



# JetStream's answers when a stream or bucket (or the server's whole store) has
# no room: 10077 maximum bytes, 10076 maximum messages, 10047 insufficient
# storage resources. A definite refusal: nothing was stored.
STORE_FULL_ERR_CODES = frozenset({10047, 10076, 10077})


def store_is_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it was raised from, e.g. a `Transient` of `Bus.publish`)
    says JetStream refused a write for want of room."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, nats.js.errors.APIError) and exc.err_code in STORE_FULL_ERR_CODES:
            return True
        exc, seen = exc.__cause__, seen + 1
    return False

