"""Each chaos test gets a platform of its own: it kills parts of it, and a shared one
would carry one test's damage into the next."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import start_platform, stop_platform


@pytest.fixture
async def platform(tmp_path):
    api = await start_platform(tmp_path / "pai")
    try:
        yield api
    finally:
        await stop_platform(api)


@pytest.fixture
def starts_dir(tmp_path):
    """Where the tasks of a test write their start logs."""
    path = tmp_path / "starts"
    path.mkdir()
    # Tasks run as an unprivileged user: the directory must take their writes
    # (and the test's tmp_path above it must let them through).
    path.chmod(0o1777)
    for parent in (tmp_path, *tmp_path.parents):
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    return path
