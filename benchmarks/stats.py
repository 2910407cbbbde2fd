"""Figures the benchmark scripts share."""

from __future__ import annotations

import os
import platform
import re
import sys
import time


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile `q` (0..100) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def python_loop_seconds(iterations: int = 5_000_000, tries: int = 3) -> float:
    """CPU seconds a fixed loop of Python additions takes here, the fastest of
    `tries`: a yardstick for figures taken at different times. On a shared
    virtual machine the same code's CPU per job moves with it by a third or
    more from one hour to the next."""
    best = float("inf")
    for _ in range(tries):
        started = time.process_time()
        total = 0
        for number in range(iterations):
            total += number
        best = min(best, time.process_time() - started)
    return round(best, 3)


def interpreter() -> dict[str, object]:
    """The Python the benchmark (and the platform it starts, which runs on the
    same interpreter) uses. Its build moves every service's CPU by 5-10%: a
    distribution's CPython is built with profile-guided optimisation and LTO and
    links libpython into its executable, a version manager's default build does
    neither (docs/throughput.md, "The interpreter"). `libpython_shared`: whether
    libpython was loaded as a shared library, as it is in such a build."""
    with open("/proc/self/maps") as maps:
        shared = any("libpython" in line for line in maps)
    return {"executable": os.path.realpath(sys.executable), "version": platform.python_version(),
            "libpython_shared": shared}


def filesystem_of(path: str) -> dict[str, object]:
    """The filesystem `path` lies on, as /proc/self/mountinfo tells it: its mount
    point, type and source, and for ext3/ext4 whether it has a journal.

    The throughput benchmarks quote it beside their figures: a task creates
    files in the data dir, and an ext4 without a journal (the root filesystem of
    the machines PAI is developed on) steps over every inode deleted there in the last
    minutes on each creation, which a journaled ext4 or tmpfs never does
    (docs/throughput.md)."""
    real = os.path.realpath(path)
    device = os.stat(real).st_dev
    wanted = f"{os.major(device)}:{os.minor(device)}"
    found: dict[str, object] = {"path": real}
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            # id parent major:minor root mount-point options [optional...] - type source super-options
            mount_point = _unescape(fields[4])
            if fields[2] != wanted or not _within(real, mount_point):
                continue
            rest = fields[fields.index("-") + 1 :]
            if len(str(found.get("mount_point", ""))) <= len(mount_point):
                found.update(mount_point=mount_point, type=rest[0], source=_unescape(rest[1]))
    if found.get("type") in ("ext3", "ext4"):
        # jbd2 names a journal after the kernel's name of the device (dm-0, not /dev/mapper/...).
        kernel_name = f"/sys/dev/block/{wanted}"
        name = os.path.basename(os.path.realpath(kernel_name) if os.path.exists(kernel_name) else str(found["source"]))
        journals = os.listdir("/proc/fs/jbd2") if os.path.isdir("/proc/fs/jbd2") else []
        found["journal"] = any(entry.startswith(f"{name}-") for entry in journals)
    return found


def _within(path: str, mount_point: str) -> bool:
    """Whether `path` is `mount_point` or below it, by whole components."""
    top = mount_point.rstrip("/")
    return not top or path == top or path.startswith(top + "/")


def _unescape(field: str) -> str:
    """A mountinfo field as the path it names: the kernel writes a space, tab,
    newline or backslash in it as a three-digit octal escape (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda escape: chr(int(escape.group(1), 8)), field)
