"""The monitor's alerts where operators look: a real Alertmanager (Debian's
`prometheus-alertmanager`, `make alerting-deps`) and a webhook (an aiohttp server of
this test), from the monitor (`python -m services.monitor`) on a real nats-server.

- an alert that fires is in Alertmanager's API with its labels and annotations, and
  leaves it when it resolves (long before the endsAt it was sent with);
- the webhook gets the notification in Alertmanager's webhook format, after a
  failed first try, once; then the resolve;
- a monitor killed (-9) and started again sends the alert to Alertmanager again
  (kept alive there) and nothing twice to the webhook.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, web

from libs.common.bus import Bus
from libs.common.natsserver import free_port
from libs.common.subjects import Bucket
from services.monitor.core.samples import NodeSample, encode_node_sample, node_key
from tests.component.test_alerts_service import MonitorProcess

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(ALERTMANAGER is None, reason="Alertmanager is not installed (make alerting-deps)")

RUN = uuid.uuid4().hex[:6]
WAIT_SECONDS = 30.0
RESEND_SECONDS = 30.0  # an alert sent stays in Alertmanager 4 x this unless resolved: the test ends long before
RULES = """
rules:
- name: NodeFilesystemUsage
  when: node_disk_usage
  threshold: 50
  severity: critical
  labels: {team: infra}
  summary: "the data disk of {node} is {value}% full"
  actions: [email-admin]
  repeatInterval: 1h
  sendResolved: true
