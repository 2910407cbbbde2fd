"""Jittered exponential backoff of NATS reconnects (libs/common/reconnect.py)."""

from __future__ import annotations

import random
import statistics

import pytest

from libs.common.reconnect import (
    RECONNECT_BASE_SECONDS,
    RECONNECT_CAP_SECONDS,
    backoff_window,
    is_auth_refusal,
    jittered_delay,
    server_chooser,
)


def test_the_window_doubles_up_to_the_cap():
    windows = [backoff_window(n) for n in range(10)]
    assert windows[0] == RECONNECT_BASE_SECONDS
    assert windows[1] == 2 * RECONNECT_BASE_SECONDS
    assert max(windows) == RECONNECT_CAP_SECONDS == windows[-1]
    assert windows == sorted(windows)
    assert backoff_window(10_000) == RECONNECT_CAP_SECONDS


def test_a_negative_attempt_is_refused():
    with pytest.raises(ValueError, match="attempt"):
        backoff_window(-1)


def test_a_thousand_clients_spread_over_the_window_instead_of_one_instant():
    rng = random.Random(7)
    for attempt in (0, 3, 20):
        delays = [jittered_delay(attempt, rng) for _ in range(1000)]
        window = backoff_window(attempt)
        assert all(0 <= d < window for d in delays)
        # Spread over the whole window: no instant holds more than a few percent.
        buckets = [0] * 10
        for d in delays:
            buckets[int(d / window * 10)] += 1
        assert max(buckets) < 150, buckets
        assert statistics.pstdev(delays) > window / 5


class Server:
    def __init__(self, name: str, reconnects: int):
        self.name, self.reconnects = name, reconnects


def test_a_reconnect_goes_to_a_server_tried_least_after_a_jittered_wait():
    choose = server_chooser(random.Random(3))
    servers = [Server("a", 2), Server("b", 1), Server("c", 1)]
    picks = [choose(servers, {}) for _ in range(200)]
    assert {server.name for server, _ in picks} == {"b", "c"}  # never the one tried most
    assert all(0 <= delay < backoff_window(1) for _, delay in picks)
    assert len({delay for _, delay in picks}) == 200  # no two clients wait alike


def test_only_an_authorization_violation_counts_as_refused_credentials():
    assert is_auth_refusal(Exception("nats: 'Authorization Violation'"))
    assert not is_auth_refusal(ConnectionRefusedError(111, "Connect call failed"))
    assert not is_auth_refusal(None)
