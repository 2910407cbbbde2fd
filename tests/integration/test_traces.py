"""One job, one trace: every service's spans of a job reach an OTLP/HTTP endpoint
under the trace id the API and `pai status` give.

The receiver is an aiohttp server in this test accepting OTLP's
`POST /v1/traces` (protobuf), as an OpenTelemetry Collector or Jaeger would.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cli.up import Platform
from libs.common.natsserver import free_port
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration


class Receiver:
    """Spans received, by trace id (hex): (service.name, span name) pairs."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.requests = 0

    async def traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.requests += 1
        for resource_spans in export.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), "?"
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans[span.trace_id.hex()].append((service, span.name))
        return web.Response(body=b"", content_type="application/x-protobuf")


async def test_one_trace_covers_a_job_across_rest_scheduler_launcher_and_runtime(tmp_path, monkeypatch):
    # The services' span batches go out every 0.2 s instead of OpenTelemetry's default
    # 5 s (its standard setting, read from the environment the services inherit).
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    config = platform_config(tmp_path / "pai", otlp_endpoint=f"http://127.0.0.1:{port}")
    platform = Platform(config, print_fn=lambda *_: None)
    try:
        api = Api(platform, await asyncio.to_thread(platform.start))
        name = f"traced-{uuid.uuid4().hex[:6]}"
        # Fails once (a verdict from the runtime), then succeeds on the retry.
        marker = Path(tempfile.mkdtemp(prefix="pai-traces-"))
        marker.chmod(0o1777)  # tasks may run as uids of their own
        marker = marker / "ran"
        await api.submit(job_yaml(name, [f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 3"], retry=1))
        detail = await api.wait_state(f"admin~{name}", "SUCCEEDED", timeout=60)
        trace_id = detail["traceId"]
        assert len(trace_id) == 32 and int(trace_id, 16)

        wanted = {"pai-rest", "pai-scheduler", "pai-launcher", "pai-runtime", "pai-monitor"}
        kinds = ("job.submitted", "job.placed", "task.started", "task.exited", "task.verdict", "job.state")

        def missing() -> list[str]:
            spans = receiver.spans.get(trace_id, [])
            names = " ".join(name for _, name in spans)
            return sorted(wanted - {s for s, _ in spans}) + [kind for kind in kinds if kind not in names]

        # Spans are sent in batches, each service's on its own clock: one service's
        # first batch can come before another batch of the same service holding the rest.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and missing():
            await asyncio.sleep(0.5)
        spans = receiver.spans.get(trace_id, [])
        assert missing() == [], f"missing from the job's trace: {missing()}; spans: {spans[:30]}"
        # Other jobs' spans are elsewhere: the trace is this job's alone.
        other = [t for t, s in receiver.spans.items() if t != trace_id and any("traced" in n for _, n in s)]
        assert other == []
    finally:
        await asyncio.to_thread(platform.stop)
        await runner.cleanup()
