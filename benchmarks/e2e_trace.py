"""Every NATS message around one job, for benchmarks/e2e_throughput.py.

Subscribes (as the platform user, who may read everything) to every subject,
`$JS`/`$KV` ones included, records a quiet window of the idle platform, then the
window of one job, and reports per subject pattern how many messages each
window saw (the job's = its window minus the quiet one, scaled to the same
length), and the ordered list of the messages that name the job (its events,
its KV writes, their deliveries to consumers).

Subject patterns: the job's name becomes <job>, inbox and ack tokens become *,
so `$JS.ACK.PAI_EVENTS.launcher.*` counts the launcher's acks of events.
"""

from __future__ import annotations

import re
import time
from typing import Any

SUBJECTS = (">", "$JS.>", "$KV.>")
_INBOX = re.compile(r"^(_INBOX)\.[^.]+(\..*)?$")


def pattern(subject: str, name: str) -> str:
    """`subject` with the job's name and per-message tokens replaced."""
    if name:
        subject = subject.replace(name, "<job>")
    if subject.startswith("_INBOX."):
        return "_INBOX.*"
    parts = subject.split(".")
    if subject.startswith("$JS.ACK."):
        return ".".join(parts[:4] + ["*"])  # $JS.ACK.<stream>.<durable>.*
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return ".".join(parts[:7])  # ...NEXT.<stream>.<durable>
    if subject.startswith("$JS.API.") and parts[2] in ("DIRECT", "STREAM") and len(parts) > 5:
        return ".".join(parts[:5] + ["*"])
    if subject.startswith("$KV.") and "<job>" not in subject:
        return ".".join(parts[:2] + ["*"])
    if subject.startswith("pai.v1.node.") or subject.startswith("pai.v1.alert."):
        return ".".join(parts[:4] + ["*"])
    return subject


class Recorder:
    def __init__(self, nc: Any):
        self.nc = nc
        self.subs: list[Any] = []
        self.messages: list[tuple[float, str, str, int, bool]] = []  # (time, subject, reply, size, names job)
        self.marks: list[tuple[float, str]] = []
        self.began = time.monotonic()
        self.payloads: list[bytes] = []

    @classmethod
    async def start(cls, nc: Any) -> Recorder:
        recorder = cls(nc)

        async def on_message(msg, source: str) -> None:
            if source == ">" and msg.subject.startswith("$"):
                return  # counted by the "$..." subscription instead
            recorder.messages.append((time.monotonic(), msg.subject, msg.reply or "", len(msg.data or b""), False))
            recorder.payloads.append(bytes(msg.data or b"")[:4096])

        def callback(source: str):
            async def received(msg) -> None:
                await on_message(msg, source)
            return received

        for subject in SUBJECTS:
            recorder.subs.append(await nc.subscribe(subject, cb=callback(subject)))
        await nc.flush()
        recorder.began = time.monotonic()
        return recorder

    def mark(self, label: str) -> None:
        self.marks.append((time.monotonic(), label))

    def stop(self, *, job: str, name: str) -> dict:
        """The report (see the module's doc); unsubscribes."""
        import asyncio

        for sub in self.subs:
            asyncio.get_running_loop().create_task(sub.unsubscribe())
        ended = time.monotonic()
        split = self.marks[0][0] if self.marks else self.began
        quiet_seconds, job_seconds = split - self.began, ended - split
        quiet: dict[str, int] = {}
        busy: dict[str, int] = {}
        sequence = []
        job_bytes = job.encode()
        for (at, subject, reply, size, _), data in zip(self.messages, self.payloads, strict=True):
            key = pattern(subject, name)
            (quiet if at < split else busy)[key] = (quiet if at < split else busy).get(key, 0) + 1
            if at >= split and (name in subject or job_bytes in data):
                sequence.append({"ms": round((at - split) * 1000, 1), "subject": pattern(subject, name),
                                 "reply": pattern(reply, name) if reply else "", "bytes": size})
        scale = job_seconds / quiet_seconds if quiet_seconds > 0 else 0.0
        per_pattern = {}
        for key in sorted(set(quiet) | set(busy)):
            extra = busy.get(key, 0) - quiet.get(key, 0) * scale
            per_pattern[key] = {"job_window": busy.get(key, 0), "quiet_window": quiet.get(key, 0),
                                "attributed_to_job": round(extra, 1)}
        return {
            "job": job,
            "quiet_window_s": round(quiet_seconds, 2),
            "job_window_s": round(job_seconds, 2),
            "messages_in_job_window": sum(busy.values()),
            "messages_in_quiet_window": sum(quiet.values()),
            "messages_attributed_to_job": round(sum(busy.values()) - sum(quiet.values()) * scale, 1),
            "per_subject": per_pattern,
            "naming_the_job_in_order": sequence,
        }
