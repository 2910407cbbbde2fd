"""A single-active service's lease renewal (libs/common/service.hold_leadership)
through what NATS answers while it restarts or fails over."""

from __future__ import annotations

import asyncio
import types

import nats.errors
import nats.js.errors
import pytest

from libs.common import service


class FlakyLeases:
    """The lease bucket, whose updates first fail with `failures`, one each."""

    def __init__(self, failures: list[Exception]):
        self.failures = failures
        self.revision = 0
        self.renewed = 0

    async def create(self, key: str, value: bytes) -> int:
        self.revision += 1
        return self.revision

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if self.failures:
            raise self.failures.pop(0)
        assert last == self.revision
        self.revision += 1
        self.renewed += 1
        return self.revision


async def _lead(leases: FlakyLeases) -> asyncio.Task:
    spawned: list[asyncio.Task] = []

    async def kv(_bucket):
        return leases

    ctx = types.SimpleNamespace(
        name="scheduler", config=types.SimpleNamespace(replica="node-a"), standby=False,
        stopping=asyncio.Event(), bus=types.SimpleNamespace(kv=kv),
        spawn=lambda coro, _name: spawned.append(asyncio.ensure_future(coro)),
    )
    await service.hold_leadership(ctx)
    return spawned[0]


@pytest.fixture
def short_lease(monkeypatch):
    # A lease of 0.6 s, renewed every 0.2 s, each try bounded by 0.1 s, retried after 0.05 s.
    monkeypatch.setattr(service, "LEASE_SECONDS", 0.6)
    monkeypatch.setattr(service, "LEASE_RENEWAL_TIMEOUT", 0.1)
    monkeypatch.setattr(service, "LEASE_RETRY_SECONDS", 0.05)


@pytest.mark.parametrize(
    "trouble",
    [
        nats.js.errors.NoStreamResponseError(),  # a restarted server not yet answering for the bucket
        nats.js.errors.ServiceUnavailableError(),
        nats.errors.NoRespondersError(),
        nats.errors.TimeoutError(),
        TimeoutError(),  # our own bound on a try (asyncio.wait_for)
    ],
    ids=lambda error: type(error).__name__,
)
async def test_a_renewal_that_meets_nats_restarting_is_retried_and_the_lease_kept(short_lease, trouble):
    leases = FlakyLeases([trouble, trouble])
    renewing = await _lead(leases)
    await asyncio.sleep(1.0)
    assert not renewing.done(), renewing  # still the leader, still renewing
    assert leases.renewed >= 2
    renewing.cancel()


async def test_trouble_that_outlasts_the_lease_stops_the_service(short_lease):
    # Past the lease a standby may take it: the service must not go on as leader.
    leases = FlakyLeases([nats.js.errors.NoStreamResponseError() for _ in range(100)])
    renewing = await _lead(leases)
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await asyncio.wait_for(renewing, timeout=3)
