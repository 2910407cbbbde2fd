"""Pull requests of the bus's own on a JetStream consumer (`Puller`), and what a
delivery's reply subject says (`delivery`): for the durable consumers
(consume.py) and the paged reads of a bucket (kv.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, NamedTuple

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from libs.common.bus.link import Inbox, Received, Unsubscribable, link_of, status_of

# How long one pull request for the next event lingers in the server when none is
# waiting; the loop then checks whether the service is stopping and asks again.
PULL_WAIT_SECONDS = 5.0
# An answer to a pull request that never ends (the connection dropped under it).
PULL_ANSWER_SECONDS = 2.0


class Puller:
    """Pull requests of our own on a durable, answered on a private inbox.

    `next_batch` returns every event waiting, up to a bound, without lingering
    for more: a no-wait request is answered at once with what there is. When
    nothing waits, one request for a single event lingers in the server until
    it comes (`PULL_WAIT_SECONDS` at most). nats-py's own batched fetch keeps a
    batch open until its timeout once the first event is in, adding that wait
    to every hop.

    The answers are read straight off the wire (`Link.subscribe`)
    into an inbox of `Received` deliveries; the status that ends an answer (404
    no messages, 408 expired, 409) is told by its first header line alone. An
    answer that comes late (after its request timed out here) is not lost: it
    waits in the inbox and is the start of the next batch.
    """

    def __init__(self, nc: NatsClient, stream: str, durable: str):
        self._nc = nc
        self._link = link_of(nc)
        self._subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._sub: Unsubscribable | None = None
        self.received = Inbox(asyncio.get_running_loop())

    @classmethod
    async def open(cls, nc: NatsClient, stream: str, durable: str) -> Puller:
        puller = cls(nc, stream, durable)
        puller._sub = await puller._link.subscribe(puller._inbox, puller._on_message)
        return puller

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if status_of(data, headers) is not None:
            self.received.put(ANSWER_ENDED)
        else:
            self.received.put(Received(self._link, subject, reply.decode(), data, headers))

    async def next_batch(self, most: int) -> list[Received]:
        msgs = self._already_here(most)
        if not msgs:
            await self.request({"batch": 1, "expires": int(PULL_WAIT_SECONDS * 1e9)})
            msgs = await self.answer(1, PULL_WAIT_SECONDS + PULL_ANSWER_SECONDS)
        # Each delivery says how many more wait for this consumer: none (an idle
        # platform's lone event) costs no second request.
        more = min(most - len(msgs), delivery(msgs[-1]).pending) if msgs else 0
        if more > 0:
            await self.request({"batch": more, "no_wait": True})
            msgs += await self.answer(more, PULL_ANSWER_SECONDS)
        return msgs

    def _already_here(self, most: int) -> list[Received]:
        msgs: list[Received] = []
        waiting = self.received.items
        while len(msgs) < most and waiting:
            msg = waiting.popleft()
            if msg is not ANSWER_ENDED:
                msgs.append(msg)
        return msgs

    async def request(self, request: dict[str, Any]) -> None:
        await self._nc.publish(self._subject, msgspec.json.encode(request), reply=self._inbox)

    async def answer(self, most: int, timeout: float) -> list[Received]:
        """Events answering the request, until `most` came or a status ended it
        (no more waiting, the request expired), or `timeout` passed; under one
        timer for the whole answer (nats-py's `next_msg` makes a task, a uuid and
        a timer per message)."""
        msgs: list[Received] = []
        received = self.received
        waiting = received.items
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(msgs) < most:
                    msg = waiting.popleft() if waiting else await received.get()
                    if msg is ANSWER_ENDED:
                        break
                    msgs.append(msg)
        return msgs


# What the inbox of a `Puller` holds for the status that ended an answer.
ANSWER_ENDED = object()


class Delivery(NamedTuple):
    delivered: int  # times this event was delivered to the consumer, this one included
    stream_seq: int
    pending: int  # events still waiting for the consumer after this one


def delivery(msg: Received | Msg) -> Delivery:
    """What a JetStream delivery's reply subject says (nats-py's `msg.metadata`),
    without the dataclasses and datetime nats-py builds for every event.

    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`;
    newer servers put `<domain>.<account hash>` before the stream and a token after."""
    tokens = msg.reply.split(".")
    at = 4 if len(tokens) == 9 else 6
    return Delivery(int(tokens[at]), int(tokens[at + 1]), int(tokens[at + 4]))

