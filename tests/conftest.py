"""Fixtures shared by every test tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.common.natsserver import NatsServer

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A file of the team's reference material; the test skips when it is absent
    (a fresh clone has no ../shared)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference files not present: {path}")
    return path


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory):
    """A real nats-server with JetStream, one per test session, on a free port."""
    with NatsServer(tmp_path_factory.mktemp("nats")) as srv:
        yield srv
