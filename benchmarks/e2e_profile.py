"""py-spy on every PAI process during a benchmark phase, summarised per service.

`Profiler.start(pids, out_dir, label)` runs `py-spy record --format raw
--nolineno` on each Python process (nats-server is Go: left out); `stop()` ends
the recordings (SIGINT: py-spy writes its file); `summarise()` reads the
collapsed stacks and writes `<label>.json` and `<label>.txt` beside them:
per service, the samples by step (see STEPS) and the top functions by own time
(the frame a sample was taken in).

A sample's step is the first rule of STEPS, in order, that matches any frame of
its stack, so a KV put called from a handler counts as "KV writes" however deep
in the NATS client and the event loop the sample was taken; a sample no rule
matches is "other: <package of its innermost frame>".

Also usable alone on raw files: `python -m benchmarks.e2e_profile FILE...`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TOP = 15
PYTHON_PROCESSES_EXCLUDED = ("nats-server",)

# Leaf frames of a thread waiting, not working (py-spy samples idle threads too here).
IDLE_LEAVES = {
    ("EpollSelector.select", "selectors.py"),
    ("ThreadedChildWatcher._do_waitpid", "asyncio/unix_events.py"),
    ("_worker", "concurrent/futures/thread.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("SpecReader._read", "services/launcher/backends/local_forkserver.py"),
}
# Frames up to and including these are the process's start-up (runpy, asyncio.run, the loop): not a step.
LOOP_FRAMES = {("Handle._run", "asyncio/events.py"), ("BaseEventLoop._run_once", "asyncio/base_events.py")}

# (step, predicate on (function, file) of one frame); order matters: see the module's doc.
STEPS: list[tuple[str, object]] = [
    ("fork/exec (fork server, shims)", lambda fn, f: "local_forkserver" in f or "local_shim" in f
        or fn in ("fork", "posix_spawn", "_fork_exec", "_execute_child")),
    ("KV writes", lambda fn, f: f.endswith("nats/js/kv.py") and fn.rsplit(".", 1)[-1] in (
        "put", "create", "update", "delete", "purge", "_delete")
        or "libs/common/bus/" in f and fn.rsplit(".", 1)[-1].startswith("kv_write")),
    ("publishes (JetStream)", lambda fn, f: f.endswith("nats/js/client.py") and fn.endswith(".publish")
        or "libs/common/bus/" in f and fn.rsplit(".", 1)[-1].startswith("publish")),
    ("acks", lambda fn, f: f.endswith("nats/aio/msg.py") and fn.rsplit(".", 1)[-1] in (
        "ack", "ack_sync", "nak", "term", "in_progress", "_check_reply")),
    ("fetches (pull)", lambda fn, f: f.endswith("nats/js/client.py") and "fetch" in fn
        or "libs/common/bus/" in f and ("fetch" in fn or "Puller" in fn)),
    ("KV reads/watches", lambda fn, f: f.endswith("nats/js/kv.py")),
    ("log files / logging", lambda fn, f: "local_logs" in f or f.startswith("logging/") or "/logging/" in f),
    ("YAML parse", lambda fn, f: f.startswith("yaml/") or "/yaml/" in f),
    ("protocol validation/rendering", lambda fn, f: "libs/common/protocol" in f),
    ("core decision", lambda fn, f: f.startswith("services/") and "/core/" in f),
    ("messages encode/decode", lambda fn, f: "libs/common/messages" in f or "libs/common/records" in f
        or "msgspec" in f),
    ("metrics / tracing", lambda fn, f: "prometheus_client" in f or "opentelemetry" in f or "trace/" in f
        or "libs/common/telemetry" in f or f.endswith("/metrics.py")),
    ("HTTP server (aiohttp)", lambda fn, f: f.startswith("aiohttp/") or "/aiohttp/" in f),
    # What the NATS client does for all of the above at once, so not attributable to one.
    ("NATS client: socket writes (flusher)", lambda fn, f: fn == "Client._flusher" and f.endswith("nats/aio/client.py")),
    ("NATS client: reading, parsing, dispatching", lambda fn, f: f.endswith("nats/protocol/parser.py")
        or f.endswith("nats/aio/client.py") and fn in ("Client._read_loop", "Client._process_msg")
        or f.endswith("nats/aio/subscription.py")),
]


def own_frames(frames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The frames below the event loop's dispatch (or all, in a process without one)."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i] in LOOP_FRAMES:
            return frames[i + 1:]
    return frames


def parse_frame(frame: str) -> tuple[str, str]:
    """'function (file)' -> (function, file)."""
    if frame.endswith(")") and " (" in frame:
        fn, _, rest = frame.rpartition(" (")
        return fn, rest[:-1]
    return frame, ""


def read_raw(path: Path) -> list[tuple[list[tuple[str, str]], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks.append(([parse_frame(f) for f in stack.split(";")], int(count)))
    return stacks


def step_of(frames: list[tuple[str, str]]) -> str:
    """The first STEPS rule matching a frame; else the innermost frame of PAI's
    code ("code: <file>"); else the package of the innermost frame ("other: ...",
    e.g. asyncio's own work between tasks, the NATS client's reading)."""
    mine = own_frames(frames)
    for step, matches in STEPS:
        if any(matches(fn, f) for fn, f in mine):  # type: ignore[operator]
            return step
    for _fn, f in reversed(mine):
        if f.startswith(("services/", "libs/")):
            return f"code: {f}"
    fn, f = frames[-1] if frames else ("?", "?")
    package = f.split("/", 1)[0] if "/" in f else f
    return f"other: {package or fn}"


def summarise_raw(path: Path) -> dict:
    stacks = read_raw(path)
    total = sum(count for frames, count in stacks if not (frames and frames[-1] in IDLE_LEAVES))
    steps: dict[str, int] = {}
    own: dict[str, int] = {}
    idle = 0
    for frames, count in stacks:
        if frames and frames[-1] in IDLE_LEAVES:
            idle += count
            continue
        step = step_of(frames)
        steps[step] = steps.get(step, 0) + count
        fn, f = frames[-1] if frames else ("?", "?")
        own[f"{fn} ({f})"] = own.get(f"{fn} ({f})", 0) + count

    def table(counts: dict[str, int], limit: int | None) -> list[dict]:
        rows = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
        return [{"name": name, "samples": n, "percent": round(100 * n / max(1, total), 1)} for name, n in rows]

    return {"samples": total, "idle_samples_left_out": idle, "by_step": table(steps, None), "top_own_time": table(own, TOP)}


def as_text(summary: dict[str, dict]) -> str:
    lines = []
    for service, got in summary.items():
        if "error" in got:
            lines.append(f"== {service}: {got['error']}")
            continue
        lines.append(f"== {service}: {got['samples']} samples working ({got['idle_samples_left_out']} idle left out)")
        lines.append("  by step:")
        lines += [f"    {row['percent']:5.1f}%  {row['name']}" for row in got["by_step"]]
        lines.append(f"  top {TOP} functions by own time:")
        lines += [f"    {row['percent']:5.1f}%  {row['name']}" for row in got["top_own_time"]]
    return "\n".join(lines) + "\n"


class Profiler:
    def __init__(self, out_dir: Path, label: str):
        self.out_dir = out_dir
        self.label = label
        self.spies: dict[str, tuple[subprocess.Popen, Path]] = {}

    @classmethod
    def start(cls, pids: dict[str, int], out_dir: Path, label: str, rate: int = 200) -> Profiler:
        profiler = cls(Path(out_dir), label)
        profiler.out_dir.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).parent / "py-spy"
        for name, pid in pids.items():
            if name in PYTHON_PROCESSES_EXCLUDED:
                continue
            raw = profiler.out_dir / f"{label}-{name}.raw.txt"
            proc = subprocess.Popen([str(spy) if spy.exists() else "py-spy", "record", "--pid", str(pid),
                                     "--format", "raw", "--nolineno", "--rate", str(rate), "--output", str(raw)],
                                    stdout=subprocess.DEVNULL, stderr=open(profiler.out_dir / f"{label}-{name}.log", "wb"))
            profiler.spies[name] = (proc, raw)
        time.sleep(1.0)  # attached before the phase starts
        return profiler

    def stop(self) -> None:
        for proc, _ in self.spies.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _ in self.spies.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def summarise(self) -> dict:
        summary: dict[str, dict] = {}
        for name, (_, raw) in self.spies.items():
            try:
                summary[name] = summarise_raw(raw)
            except OSError as exc:
                summary[name] = {"error": f"no recording: {exc}"}
        (self.out_dir / f"{self.label}.json").write_text(json.dumps(summary, indent=2))
        (self.out_dir / f"{self.label}.txt").write_text(as_text(summary))
        return {name: {"samples": got.get("samples"), "by_step": got.get("by_step", [])[:8],
                       "top_own_time": got.get("top_own_time", [])[:5]} for name, got in summary.items()}


if __name__ == "__main__":
    print(as_text({os.path.basename(p): summarise_raw(Path(p)) for p in sys.argv[1:]}), end="")
