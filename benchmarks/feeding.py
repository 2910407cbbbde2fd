"""What the one-service benchmarks share (launcher_consume.py, monitor_consume.py): a
service process fed real events on a real nats-server, its own CPU time read from /proc
(api_load.py reads rest's with it too)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import aiohttp

from libs.common.bus import Bus
from libs.common.messages import Event, encode, subject_of

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PUBLISH_WINDOW = 256  # publishes awaiting their acks at once


def cpu_seconds(pid: int) -> float:
    """The process's own CPU time (utime + stime), not its children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def publish_all(bus: Bus, events: list[Event]) -> None:
    """Pipelined: up to PUBLISH_WINDOW publishes awaiting their acks at once."""
    for start in range(0, len(events), PUBLISH_WINDOW):
        await asyncio.gather(*(
            bus.js.publish(subject_of(e), encode(e), headers={"Nats-Msg-Id": e.id}, timeout=30)
            for e in events[start:start + PUBLISH_WINDOW]
        ))


async def wait_ready(url: str, proc: subprocess.Popen, service: str) -> None:
    """Until the service's /readyz answers 200; fails when the process exits first."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"the {service} exited at start")
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"the {service} never became ready")
