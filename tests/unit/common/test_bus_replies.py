"""What the bus reads off NATS replies without nats-py's per-message objects: a
delivery's counts from its reply subject, a JetStream publish's outcome from its
answer, and a batch of publishes waiting for their answers."""

from __future__ import annotations

import asyncio
import json

import nats.js.errors
import pytest
from nats.aio.msg import Msg
from nats.js import api

from libs.common.bus import (
    STORED as _STORED,
    ApiAnswer as _ApiAnswer,
    PendingStores as _PendingStores,
    api_answer_of as _api_answer_of,
    delivery as _delivery,
    pub_ack_of as _pub_ack_of,
    revision_of as _revision_of,
    store_is_full,
    store_outcome as _store_outcome,
)


def delivery(reply: str) -> Msg:
    return Msg(_client=None, subject="pai.v1.job.submitted.default.alice.alice~j", reply=reply, data=b"{}")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reply", "delivered", "stream_seq", "pending"),
    [
        pytest.param("$JS.ACK.PAI_EVENTS.monitor.1.2045.1988.1732430000000000000.0", 1, 2045, 0,
                     id="first-delivery-nothing-behind"),
        pytest.param("$JS.ACK.PAI_EVENTS.scheduler.3.17.90.1732430000000000000.255", 3, 17, 255,
                     id="redelivered-with-more-waiting"),
        pytest.param("$JS.ACK.hub.ACCHASH.PAI_EVENTS.launcher.2.99.7.1732430000000000000.12.r4nd0m", 2, 99, 12,
                     id="with-domain-and-account-hash"),
        pytest.param("$JS.ACK._.ACCHASH.PAI_EVENTS.launcher.1.5.5.1732430000000000000.0", 1, 5, 0, id="no-domain-no-token"),
    ],
)
def test_a_delivery_is_read_as_nats_py_reads_it(reply, delivered, stream_seq, pending):
    msg = delivery(reply)
    assert _delivery(msg) == (delivered, stream_seq, pending)
    assert (_delivery(msg).delivered, _delivery(msg).stream_seq, _delivery(msg).pending) == (
        msg.metadata.num_delivered, msg.metadata.sequence.stream, msg.metadata.num_pending)


def test_a_pub_ack_is_stored_a_duplicate_too():
    assert _store_outcome(b'{"stream":"PAI_EVENTS","seq":42}') is _STORED
    assert _store_outcome(b'{"stream":"PAI_EVENTS","seq":42,"duplicate":true}') is _STORED


@pytest.mark.parametrize(
    ("data", "kind", "full"),
    [
        pytest.param(b'{"error":{"code":503,"err_code":10077,"description":"maximum bytes exceeded"},'
                     b'"stream":"KV_pai_jobs","seq":0}',
                     nats.js.errors.ServiceUnavailableError, True, id="no-room"),
        pytest.param(b'{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}',
                     nats.js.errors.BadRequestError, False, id="too-large"),
        pytest.param(b'{"error":{"code":500,"err_code":10049,"description":"resource limits exceeded"}}',
                     nats.js.errors.ServerError, False, id="server-error"),
    ],
)
def test_a_refusal_is_the_error_nats_py_would_raise(data, kind, full):
    outcome = _store_outcome(data)
    assert type(outcome) is kind
    assert store_is_full(outcome) is full


def test_an_answer_without_a_body_means_no_stream_listens():
    outcome = _store_outcome(b"")  # "NATS/1.0 503" in its headers
    assert isinstance(outcome, nats.js.errors.NoStreamResponseError)


async def test_a_batch_waits_for_every_answer_and_gives_them_in_publish_order():
    pending = _PendingStores(7, "_INBOX.abc.", 3, _store_outcome)
    assert pending.replies == ["_INBOX.abc.7.0", "_INBOX.abc.7.1", "_INBOX.abc.7.2"]
    refused = nats.js.errors.BadRequestError()
    loop = asyncio.get_running_loop()
    loop.call_soon(pending.answer, 2, _STORED)
    loop.call_soon(pending.answer, 0, refused)
    loop.call_soon(pending.answer, 1, _STORED)
    assert await pending.answered(30) == [refused, _STORED, _STORED]


async def test_a_batch_not_all_answered_in_time_says_which_were_not():
    pending = _PendingStores(8, "_INBOX.abc.", 2, _store_outcome)
    pending.answer(1, _STORED)
    pending.answer(1, nats.js.errors.BadRequestError())  # a second answer to the same publish changes nothing
    assert await pending.answered(0.05) == [None, _STORED]


WRONG_LAST = b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"KV_pai_jobs","seq":0}'


@pytest.mark.parametrize(
    ("data", "pub_ack", "revision"),
    [
        pytest.param(b'{"stream":"KV_pai_jobs","seq":42}', api.PubAck(stream="KV_pai_jobs", seq=42), 42, id="stored"),
        pytest.param(b'{"stream":"PAI_EVENTS","seq":7,"duplicate":true}',
                     api.PubAck(stream="PAI_EVENTS", seq=7, duplicate=True), 7, id="duplicate"),
        pytest.param(b'{"stream":"PAI_EVENTS","domain":"hub","seq":8}',
                     api.PubAck(stream="PAI_EVENTS", seq=8, domain="hub"), 8, id="with-domain"),
    ],
)
def test_a_single_publish_answer_is_the_pub_ack_nats_py_returns(data, pub_ack, revision):
    assert _pub_ack_of(data, None) == pub_ack == api.PubAck.from_response(json.loads(data))
    assert _revision_of(data, None) == revision


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        pytest.param(WRONG_LAST, nats.js.errors.BadRequestError, id="wrong-last-sequence"),
        pytest.param(b"", nats.js.errors.NoStreamResponseError, id="no-stream"),
    ],
)
def test_a_refused_single_publish_is_the_error_nats_py_raises(data, kind):
    for read in (_pub_ack_of, _revision_of):
        outcome = read(data, None)
        assert type(outcome) is kind
    if data:
        assert _pub_ack_of(data, None).err_code == 10071  # what KeyValue.update turns into KeyWrongLastSequenceError


@pytest.mark.parametrize(
    ("data", "headers", "no_responders"),
    [
        pytest.param(b'{"type":"io.nats.jetstream.api.v1.stream_info_response"}', None, False, id="answer"),
        pytest.param(b"", b"NATS/1.0 503\r\n\r\n", True, id="no-responders"),
        pytest.param(b'{"error":{"code":404,"err_code":10059}}', None, False, id="error-answer"),
    ],
)
def test_an_api_answer_keeps_its_payload_and_tells_no_responders(data, headers, no_responders):
    assert _api_answer_of(data, headers) == _ApiAnswer(data, no_responders)
