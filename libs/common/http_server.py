"""Every service's HTTP server, hardened against clients that hold connections
without finishing requests (slow-loris), idle ones, and floods of connections.

aiohttp bounds the size of a request line and header, and closes a connection idle
between requests after `keepalive_timeout` (its default is an hour). What it does
not bound, a thin subclass of its protocol does (`GuardedHandler`):
- connections in all and per peer address: past either cap a new connection is
  answered 503 at once and closed, so the process never runs out of file
  descriptors (20,000 half-open connections used to leave every request timing out);
- a request header that does not arrive whole `header_timeout` seconds after the
  connection opened, or after the data of a new request began, closes the connection.
A body that does not arrive in time is the handler's 408 (services/rest/request.py:
`read_body`). Logs of what such clients cause are rate-limited (`RateLimitedLog`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter

from libs.common.config import Config

log = logging.getLogger("pai.http")

# File descriptors kept free of connections: the NATS connection, logs, files served.
RESERVED_FILES = 256

SHED = Counter("pai_http_connections_shed_total",
               "HTTP connections the server closed to protect itself, by reason", ["reason"])


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 15.0
    keepalive: float = 75.0
    max_connections: int = 8192
    max_per_peer: int = 1024

    @classmethod
    def of(cls, config: Config) -> Limits:
        return cls(header_timeout=config.http_header_timeout_seconds, keepalive=config.http_keepalive_seconds,
                   max_connections=config.http_max_connections,
                   max_per_peer=config.http_max_connections_per_peer)


def raise_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def _refusal(reason: str) -> bytes:
    body = json.dumps({"code": "ServiceUnavailable", "message": reason}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Retry-After: 1\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


@dataclass
class Guard:
    """The connections open now, in all and per peer, against the limits."""

    limits: Limits
    max_connections: int  # limits.max_connections, under the file limit
    total: int = 0
    per_peer: dict[str, int] = field(default_factory=dict)

    def admit(self, peer: str) -> bytes | None:
        """None when a connection from `peer` may open (it is counted), else the answer that refuses it."""
        if self.total >= self.max_connections:
            SHED.labels("max_connections").inc()
            return _refusal(f"the server has {self.total} connections open, its limit (http_max_connections); "
                            "try again shortly")
        held = self.per_peer.get(peer, 0)
        if held >= self.limits.max_per_peer:
            SHED.labels("max_per_peer").inc()
            return _refusal(f"{peer} has {held} connections open, the limit per peer "
                            "(http_max_connections_per_peer); close some or try again shortly")
        self.total += 1
        self.per_peer[peer] = held + 1
        return None

    def release(self, peer: str) -> None:
        self.total -= 1
        left = self.per_peer.get(peer, 1) - 1
        if left:
            self.per_peer[peer] = left
        else:
            self.per_peer.pop(peer, None)


class GuardedHandler(RequestHandler):
    """aiohttp's protocol for one connection, admitted by the `Guard` and closed when a
    request header is late. (No __slots__: the base's slots stay, these live in a dict.)"""

    def __init__(self, manager: web.Server, *, guard: Guard, **kwargs):
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._peer: str | None = None  # set once admitted
        self._header_timer: asyncio.TimerHandle | None = None
        self._requests_when_armed = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else str(peername or "")
        refusal = self._guard.admit(peer)
        if refusal is not None:
            # Answered and closed before aiohttp sees it: no task, no timer, no parser work.
            transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()
            return
        self._peer = peer
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._peer is None:
            return
        if self._header_timer is None and self._waiter is not None and not self._waiter.done():
            self._arm_header_timer()  # idle between requests, and a new request begins
        super().data_received(data)
        if self._header_timer is not None and self._request_count != self._requests_when_armed:
            self._header_timer.cancel()  # its header is in
            self._header_timer = None

    def close_after_response(self) -> None:
        """Close the connection once the answer now being made is sent, without
        lingering to read the rest of a body that is not coming."""
        self._lingering_time = 0.0
        self.close()  # aiohttp's: no further request on this connection, closed after this one

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._peer is None:
            return  # refused: never counted, never handed to aiohttp
        self._guard.release(self._peer)
        self._peer = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._guard.limits.header_timeout > 0:
            self._requests_when_armed = self._request_count
            self._header_timer = self._loop.call_later(self._guard.limits.header_timeout, self._header_late)

    def _header_late(self) -> None:
        self._header_timer = None
        if self._request_count == self._requests_when_armed:
            SHED.labels("header_timeout").inc()
            self.force_close()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections are `GuardedHandler`s."""

    def __init__(self, runner: web.AppRunner, host: str | None, port: int, *, guard: Guard,
                 handler_kwargs: dict, **kwargs):
        super().__init__(runner, host, port, **kwargs)
        self._guard = guard
        self._handler_kwargs = handler_kwargs

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def protocol() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, guard=self._guard, **self._handler_kwargs)

        self._server = await loop.create_server(protocol, self._host, self._port, backlog=self._backlog,
                                                reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


async def serve(app: web.Application, host: str, port: int, limits: Limits) -> tuple[web.AppRunner, GuardedSite]:
    """Serve `app` on host:port with `limits`; the runner (to clean up) and the site (its `port`)."""
    files = raise_file_limit()
    cap = max(1, min(limits.max_connections, files - RESERVED_FILES))
    if cap < limits.max_connections:
        log.warning("at most %d HTTP connections (http_max_connections %d): the file limit is %d", cap,
                    limits.max_connections, files)
    # The request handlers' settings, for the runner and for each connection's handler.
    handler_kwargs: dict[str, Any] = {"access_log": None, "keepalive_timeout": limits.keepalive}
    runner = web.AppRunner(app, **handler_kwargs)
    await runner.setup()
    site = GuardedSite(runner, host, port, guard=Guard(limits, cap), handler_kwargs=handler_kwargs,
                       reuse_address=True, backlog=1024)
    await site.start()
    return runner, site


class RateLimitedLog(logging.Filter):
    """At most `burst` records of one logger and message template per `window` seconds;
    the first record after a quiet spell says how many were dropped. A flood of
    failing connections must not fill the disk with the same traceback."""

    def __init__(self, burst: int = 10, window: float = 60.0):
        super().__init__()
        self.burst, self.window = burst, window
        self._seen: dict[tuple[str, str], list[float | int]] = {}  # key -> [window start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.window:
            dropped = int(seen[2]) if seen is not None else 0
            if len(self._seen) > 1000:
                self._seen.clear()  # many distinct templates: start over rather than grow
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = f"{record.msg} [{dropped} more like this in the last {self.window:.0f}s were not logged]"
            return True
        if seen[1] < self.burst:
            seen[1] += 1
            return True
        seen[2] += 1
        return False


# The loggers that clients can make speak: asyncio (accept failures), aiohttp's
# server (bad requests, failed handlers), and the services' own request loggers.
FLOODABLE_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.access", "pai.rest", "pai.http")


def limit_log_rates(burst: int = 10, window: float = 60.0) -> RateLimitedLog:
    """Rate-limit the FLOODABLE_LOGGERS (once per process); the filter they share."""
    limiter = RateLimitedLog(burst, window)
    for name in FLOODABLE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedLog) for f in logger.filters):
            logger.addFilter(limiter)
    return limiter
