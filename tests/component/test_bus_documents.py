"""The admin-editable document store (libs/common/documents.py) on a real NATS: the
runtime's failure rules and the monitor's alert rules are two of them. Reads,
compare-and-set writes, edits that lose a race, the watch, and the commands'
request/reply, each as a table where there are several cases."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import nats.js.errors
import pytest

from libs.common import documents
from libs.common.document_messages import Outcome, Problem, raise_for_outcome
from libs.common.errors import BadInput, Conflict, NotFound, PaiError, Transient
from libs.common.subjects import Bucket
from tests.conftest import platform_bus

# Every test on both of the bus's clients (tests/conftest.py: bus_client).
pytestmark = pytest.mark.usefixtures("bus_client")


class Doc(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    by: str = ""


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    message: str = ""
    text: str = ""


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    action: str
    text: str = ""


@pytest.fixture
async def bus(nats_server):
    async with platform_bus(nats_server) as b:
        yield b


@pytest.fixture
async def store(bus) -> documents.DocumentStore[Doc]:
    return documents.DocumentStore(await bus.kv(Bucket.RULES), f"doc-{uuid.uuid4().hex[:8]}", Doc)


async def test_a_key_never_written_reads_as_nothing_at_revision_0(store):
    assert await store.read() == documents.Snapshot(value=None, revision=0)


async def test_writes_are_compare_and_set_on_the_revision_read(store):
    first = await store.write(Doc(text="a"), last=0)
    second = await store.write(Doc(text="b", by="ops"), last=first)

    with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
        await store.write(Doc(text="lost"), last=first)  # planned on what "b" replaced
    with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
        await store.write(Doc(text="lost"), last=0)  # "never written": it was

    assert await store.read() == documents.Snapshot(value=Doc(text="b", by="ops"), revision=second)


@pytest.mark.parametrize("stored", [b"{not json", b'{"text": 5}', b'{"by": "no text"}'],
                         ids=["not-json", "wrong-type", "missing-field"])
async def test_a_value_that_is_not_the_type_reads_as_nothing_at_its_revision(store, stored):
    revision = await store.kv.put(store.key, stored)
    assert await store.read() == documents.Snapshot(value=None, revision=revision)


async def test_a_bytes_store_hands_the_value_as_stored(bus):
    raw = documents.DocumentStore(await bus.kv(Bucket.RULES), f"raw-{uuid.uuid4().hex[:8]}", bytes)
    revision = await raw.write(b"{not json", last=0)
    assert await raw.read() == documents.Snapshot(value=b"{not json", revision=revision)


# --- edit: read, plan, write on the revision read ------------------------------------------

# (how many writers sneak in before the edit's write, attempts) -> what the edit returns
EDIT_RACES = [
    (0, 1, "written"),
    (1, 1, None),  # lost its only race: the caller answers "stale"
    (2, 3, "written"),  # planned again on top of each winner, third time lucky
    (3, 3, None),  # lost every race: the caller answers "busy"
]


@pytest.mark.parametrize(("intruders", "attempts", "expected"), EDIT_RACES)
async def test_an_edit_that_loses_a_race_is_planned_again_on_the_winners_value(store, intruders, attempts, expected):
    await store.write(Doc(text="start"), last=0)
    seen: list[str] = []
    sneaking = [intruders]

    def plan(snapshot: documents.Snapshot[Doc]) -> documents.Write[Doc, str]:
        assert snapshot.value is not None
        seen.append(snapshot.value.text)
        return documents.Write(Doc(text=snapshot.value.text + "+edit"), snapshot.value.text)

    real_write = store.write

    async def write(value: Doc, *, last: int) -> int:  # another replica writes just before us
        if sneaking[0]:
            sneaking[0] -= 1
            await real_write(Doc(text=f"winner{intruders - sneaking[0]}"), last=last)
        return await real_write(value, last=last)

    store.write = write
    done = await store.edit(plan, attempts=attempts)

    now = await store.read()
    if expected is None:
        assert done is None
        assert now.value == Doc(text=f"winner{min(intruders, attempts)}")
    else:
        based_on, revision = done
        assert based_on == (f"winner{intruders}" if intruders else "start")
        assert now == documents.Snapshot(value=Doc(text=based_on + "+edit"), revision=revision)
    assert seen == ["start", *(f"winner{n}" for n in range(1, min(intruders, attempts - 1) + 1))]


async def test_an_edit_whose_plan_answers_writes_nothing(store):
    revision = await store.write(Doc(text="start"), last=0)
    refused = Reply(outcome=Outcome.STALE, message="changed since")

    assert await store.edit(lambda snapshot: refused) is refused
    assert (await store.read()).revision == revision


# --- follow: the value now, then every change ------------------------------------------------


async def test_follow_hands_the_value_now_then_each_change_and_a_delete_as_nothing(bus, store):
    first = await store.write(Doc(text="one"), last=0)
    seen: list[documents.Snapshot[Doc]] = []
    stopping = asyncio.Event()
    following = asyncio.create_task(store.follow(bus, stopping, seen.append))
    try:
        await _until(lambda: len(seen) == 1)
        # Each change is waited for before the next: a watch started again (a reconnect,
        # or the NATS client restarting its consumer under load) hands the value now, so a
        # change the next one overtook meanwhile may not come, but the newest always does.
        second = await store.write(Doc(text="two"), last=first)
        await _until(lambda: any(snapshot.revision >= second for snapshot in seen))
        third = await store.kv.put(store.key, b"garbage")
        await _until(lambda: any(snapshot.revision >= third for snapshot in seen))
        await store.kv.delete(store.key)
        await _until(lambda: any(snapshot.revision > third for snapshot in seen))
    finally:
        stopping.set()
        await asyncio.wait_for(following, 10)
    # A watch started again hands the value now once more: each revision is counted once,
    # in the order it first came.
    revisions = list({snapshot.revision: snapshot for snapshot in seen}.values())
    assert [snapshot.revision for snapshot in revisions] == sorted(snapshot.revision for snapshot in revisions)
    assert revisions[:3] == [documents.Snapshot(value=Doc(text="one"), revision=first),
                             documents.Snapshot(value=Doc(text="two"), revision=second),
                             documents.Snapshot(value=None, revision=third)]
    assert len(revisions) == 4 and revisions[3].value is None and revisions[3].revision > third


# --- the commands over request/reply --------------------------------------------------------


async def test_commands_are_answered_and_what_goes_wrong_is_an_answer(bus):
    subject = f"pai.rpc.v1.doctest{uuid.uuid4().hex[:6]}"

    async def handle(request: Ask) -> Reply:
        if request.action == "away":
            raise Transient("NATS restarting")
        return Reply(outcome=Outcome.OK, text=request.text.upper())

    answer = documents.answering(Ask, handle, Reply, what="a test", store="test store")
    subscription = await documents.subscribe(bus, subject, "testers")
    serving = asyncio.create_task(documents.serve(subscription, answer))
    try:
        ok = await documents.ask(bus, subject, Ask(action="echo", text="hi"), Reply, who="tester")
        away = await documents.ask(bus, subject, Ask(action="away"), Reply, who="tester")
        garbled = msgspec.json.decode((await bus.nc.request(subject, b"[1, 2]", timeout=5)).data, type=Reply)
    finally:
        serving.cancel()
    assert ok == Reply(outcome=Outcome.OK, text="HI")
    assert away.outcome is Outcome.UNAVAILABLE and "the test store is not reachable" in away.message
    assert garbled.outcome is Outcome.INVALID and garbled.message.startswith("not a test request")

    with pytest.raises(Transient, match="the tester did not answer"):
        await documents.ask(bus, subject + "nobody", Ask(action="echo"), Reply, who="tester", timeout=1)


class Stale(PaiError):
    status = 412
    code = "PreconditionFailed"


# outcome -> (error raised, HTTP status)
OUTCOME_ERRORS = [
    (Outcome.INVALID, BadInput, 400),
    (Outcome.NOT_FOUND, NotFound, 404),
    (Outcome.STALE, Stale, 412),
    (Outcome.BUSY, Conflict, 409),
    (Outcome.UNAVAILABLE, Transient, Transient.status),
]


@pytest.mark.parametrize(("outcome", "error", "status"), OUTCOME_ERRORS, ids=[o[0].value for o in OUTCOME_ERRORS])
def test_each_refusal_is_the_matching_http_error(outcome, error, status):
    problems = [Problem(path="rules[0].threshold", message="must be a number")]
    with pytest.raises(error) as raised:
        raise_for_outcome(outcome, "refused", problems, invalid_rule="invalid_thing", stale=Stale)
    assert raised.value.status == status and raised.value.message == "refused"
    if outcome is Outcome.INVALID:
        assert raised.value.details == {"errors": [
            {"path": "rules[0].threshold", "rule": "invalid_thing", "message": "must be a number"}]}
    raise_for_outcome(Outcome.OK, "", [], invalid_rule="invalid_thing", stale=Stale)  # nothing


async def _until(check, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("never happened")