"""


async def until(check, what: str, seconds: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.2)
    pytest.fail(f"never happened: {what}")


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
async def bus(nats_server) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_server.url, name="alert-routes-test", **nats_server.login("platform"))
    await b.bootstrap()
    yield b
    await b.close()


@pytest.fixture(scope="module")
async def alertmanager(tmp_path_factory) -> AsyncIterator[str]:
    work = tmp_path_factory.mktemp("alertmanager")
    (work / "alertmanager.yml").write_text('route: {receiver: "null"}\nreceivers: [{name: "null"}]\n')
    port = free_port()
    log = (work / "alertmanager.log").open("wb")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={work / 'alertmanager.yml'}", f"--storage.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        async with ClientSession() as http:
            async def ready() -> bool:
                assert proc.poll() is None, (work / "alertmanager.log").read_text()
                try:
                    async with http.get(f"{url}/-/ready") as resp:
                        return resp.status == 200
                except OSError:
                    return False
            await until(ready, "Alertmanager ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


class Webhook:
    """Records each POST; answers 503 to the first, as a receiver that is away."""

    def __init__(self):
        self.tries: list[dict] = []
        self.received: list[tuple[dict, dict]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tries.append(body)
        if len(self.tries) == 1:
            return web.Response(status=503, text="starting")
        self.received.append((body, dict(request.headers)))
        return web.Response(status=200)


@pytest.fixture(scope="module")
async def webhook() -> AsyncIterator[tuple[Webhook, str]]:
    hook = Webhook()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield hook, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    await runner.cleanup()


@pytest.fixture(scope="module")
async def monitor(nats_server, bus, alertmanager, webhook, tmp_path_factory) -> AsyncIterator[MonitorProcess]:
    data = tmp_path_factory.mktemp("monitor")
    rules = data / "alert-rules.yaml"
    rules.write_text(RULES)
    token = data / "webhook-token"
    token.write_text("s3cret\n")
    port = free_port()
    env = {
        **os.environ, **nats_server.env("monitor"),
        "PAI_NATS_URL": nats_server.url, "PAI_MONITOR_PORT": str(port), "PAI_DATA_DIR": str(data),
        "PAI_MONITOR_MODE": "cluster", "PAI_NODE_LOST_SECONDS": "3600", "PAI_PORTAL_URL": "http://pai.example",
        "PAI_ALERT_RULES_FILE": str(rules), "PAI_ALERT_EVALUATE_SECONDS": "0.2", "PAI_ALERT_PROBE_URLS": "-",
        "PAI_USAGE_REPORT_WEEKDAY": "-1", "PAI_SMTP_HOST": "",  # no mail: the other receivers do not need it
        "PAI_ALERTMANAGER_URLS": alertmanager, "PAI_ALERTMANAGER_RESEND_SECONDS": str(RESEND_SECONDS),
        "PAI_ALERT_WEBHOOK_URL": webhook[1], "PAI_ALERT_WEBHOOK_TOKEN_FILE": str(token),
    }
    process = MonitorProcess(env, port)
    try:
        await process.start()
        yield process
    finally:
        process.stop()


async def put_sample(bus: Bus, node: str, disk_percent: float) -> None:
    kv = await bus.kv(Bucket.NODES)
    sample = NodeSample(node=node, at=time.time(), diskUsedBytes=int(disk_percent * 10), diskTotalBytes=1000,
                        memoryUsedBytes=1, memoryTotalBytes=100)
    await kv.put(node_key(node), encode_node_sample(sample))


async def alerts_in(alertmanager: str, node: str) -> list[dict]:
    async with ClientSession() as http:
        async with http.get(f"{alertmanager}/api/v2/alerts", params={"filter": f'node="{node}"'}) as resp:
            assert resp.status == 200
            return await resp.json()


async def test_an_alert_reaches_alertmanager_and_the_webhook_and_a_restart_repeats_nothing(
        bus, alertmanager, webhook, monitor):
    hook, _ = webhook
    node = f"disk-{RUN}"
    await put_sample(bus, node, 80.0)

    [alert] = await until(lambda: alerts_in(alertmanager, node), "the alert in Alertmanager")
    assert alert["labels"] == {"alertname": "NodeFilesystemUsage", "severity": "critical", "node": node, "team": "infra"}
    assert alert["annotations"]["summary"] == f"the data disk of {node} is 80.0% full"
    assert alert["status"]["state"] == "active"

    async def notified(status: str) -> list[dict]:
        return [b for b, _ in hook.received if b["status"] == status and b["commonLabels"].get("node") == node]

    [body] = await until(lambda: notified("firing"), "the webhook's firing notification")
    assert len([t for t in hook.tries if t["id"] == body["id"]]) == 2, "the 503 was retried"
    assert body["version"] == "4" and body["groupLabels"] == {"alertname": "NodeFilesystemUsage"}
    [sent] = body["alerts"]
    assert sent["status"] == "firing" and sent["labels"]["node"] == node and sent["annotations"]["summary"]
    headers = next(h for b, h in hook.received if b is body)
    assert headers["Authorization"] == "Bearer s3cret" and headers["Idempotency-Key"] == body["id"]

    await monitor.restart()  # SIGKILL, then the same monitor again: it sends its stored alerts at once
    again = await until(lambda: _updated_since(alertmanager, node, alert["updatedAt"]),
                        "the restarted monitor sending the alert again")
    assert again["startsAt"] == alert["startsAt"], "the same alert, not a new one"
    await asyncio.sleep(2)  # ten evaluations
    assert len(await notified("firing")) == 1, "the webhook got the firing notification twice"

    await put_sample(bus, node, 20.0)
    await until(lambda: _gone(alertmanager, node), "the resolve in Alertmanager")
    [resolved] = await until(lambda: notified("resolved"), "the webhook's resolve notification")
    assert resolved["alerts"][0]["status"] == "resolved" and resolved["alerts"][0]["endsAt"] > sent["startsAt"]
    async with ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{monitor.port}/metrics") as resp:
            scraped = await resp.text()
    assert 'pai_alert_deliveries_total{outcome="sent",receiver="webhook"} 1.0' in scraped  # since the restart
    assert 'pai_alert_deliveries_total{outcome="sent",receiver="alertmanager"}' in scraped


async def _updated_since(alertmanager: str, node: str, before: str) -> dict | None:
    found = await alerts_in(alertmanager, node)
    return found[0] if found and found[0]["updatedAt"] > before else None


async def _gone(alertmanager: str, node: str) -> bool:
    return not await alerts_in(alertmanager, node)

