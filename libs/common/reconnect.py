"""When a NATS client tries again: capped exponential backoff with full jitter.

A thousand node agents and services lose NATS at the same moment (a restart, a
node of the cluster gone). With a fixed wait they all come back in the same
instant, again and again, and the server spends each instant accepting them all at
once. With full jitter ("Exponential Backoff And Jitter", AWS Architecture Blog,
2015) each client waits a random time in [0, min(cap, base * 2^attempt)): the
attempts spread over the window, which doubles while the server stays away, so the
load on the server stays roughly flat however many clients there are.

Pure: the random source is passed in (tests give a seeded one).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

# First window: a single server restarting is back within a second or two, and a
# client of a cluster moves to another node at once (attempt 0 waits < BASE).
RECONNECT_BASE_SECONDS = 0.25
# Longest window: a client never waits more than this between two attempts, so a
# platform whose NATS was away for minutes is whole again soon after it returns.
# A thousand clients in a 4 s window are 250 connects a second, which a server
# checking nkeys (tens of microseconds each) takes in its stride.
RECONNECT_CAP_SECONDS = 4.0


def backoff_window(attempt: int, *, base: float = RECONNECT_BASE_SECONDS, cap: float = RECONNECT_CAP_SECONDS) -> float:
    """The upper bound of the wait before try number `attempt` (0: the first)."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    # 2**attempt overflows float for absurd attempts: the window is capped long before.
    return cap if attempt >= 64 else min(cap, base * 2.0**attempt)


def jittered_delay(attempt: int, rng: random.Random, *, base: float = RECONNECT_BASE_SECONDS,
                   cap: float = RECONNECT_CAP_SECONDS) -> float:
    """A wait drawn uniformly from [0, backoff_window(attempt))."""
    return rng.uniform(0.0, backoff_window(attempt, base=base, cap=cap))


def server_chooser(rng: random.Random) -> Callable[[list, dict], tuple[Any, float]]:
    """nats-py's `reconnect_to_server_handler`: the server tried least so far (any of
    them, at random, on a tie), after a jittered delay that grows with the rounds
    every server has failed. A cluster client moves to a live node at once; one
    whose only server is away backs off up to RECONNECT_CAP_SECONDS."""

    def choose(servers: list, _info: dict) -> tuple[Any, float]:
        rounds = min(server.reconnects for server in servers)
        fresh = [server for server in servers if server.reconnects == rounds]
        return rng.choice(fresh), jittered_delay(rounds, rng)

    return choose


def is_auth_refusal(exc: BaseException | None) -> bool:
    """Whether NATS refused the credentials (not worth retrying)."""
    return exc is not None and "authorization violation" in str(exc).lower()
