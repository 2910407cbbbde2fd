"""The index's unsettled keys: every changed job is laid over the list, and the settling
compares only those unchanged for a while, oldest change first."""

from __future__ import annotations

from services.rest import job_index
from services.rest.job_index import Unsettled


def test_only_keys_quiet_long_enough_are_offered_oldest_change_first(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(job_index.time, "monotonic", lambda: now[0])
    unsettled = Unsettled()
    unsettled.add("alice.a")
    now[0] = 100.5
    unsettled.add("bob.b")
    now[0] = 101.0
    unsettled.add("carol.c")
    now[0] = 101.2
    unsettled.add("alice.a")  # changed again: newest now
    now[0] = 102.0
    assert unsettled.quiet(1.0) == ["bob.b", "carol.c"]
    assert unsettled.quiet(0.0) == ["bob.b", "carol.c", "alice.a"]
    assert set(unsettled) == {"alice.a", "bob.b", "carol.c"}  # the list overlays all of them
    assert "alice.a" in unsettled and len(unsettled) == 3
    unsettled.discard("bob.b")
    unsettled.discard("nobody.x")
    assert unsettled.quiet(0.9) == ["carol.c"]
