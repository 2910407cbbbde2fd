"""rest hashes passwords at the argon2id cost its config sets; hashes already stored keep
the cost they carry and still verify; a cost argon2 cannot take is refused by name."""

from __future__ import annotations

import pytest

from libs.common.errors import BadInput
from services.rest.identity import store


@pytest.fixture(autouse=True)
def _cost_restored():
    before = (store._hasher.time_cost, store._hasher.memory_cost)
    yield
    store.configure_hashing(*before)


async def test_new_hashes_take_the_configured_cost_and_old_ones_still_verify():
    store.configure_hashing(2, 2048)
    older = await store.hash_password("correct horse")
    assert older.startswith("$argon2id$v=19$m=2048,t=2,")
    store.configure_hashing(1, 1024)
    newer = await store.hash_password("correct horse")
    assert newer.startswith("$argon2id$v=19$m=1024,t=1,")
    assert await store.password_matches(older, "correct horse")
    assert not await store.password_matches(older, "wrong horse")
    await store.spend_password_check("a guess")  # what an unknown name is checked against
    assert store._DUMMY_HASH.startswith("$argon2id$v=19$m=1024,t=1,")  # ... costs the same


@pytest.mark.parametrize(("time_cost", "memory_kib", "named"), [(0, 1024, "password_hash_time_cost"),
                                                                (1, 16, "password_hash_memory_kib")])
def test_a_cost_argon2_cannot_take_is_refused_by_name(time_cost, memory_kib, named):
    with pytest.raises(BadInput, match=named):
        store.configure_hashing(time_cost, memory_kib)
