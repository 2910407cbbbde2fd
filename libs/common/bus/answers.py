"""The answers to the bus's requests: JetStream publishes' acks and JetStream API
answers, on one reply subscription per connection (`StoreAcks`), whichever link
(`link.Link`, `wire.FastLink`) carries them; and what the bus reads of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
import nats.errors
import nats.js.errors
from nats.js import api

from libs.common.bus.link import Link, Unsubscribable, status_of

# A JetStream publish answered with a PubAck that carries no error.
STORED = object()


class PubAck(msgspec.Struct):
    stream: str
    seq: int
    domain: str | None = None
    duplicate: bool | None = None


PUB_ACK = msgspec.json.Decoder(PubAck)
# What is kept of one request's answer (`StoreAcks.send`), from its payload and raw headers.
AnswerReader = Callable[[bytes, "bytes | None"], object]


class PendingStores:
    """Requests sent together (a batch of JetStream publishes, or one request),
    waiting for their answers: one future and, while they wait, one timer for
    them all."""

    __slots__ = ("all_answered", "answers", "number", "read", "replies", "unanswered")

    def __init__(self, number: int, prefix: str, count: int, read: AnswerReader):
        self.number = number
        self.read = read  # what is kept of an answer
        self.replies = [f"{prefix}{number}.{position}" for position in range(count)]
        # Per request: None until answered, then what `read` made of its answer
        # (for a publish: STORED, or the exception that refused it).
        self.answers: list[object] = [None] * count
        self.unanswered = count
        self.all_answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def answer(self, position: int, outcome: object) -> None:
        if self.answers[position] is None:
            self.answers[position] = outcome
            self.unanswered -= 1
            if not self.unanswered and not self.all_answered.done():
                self.all_answered.set_result(None)

    async def answered(self, timeout: float) -> list[object]:
        """Each publish's answer, None for one not answered within `timeout`."""
        if self.unanswered:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.all_answered
        return self.answers


class StoreAcks:
    """The answers to the bus's requests (the acks of JetStream publishes, answers
    of JetStream's API), on one reply subscription per connection.

    Each request of a batch gets the reply subject `<inbox>.<batch>.<position>`,
    so an answer finds its batch and its place by its subject alone. nats-py's
    own requests pay per request what here is paid per batch: a future, a timer,
    a random token (a system call) and a NUID each, then a `Msg` and a parsed
    PubAck object per answer. The answers are read straight off the wire
    (`link.subscribe`): no `Msg`, no queue, no task step."""

    def __init__(self, link: Link):
        self._link = link
        self._prefix = b""
        self._prefix_text = ""
        self._sub: Unsubscribable | None = None
        self._subscribing = asyncio.Lock()
        self._batches = 0
        self._waiting: dict[int, PendingStores] = {}

    async def send(self, requests: Sequence[tuple[str, bytes, dict[str, str] | None]], read: AnswerReader,
                   timeout: float) -> list[object]:
        """Send `(subject, data, headers)` requests one after another without
        waiting, then await their answers together. Per request: what `read` made
        of its answer, the nats-py error that kept it from leaving (e.g. past the
        largest payload, a closed connection), or None when not answered within
        `timeout`."""
        pending = await self.expect(len(requests), read)
        try:
            refused = await self._link.send([(subject, reply, headers, data) for (subject, data, headers), reply
                                             in zip(requests, pending.replies, strict=True)])
            for position, exc in enumerate(refused):
                if exc is not None:
                    pending.answer(position, exc)
            return await pending.answered(timeout)
        finally:
            self.forget(pending)

    async def expect(self, count: int, read: AnswerReader) -> PendingStores:
        if self._sub is None:
            async with self._subscribing:  # two first batches at once: one subscription
                if self._sub is None:
                    inbox = self._link.nc.new_inbox()
                    self._prefix_text = inbox + "."
                    self._prefix = self._prefix_text.encode()
                    self._sub = await self._link.subscribe(inbox + ".>", self._on_answer)
        self._batches += 1
        pending = PendingStores(self._batches, self._prefix_text, count, read)
        self._waiting[pending.number] = pending
        return pending

    def forget(self, pending: PendingStores) -> None:
        """Answers that come for `pending` from now on are late: dropped."""
        self._waiting.pop(pending.number, None)

    def _on_answer(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        number, _, position = subject[len(self._prefix):].partition(b".")
        pending = self._waiting.get(int(number))
        if pending is not None:
            pending.answer(int(position), pending.read(data, headers))


def store_outcome(data: bytes, headers: bytes | None = None) -> object:
    """What a JetStream publish's answer (its payload) says: `STORED`, or why it was not."""
    if not data:  # a status without a body: no stream listens on the subject
        return nats.js.errors.NoStreamResponseError()
    if b'"error"' not in data:  # a PubAck: {"stream": ..., "seq": ...}
        return STORED
    try:
        nats.js.errors.APIError.from_error(msgspec.json.decode(data)["error"])  # raises the error's class
    except nats.js.errors.APIError as exc:
        return exc
    return nats.js.errors.APIError(description=data.decode(errors="replace"))


def revision_of(data: bytes, headers: bytes | None) -> object:
    """A KV create's answer: its revision (the stream sequence) once stored."""
    outcome = store_outcome(data)
    return PUB_ACK.decode(data).seq if outcome is STORED else outcome


def pub_ack_of(data: bytes, headers: bytes | None) -> object:
    """A single publish's answer: nats-py's `PubAck` once stored."""
    outcome = store_outcome(data)
    if outcome is not STORED:
        return outcome
    ack = PUB_ACK.decode(data)
    return api.PubAck(stream=ack.stream, seq=ack.seq, domain=ack.domain, duplicate=ack.duplicate)


class ApiAnswer(NamedTuple):
    """A JetStream API request's answer, decoded by the request (`wire._JetStream._api_request`)."""

    data: bytes
    no_responders: bool


def api_answer_of(data: bytes, headers: bytes | None) -> object:
    return ApiAnswer(data, status_of(data, headers) == 503)

