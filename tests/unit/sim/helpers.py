"""Paths for the simulator tests: our own fixture traces, and the real traces when present."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
CLUSTERS = Path(__file__).resolve().parents[2] / "fixtures" / "clusters"
SHARED_TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces"


def real_trace(name: str) -> Path:
    """A file of the published cluster traces; skips the test when they are not here (a fresh clone)."""
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"reference files not present: {path}")
    return path
