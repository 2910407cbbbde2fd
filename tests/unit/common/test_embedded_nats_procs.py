"""How many threads `pai up`'s own nats-server may run Go code on (GOMAXPROCS)."""

from __future__ import annotations

import os

import pytest

from libs.common.natsserver import embedded_max_procs


@pytest.mark.parametrize(
    ("cores", "configured", "expected"),
    [
        ({0}, 0, 1),  # one core: never none
        ({0, 1}, 0, 1),  # two: one for it, one for the services and tasks
        (set(range(8)), 0, 4),
        (set(range(7)), 0, 3),
        ({0, 1}, 3, 3),  # an admin's choice stands, even past the machine's half
        ({0, 1}, -1, 1),  # anything below one means "choose"
    ],
)
def test_half_the_cores_it_may_run_on_unless_configured(monkeypatch, cores, configured, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cores)
    assert embedded_max_procs(configured) == expected
