"""Each chaos test gets a platform of its own: it kills parts of it, and a shared one
would carry one test's damage into the next."""

from __future__ import annotations

import pytest

from tests.chaos.harness import start_platform, stop_platform, task_writable_dir


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
    return task_writable_dir(tmp_path / "starts")
