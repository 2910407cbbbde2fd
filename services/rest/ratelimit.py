"""A request rate limit per bearer token: a token bucket in this rest process.

Each token (anonymous callers: each peer address) may send `burst` requests at
once and `rate` requests per second after that; past it rest answers 429 with
`Retry-After` and a JSON body, before looking the token up in NATS, so a flood
of requests with made-up tokens costs NATS nothing either. Probes and metrics
are never limited. With several rest replicas each keeps its own buckets.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable

from aiohttp import web

from services.rest import metrics

# Buckets of callers quiet long enough to be full again are forgotten once
# there are this many, so made-up tokens cannot grow the table without bound.
MAX_TRACKED_CALLERS = 10_000
TOO_MANY_REQUESTS_CODE = "TooManyRequestsError"


class TokenBuckets:
    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, when counted)

    def take(self, caller: str) -> float:
        """Spend one request of `caller`'s; 0 when allowed, else seconds until one is allowed."""
        now = self._clock()
        tokens, then = self._buckets.get(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens >= 1.0:
            self._remember(caller, tokens - 1.0, now)
            return 0.0
        self._remember(caller, tokens, now)
        return (1.0 - tokens) / self.rate

    def _remember(self, caller: str, tokens: float, now: float) -> None:
        if caller not in self._buckets and len(self._buckets) >= MAX_TRACKED_CALLERS:
            self._forget_full(now)
        self._buckets[caller] = (tokens, now)

    def _forget_full(self, now: float) -> None:
        full = [c for c, (tokens, then) in self._buckets.items() if tokens + (now - then) * self.rate >= self.burst]
        for caller in full:
            del self._buckets[caller]
        if len(self._buckets) >= MAX_TRACKED_CALLERS:  # all busy: forget the oldest half
            by_age = sorted(self._buckets, key=lambda c: self._buckets[c][1])
            for caller in by_age[: len(by_age) // 2]:
                del self._buckets[caller]


def _caller(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        # surrogateescape: aiohttp keeps a header's bytes that are not UTF-8 that way (auth refuses them later)
        return "token:" + hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).hexdigest()
    return f"peer:{request.remote}"


def refusal(buckets: TokenBuckets, request: web.Request) -> web.Response | None:
    """Spend one of the caller's requests: None when allowed, else the 429 to answer
    (rest's request middleware asks before it looks the token up; probes and metrics
    are not asked about)."""
    wait = buckets.take(_caller(request))
    if wait <= 0:
        return None
    metrics.RATE_LIMITED.inc()
    return web.json_response(
        {
            "code": TOO_MANY_REQUESTS_CODE,
            "message": f"more than {buckets.burst} requests at once or {buckets.rate:g} per second "
                       f"with this token; try again in {wait:.2f} s",
        },
        status=429,
        headers={"Retry-After": str(max(1, math.ceil(wait)))},
    )
