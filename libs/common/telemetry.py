"""Tracing and structured logs.

Trace context travels in NATS headers (`traceparent`, W3C format) so one
OpenTelemetry trace spans rest -> scheduler -> launcher -> runtime. Logs are JSON
lines carrying the job id and the trace id of the span they were written in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping

from opentelemetry import trace
from opentelemetry.propagate import extract, inject as otel_inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_tracer = trace.get_tracer("pai")

# Attributes of a LogRecord that are not user-supplied `extra` fields.
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = format(ctx.trace_id, "032x")
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(service: str, *, level: str | None = None) -> None:
    """JSON logs on stderr; spans exported to the console only when PAI_TRACE_CONSOLE=1."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("PAI_LOG_LEVEL", "INFO"))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    provider = TracerProvider(resource=Resource.create({"service.name": f"pai-{service}"}))
    if os.environ.get("PAI_TRACE_CONSOLE") == "1":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context (`traceparent`) to outgoing NATS headers."""
    otel_inject(headers)


@contextlib.contextmanager
def span_from_headers(name: str, headers: Mapping[str, str] | None, **attributes: str) -> Iterator[None]:
    """Continue the trace a message carries while handling it."""
    ctx = extract(dict(headers or {}))
    with _tracer.start_as_current_span(name, context=ctx, attributes=attributes):
        yield


@contextlib.contextmanager
def span(name: str, **attributes: str) -> Iterator[None]:
    with _tracer.start_as_current_span(name, attributes=attributes):
        yield


def now() -> float:
    return time.time()
