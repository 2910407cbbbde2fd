"""rest: the HTTP API (OpenPAI v2 paths), users and tokens, job intake.

Job intake is crash-safe: the job record is created in KV first (atomically, so a
duplicate name is a 409), then `JobSubmitted` is published with a deterministic id
(services/rest/intake.py). A record whose event is not out -- a crash between the
two, or a publish not answered in time -- is published again by rest's sweep
within seconds, also in a restarted rest once its job index is loaded; JetStream
and the idempotent consumers absorb the repeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import nats.errors
import nats.js.errors
from aiohttp import web

from libs.common import telemetry
from libs.common.bus import store_is_full
from libs.common.errors import (
    PaiError,
    Transient,
)
from libs.common.protocol import MAX_BODY_BYTES, protocol_error_body
from libs.common.protocol.model import ProtocolError
from libs.common.service import ServiceContext, health_routes
from services.rest import (
    alerts as alert_routes,
    auth,
    events,
    fallback,
    jobs_api,
    metrics,
    nodes,
    portal_routes,
    ratelimit,
    rules,
    storages,
    tag_requests,
)
from services.rest.history import wiring as history
from services.rest.identity import (
    oidc_routes,
    openpai as identity_openpai,
    routes as identity_routes,
    ssh_keys,
    store as identity_store,
)
from services.rest.market import store as market_store
from services.rest.request import CTX, ctx_of
from services.rest.routes import cluster as cluster_routes, jobs as job_routes, market as market_routes
from services.rest.trailing_slash import accept_trailing_slashes

log = logging.getLogger("pai.rest")


def request_middleware(limiter: ratelimit.TokenBuckets):
    """Every request's way in, in one middleware (one frame, not three): the bus check,
    the per-token rate limit, the caller's token, then the route; domain errors become
    JSON bodies with OpenPAI's `code` and a message.

    Each request is one trace span (its context goes into the events it
    publishes) and one observation of the request-latency histogram.
    (services/rest/fallback.py, outside it, answers what is left: aiohttp's own
    errors and bugs.)
    """

    @web.middleware
    async def answer(request: web.Request, handler):
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource else "unmatched"
        method = request.method
        with telemetry.span(f"{method} {route}"):
            try:
                path = request.path
                if not path.startswith(BUS_FREE_PREFIXES) and not ctx_of(request).bus.nc.is_connected:
                    # Every API answer needs the bus: say so at once instead of
                    # waiting out a KV timeout while NATS restarts.
                    raise BusUnavailable(BUS_AWAY_MESSAGE)
                # Probes, metrics and the portal's files are never limited; the rest
                # are, before the token is looked up (a flood of made-up tokens costs NATS nothing).
                refused = None if path.startswith(auth.PUBLIC_PREFIXES) else ratelimit.refusal(limiter, request)
                response = refused if refused is not None else await auth.call_as_caller(request, handler)
            except (*BUS_ERRORS, Transient) as exc:
                if store_is_full(exc):
                    log.error("%s %s: the store is full: %r", request.method, request.path, exc)
                    response = _store_full()
                elif isinstance(exc, BUS_ERRORS):
                    log.warning("%s %s: the bus did not answer: %r", request.method, request.path, exc)
                    response = _bus_unavailable(BUS_AWAY_MESSAGE)
                else:
                    response = _bus_unavailable(exc.message)
            except BusUnavailable as exc:
                response = _bus_unavailable(exc.message)
            except ProtocolError as exc:
                response = web.json_response(protocol_error_body(exc), status=400)
            except PaiError as exc:
                body: dict[str, Any] = {"code": exc.code, "message": exc.message}
                if exc.details is not None:
                    body["details"] = exc.details
                response = web.json_response(body, status=exc.status)
        metrics.observe_request(method, route, response.status, time.perf_counter() - started)
        return response

    return answer


# Probes and metrics answer from the process itself, NATS or not.
BUS_FREE_PREFIXES = ("/healthz", "/readyz", "/metrics")
BUS_AWAY_MESSAGE = "PAI cannot reach its message bus (NATS); it is being restarted, try again shortly"
BUS_RETRY_AFTER_SECONDS = 1
# What nats-py raises when NATS is away or restarting mid-request.
BUS_ERRORS = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
)


class BusUnavailable(Transient):
    code = "ServiceUnavailable"


STORE_FULL_MESSAGE = ("PAI's store (NATS JetStream) is full: nothing was stored; an admin must free room "
                      "(docs/reliability.md); try again later")
STORE_FULL_RETRY_AFTER_SECONDS = 30


def _store_full() -> web.Response:
    """507: JetStream refused the write for want of room; nothing of the request was kept."""
    return web.json_response(
        {"code": "InsufficientStorage", "message": STORE_FULL_MESSAGE},
        status=507,
        headers={"Retry-After": str(STORE_FULL_RETRY_AFTER_SECONDS)},
    )


def _bus_unavailable(message: str) -> web.Response:
    return web.json_response(
        {"code": BusUnavailable.code, "message": message},
        status=503,
        headers={"Retry-After": str(BUS_RETRY_AFTER_SECONDS)},
    )


async def create_app(ctx: ServiceContext) -> web.Application:
    limiter = ratelimit.TokenBuckets(rate=ctx.config.rest_rate_limit_per_second, burst=ctx.config.rest_rate_limit_burst)
    app = web.Application(
        middlewares=[fallback.middleware, request_middleware(limiter)],
        client_max_size=MAX_BODY_BYTES * 2,
    )
    app[CTX] = ctx
    identity_store.configure_hashing(ctx.config.password_hash_time_cost, ctx.config.password_hash_memory_kib)
    auth.setup(app, lambda app: app[CTX].bus)  # who each token is, remembered and kept current
    app.add_routes(health_routes(lambda: ctx))
    app.add_routes(job_routes.ROUTES)  # every /api/v2/jobs route (services/rest/routes/jobs.py)
    app.add_routes(cluster_routes.ROUTES)  # VCs, sku types, info, Kubernetes views (services/rest/routes/cluster.py)
    app.add_routes(market_routes.ROUTES)  # the marketplace (services/rest/routes/market.py)
    app.add_routes(identity_routes.routes)
    app.add_routes(identity_openpai.routes)  # OpenPAI's user, group and token edits (identity/openpai.py)
    app.add_routes(ssh_keys.routes)  # a user's SSH keys one by one (identity/ssh_keys.py)
    oidc_routes.setup(app, ctx)  # sign-in through the identity provider, /api/v2/authn/info
    events.setup(app)  # GET /api/v2/events (SSE) and what wakes its readers
    app.add_routes(rules.routes)
    app.add_routes(storages.routes)  # OpenPAI's storages, admins' declarations (services/rest/storages.py)
    jobs_api.setup(app, ctx)
    tag_requests.setup(app)  # the monitor's tag-job alert action, over the bus (services/rest/tag_requests.py)
    history.setup(app, ctx)  # the job history database, migrated before rest serves (services/rest/history)
    app.add_routes(alert_routes.routes)  # alerts, alert rules, usage report
    app.add_routes(nodes.routes)
    portal_routes.setup(app)  # the web portal at / (services/rest/portal_routes.py)
    accept_trailing_slashes(app)  # `/api/v2/users/` is `/api/v2/users`, as OpenPAI's server answers
    return app


async def startup(ctx: ServiceContext) -> None:
    # A token file that is there already is the operator's (the Helm chart mounts its
    # Secret there): rest registers it and writes nothing; otherwise it makes one.
    given = ctx.config.token_path.read_text().strip() if ctx.config.admin_token_file and ctx.config.token_path.is_file() else None
    token = await auth.ensure_admin(ctx.bus, ctx.config.admin_user, given_token=given or None)
    if token is not None:
        path = ctx.config.token_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token + "\n")
        path.chmod(0o600)
        log.info("created admin user %s; token written to %s", ctx.config.admin_user, path)
    await oidc_routes.seed_groups(ctx)  # OpenPAI's groupConfig: the groups directory groups map to
    await storages.seed(ctx)  # the storages of storages_file
    await market_store.seed(ctx.bus, ctx.config.admin_user)  # the marketplace's built-in templates, once
    # Submissions an earlier crash left unpublished: the intake sweep finds them once
    # the job index is loaded (services/rest/intake.py).
