"""Tracing and structured logs.

One trace per job. Its trace id is derived from the job id (`job_trace_id`),
so every service puts the spans of a job into the same trace whatever started
them: a request, an event, a scheduler tick or a task's exit seen by the
launcher's backend. Trace context also travels in NATS headers (`traceparent`,
W3C format): a consumer's span is the child of the span that published the
event when that span is in the job's trace, else a child of the job's root,
linked to the publisher's span. So one trace spans rest -> scheduler ->
launcher -> runtime -> monitor: submit, placed, started, exited, verdict, state.

Spans leave the process only when configured: `otlp_endpoint` (OTLP over
HTTP/protobuf, e.g. an OpenTelemetry Collector or Jaeger at :4318), or
PAI_TRACE_CONSOLE=1 (stderr). Logs are JSON lines carrying the job id and the
trace id of the span they were written in.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping

from opentelemetry import context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract, inject as otel_inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

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


def setup(service: str, *, level: str | None = None, otlp_endpoint: str = "") -> None:
    """JSON logs on stderr; spans to `otlp_endpoint` (OTLP/HTTP) when set, to the
    console when PAI_TRACE_CONSOLE=1."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("PAI_LOG_LEVEL", "INFO"))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    provider = TracerProvider(resource=Resource.create({"service.name": f"pai-{service}"}))
    if otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(otlp_exporter(otlp_endpoint)))
    if os.environ.get("PAI_TRACE_CONSOLE") == "1":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # the last batch is sent when the service stops


def _exporting() -> bool:
    """Whether spans leave the process (a span processor is installed). When none
    is, spans are not made at all: each costs tens of microseconds per event, on
    every hop of every job, for nothing anyone can see. Logs still carry the job's
    trace id (`span_from_headers`)."""
    provider = trace.get_tracer_provider()
    processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None)
    return bool(processors) if processors is not None else True


def otlp_exporter(endpoint: str) -> SpanExporter:
    """OTLP over HTTP/protobuf to `endpoint` (the collector's base URL; /v1/traces is added)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    return OTLPSpanExporter(endpoint=url, timeout=5)


# --- one trace per job ---------------------------------------------------------------


def _digest(job: str, what: bytes) -> bytes:
    return hashlib.sha256(b"pai-trace\0" + what + b"\0" + job.encode("utf-8", "replace")).digest()


@functools.lru_cache(maxsize=16384)
def job_trace_id(job: str) -> int:
    """The trace id of every span about `job` (128 bits, never 0)."""
    return int.from_bytes(_digest(job, b"trace")[:16], "big") or 1


def job_trace_id_hex(job: str) -> str:
    """As trace viewers show it (32 hex digits): what `pai status` and the API give."""
    return format(job_trace_id(job), "032x")


@functools.lru_cache(maxsize=16384)
def _job_root(job: str) -> SpanContext:
    """The job's (never exported) root: the parent of spans that have no better one."""
    span_id = int.from_bytes(_digest(job, b"root")[:8], "big") or 1
    return SpanContext(
        trace_id=job_trace_id(job), span_id=span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )


def _in_job_trace(job: str, context: Context | None) -> tuple[Context, list[Link]]:
    """`context` when its span belongs to the job's trace; else the job's root, with a
    link to the span `context` held (the request or tick that acted for the job)."""
    current = trace.get_current_span(context).get_span_context()
    if current.is_valid and current.trace_id == job_trace_id(job):
        return (context if context is not None else otel_context.get_current()), []
    links = [Link(current)] if current.is_valid else []
    return trace.set_span_in_context(NonRecordingSpan(_job_root(job))), links


def inject(headers: dict[str, str], *, job: str = "") -> None:
    """Add the trace context (`traceparent`) to outgoing NATS headers. With `job`,
    a short span records the publish in the job's trace, and that span is the
    context sent: the consumer's span becomes its child."""
    if not _exporting():
        return
    if not job:
        otel_inject(headers)
        return
    context, links = _in_job_trace(job, None)
    with _tracer.start_as_current_span("publish", context=context, links=links, attributes={"job": job},
                                       kind=trace.SpanKind.PRODUCER):
        otel_inject(headers)


@contextlib.contextmanager
def span_from_headers(name: str, headers: Mapping[str, str] | None, **attributes: str) -> Iterator[None]:
    """Continue the trace a message carries while handling it; for a job's event
    (attribute `job`), always within the job's trace."""
    job = attributes.get("job", "")
    if not _exporting():
        with _within_job(job):
            yield
        return
    context = extract(dict(headers or {}))
    links: list[Link] = []
    if job:
        context, links = _in_job_trace(job, context)
    with _tracer.start_as_current_span(name, context=context, links=links, attributes=attributes,
                                       kind=trace.SpanKind.CONSUMER):
        yield


@contextlib.contextmanager
def spans_from_headers(events: Iterable[tuple[str, Mapping[str, str] | None, str]]) -> Iterator[None]:
    """One consumer span per event of a batch handled at once, `(name, headers, job)`
    each, all covering the batch's handling, each in its job's trace."""
    if not _exporting():
        yield
        return
    started = []
    for name, headers, job in events:
        context, links = _in_job_trace(job, extract(dict(headers or {}))) if job else (extract(dict(headers or {})), [])
        started.append(_tracer.start_span(name, context=context, links=links, attributes={"job": job},
                                          kind=trace.SpanKind.CONSUMER))
    try:
        yield
    finally:
        for each in started:
            each.end()


@contextlib.contextmanager
def _within_job(job: str) -> Iterator[None]:
    """The job's trace as the current context, without a span: logs carry its id."""
    if not job:
        yield
        return
    with trace.use_span(NonRecordingSpan(_job_root(job)), end_on_exit=False):
        yield


@contextlib.contextmanager
def span(name: str, **attributes: str) -> Iterator[None]:
    if not _exporting():
        yield
        return
    with _tracer.start_as_current_span(name, attributes=attributes):
        yield


def now() -> float:
    return time.time()
