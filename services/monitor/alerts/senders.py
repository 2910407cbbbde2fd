"""Sending alerts to Alertmanager and to a webhook: the I/O shell of outbound.py.

Each receiver has its own task, so a receiver that is slow or away delays only
itself, never mail, evaluation or event handling, and every failure is retried:

- **Alertmanager** (`alertmanager_urls`, one task per URL): the alerts' state is
  posted at once when an alert fires or resolves and again every
  `alertmanager_resend_seconds`; a failed post is tried again with a doubling pause
  (1 s up to the resend period), each time with the state as it is then. The state
  comes from the alert core, restored from `pai_alerts` at start: a restart loses
  nothing, and what Alertmanager hears twice it keys by labels, once.
- **Webhook** (`alert_webhook_url`): each alert notification mail would carry, in
  order, tried ATTEMPTS times with a doubling pause (1 s to 60 s); a refusal that
  would repeat (a 4xx other than 408 and 429) is given up at once. Like mail, a
  notification's group state is stored before it is queued, so a restarted monitor
  sends nothing twice (one in flight at the crash may be lost; its `id`, also the
  `Idempotency-Key` header, lets a receiver drop a repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp

from libs.common.alerts_messages import AlertRecord
from services.monitor import metrics
from services.monitor.alerts.core import Notification
from services.monitor.alerts.outbound import alertmanager_alerts, webhook_body

log = logging.getLogger("pai.monitor.alerts.send")

ALERTMANAGER_PATH = "/api/v2/alerts"
TIMEOUT_SECONDS = 10.0
FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 60.0
ATTEMPTS = 5
_RETRYABLE_4XX = (408, 429)


class AlertmanagerSender:
    def __init__(self, urls: Iterable[str], *, alerts: Callable[[], Iterable[AlertRecord]], clock: Callable[[], float],
                 resend_seconds: float, portal_url: str = ""):
        self.urls = [u.rstrip("/") for u in urls]
        self.alerts = alerts
        self.clock = clock
        self.resend_seconds = max(0.05, resend_seconds)
        self.portal_url = portal_url
        self._changed = {url: asyncio.Event() for url in self.urls}

    def poke(self) -> None:
        """An alert fired or resolved: send the state now rather than at the next resend."""
        for event in self._changed.values():
            event.set()

    async def run(self) -> None:
        await asyncio.gather(*(self._push_forever(url) for url in self.urls))

    async def _push_forever(self, url: str) -> None:
        changed = self._changed[url]
        pause = FIRST_PAUSE_SECONDS
        failing = False
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as http:
            while True:
                changed.clear()
                body = alertmanager_alerts(self.alerts(), now=self.clock(), resend_seconds=self.resend_seconds,
                                           portal_url=self.portal_url)
                outcome, problem = await _post(http, url + ALERTMANAGER_PATH, body) if body else ("sent", "")
                if body:
                    metrics.alert_deliveries_total.labels(receiver="alertmanager", outcome=outcome).inc()
                if outcome == "failed":
                    if not failing:
                        log.warning("alertmanager %s: %s; trying again with a growing pause", url, problem)
                    failing = True
                    await asyncio.sleep(min(pause, self.resend_seconds))
                    pause = min(pause * 2, MAX_PAUSE_SECONDS)
                    continue
                if outcome == "refused":  # a bug on one side: the next change or resend tries again
                    log.error("alertmanager %s refused %d alert(s): %s", url, len(body), problem)
                elif failing:
                    log.info("alertmanager %s: %d alert(s) sent again", url, len(body))
                failing, pause = False, FIRST_PAUSE_SECONDS
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.resend_seconds)


class WebhookSender:
    def __init__(self, url: str, *, token_file: str = "", portal_url: str = "",
                 sleep: Callable[[float], Any] = asyncio.sleep):
        self.url = url
        self.portal_url = portal_url
        self.token = _read_token(token_file)
        self.queue: asyncio.Queue[Notification] = asyncio.Queue()
        self.sleep = sleep

    def put(self, notification: Notification) -> None:
        if notification.kind == "alert":  # job-state mail is for a job's owner, not an operators' tool
            self.queue.put_nowait(notification)

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as http:
            while True:
                notification = await self.queue.get()
                try:
                    await self.deliver(http, notification)
                except Exception:  # a bug in one body must not stop every later one
                    log.exception("webhook: notification %s not sent", notification.id)

    async def deliver(self, http: aiohttp.ClientSession, notification: Notification) -> bool:
        group_key = notification.group.key if notification.group is not None else notification.id.rsplit("@", 1)[0]
        body = webhook_body(notification_id=notification.id, group_key=group_key, rule=notification.rule,
                            firing=notification.firing, resolved=notification.resolved, reminder=notification.reminder,
                            portal_url=self.portal_url)
        headers = {"Idempotency-Key": notification.id}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        pause = FIRST_PAUSE_SECONDS
        for attempt in range(1, ATTEMPTS + 1):
            outcome, problem = await _post(http, self.url, body, headers)
            metrics.alert_deliveries_total.labels(receiver="webhook", outcome=outcome).inc()
            if outcome == "sent":
                return True
            if outcome == "refused":
                log.error("webhook %s refused notification %s: %s; not sent", self.url, notification.id, problem)
                return False
            if attempt < ATTEMPTS:
                log.warning("webhook %s: notification %s: %s; retrying in %.0f s", self.url, notification.id,
                            problem, pause)
                await self.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_SECONDS)
        log.error("webhook %s: gave up notification %s after %d attempts", self.url, notification.id, ATTEMPTS)
        return False


async def _post(http: aiohttp.ClientSession, url: str, body: Any,
                headers: dict[str, str] | None = None) -> tuple[str, str]:
    """("sent" | "failed" (worth retrying) | "refused" (a retry would meet it again), why)."""
    try:
        async with http.post(url, json=body, headers=headers) as response:
            if response.status < 300:
                return "sent", ""
            text = (await response.text())[:300]
            retry = response.status >= 500 or response.status in _RETRYABLE_4XX
            return ("failed" if retry else "refused"), f"answered {response.status}: {text}"
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        return "failed", f"{error.__class__.__name__} {error}".strip()


def _read_token(path: str) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        log.error("cannot read alert_webhook_token_file %s: %s; sending without a token", path, error)
        return ""
