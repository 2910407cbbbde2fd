"""The runtime as users run it (`python -m services.runtime`) against a real
nats-server: task exits in, verdicts out, and failure rules changed at run time
over `pai.rpc.v1.rules` without a restart.

The stream, the durable consumer and the `pai_rules` bucket are shared with the
rest of the session, so every test resets the rules first and uses job and VC
names of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from libs.common.bus import Bus
from libs.common.errors import BadInput
from libs.common.messages import TaskExited, TaskVerdict
from libs.common.natsserver import NatsServer, free_port
from libs.common.rules_rpc import (
    NoSuchRule,
    RuleAction,
    RuleSource,
    RulesReply,
    RulesRequest,
    StaleRules,
    request_rules,
)
from libs.common.subjects import Bucket
from services.runtime.core import Rule, RuleEngine, RuleError, default_rules
from services.runtime.core.edits import add_rule, change_rule, delete_rule, index_of, to_stored
from services.runtime.store import RuleStore

REPO = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:6]
VC = f"vc{RUN}"
WAIT_SECONDS = 20.0
_exit_numbers = itertools.count()


class Runtime:
    """One `python -m services.runtime` process, restartable."""

    def __init__(self, nats: NatsServer, data_dir: Path):
        self.nats = nats
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        port = free_port()
        env = {
            **os.environ,
            "PAI_NATS_URL": self.nats.url,
            **self.nats.env("runtime"),  # logs in as the runtime, allowed only what it owns
            "PAI_RUNTIME_PORT": str(port),
            "PAI_DATA_DIR": str(self.data_dir),
        }
        command = [sys.executable, "-m", "services.runtime"]
        self.proc = await asyncio.to_thread(subprocess.Popen, command, cwd=REPO, env=env)
        await _wait_ready(self.proc, port)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    async def restart(self) -> None:
        self.stop()
        await self.start()


@contextlib.asynccontextmanager
async def runtime_process(nats: NatsServer, data_dir: Path) -> AsyncIterator[Runtime]:
    runtime = Runtime(nats, data_dir)
    try:
        await runtime.start()
        yield runtime
    finally:
        runtime.stop()


async def _wait_ready(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the runtime exited at start"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    pytest.fail("the runtime never became ready")


class Verdicts:
    """Every verdict on this run's VC, by job."""

    def __init__(self) -> None:
        self.by_job: dict[str, TaskVerdict] = {}

    async def receive(self, msg) -> None:
        verdict = msgspec.json.decode(msg.data, type=TaskVerdict)
        self.by_job[verdict.job] = verdict

    async def wait_for(self, job: str) -> TaskVerdict:
        deadline = time.monotonic() + WAIT_SECONDS
        while job not in self.by_job:
            if time.monotonic() > deadline:
                pytest.fail(f"no verdict for {job}")
            await asyncio.sleep(0.02)
        return self.by_job[job]


@pytest.fixture(scope="module")
async def bus(nats_server) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_server.url, name="runtime-test", **nats_server.login("platform"))
    await b.bootstrap()
    yield b
    await b.close()


@pytest.fixture(scope="module")
async def runtime_service(nats_server, bus, tmp_path_factory) -> AsyncIterator[Runtime]:
    """One runtime for the module (starting one takes a second or two)."""
    async with runtime_process(nats_server, tmp_path_factory.mktemp("runtime")) as r:
        yield r


@pytest.fixture
async def runtime(bus, runtime_service) -> Runtime:
    """The runtime, with the rules PAI starts with."""
    await ask(bus, RuleAction.RESET)
    return runtime_service


@pytest.fixture
async def verdicts(bus) -> AsyncIterator[Verdicts]:
    collected = Verdicts()
    sub = await bus.nc.subscribe(f"pai.v1.task.verdict.{VC}.>", cb=collected.receive)
    yield collected
    await sub.unsubscribe()


async def ask(bus: Bus, action: RuleAction, **fields) -> RulesReply:
    return await request_rules(bus, RulesRequest(action=action, by="ops", **fields))


async def classify(bus: Bus, verdicts: Verdicts, log: str, *, exit_code: int = 1) -> TaskVerdict:
    """Publish one task exit and wait for the runtime's verdict on it."""
    job = f"alice~rules{RUN}n{next(_exit_numbers)}"
    await bus.publish(
        TaskExited(id=f"{job}/1/main/0/0/exited", job=job, vc=VC, attempt=1, role="main", index=0,
                   exitCode=exit_code, userLogTail=log)
    )
    return await verdicts.wait_for(job)


def marker_rule(code: int, phrase: str, marker: str, *, reaction: str = "NEVER_RETRY") -> dict:
    return {
        "code": code,
        "phrase": phrase,
        "type": "USER_FAILURE",
        "reaction": reaction,
        "reason": f"the job printed {marker}",
        "pattern": {"runtimeContainerPatterns": [{"userLogRegex": marker}]},
    }


def codes(reply: RulesReply) -> list[int]:
    return [rule["code"] for rule in reply.rules]


# --- rule changes reach the next exit --------------------------------------------


async def test_added_rule_explains_the_next_exit_without_a_restart(bus, runtime, verdicts):
    pid = runtime.proc.pid
    marker = f"DATASET-GONE-{RUN}"
    before = await classify(bus, verdicts, f"loading\n{marker}\n")
    assert (before.spec.code, before.spec.phrase) == (255, "PAIRuntimeUnknownFailed")

    added = await ask(bus, RuleAction.ADD, rule=marker_rule(211, "DatasetGone", marker))

    after = await classify(bus, verdicts, f"loading\n{marker}\n")
    assert (after.spec.code, after.spec.phrase, after.spec.reaction) == (211, "DatasetGone", "NEVER_RETRY")
    assert after.diagnostics == [marker]
    assert added.source == RuleSource.ADMIN and added.revision > 0
    assert runtime.proc.pid == pid and runtime.proc.poll() is None  # the same process, never restarted


async def test_changed_rule_and_reset_apply_to_the_next_exit(bus, runtime, verdicts):
    marker = f"FLAKY-STORAGE-{RUN}"
    await ask(bus, RuleAction.ADD, rule=marker_rule(212, "FlakyStorage", marker))
    changed = await ask(bus, RuleAction.CHANGE, code=212,
                        rule=marker_rule(212, "FlakyStorage", marker, reaction="ALWAYS_RETRY"))
    assert changed.rules[0]["reaction"] == "ALWAYS_RETRY"
    assert (await classify(bus, verdicts, marker)).spec.reaction == "ALWAYS_RETRY"

    reset = await ask(bus, RuleAction.RESET)

    assert reset.source == RuleSource.DEFAULTS
    assert (await classify(bus, verdicts, marker)).spec.code == 255
    with pytest.raises(NoSuchRule):
        await ask(bus, RuleAction.GET, code=212)


async def test_deleted_rule_no_longer_matches(bus, runtime, verdicts):
    assert (await classify(bus, verdicts, "", exit_code=137)).spec.phrase == "ContainerSigKillReceived"

    deleted = await ask(bus, RuleAction.DELETE, code=137)

    assert deleted.rules[0]["phrase"] == "ContainerSigKillReceived"
    assert (await classify(bus, verdicts, "", exit_code=137)).spec.phrase == "PAIRuntimeUnknownFailed"
    assert 137 not in codes(await ask(bus, RuleAction.LIST))


async def test_rule_stored_by_another_replica_is_taken_up(bus, runtime, verdicts):
    """Another replica writes the bucket; this one follows without being asked."""
    marker = f"QUOTA-EXCEEDED-{RUN}"
    store = RuleStore(await bus.kv(Bucket.RULES))
    current = await store.read()
    listed = await ask(bus, RuleAction.LIST)
    rules = [msgspec.convert(marker_rule(213, "QuotaExceeded", marker), Rule)] + [
        msgspec.convert(rule, Rule) for rule in listed.rules
    ]

    await store.write(msgspec.json.encode(to_stored(rules, by="replica-b", at=time.time())), last=current.revision)

    # The change reaches this replica through its KV watch, a moment later:
    # exits classified meanwhile may still get the old verdict.
    for _ in range(40):
        verdict = await classify(bus, verdicts, marker)
        if verdict.spec.code == 213:
            break
        await asyncio.sleep(0.25)
    assert (verdict.spec.code, verdict.spec.phrase) == (213, "QuotaExceeded")


async def test_unreadable_stored_rules_are_ignored_until_a_reset_repairs_them(bus, runtime, verdicts):
    """Someone wrote the bucket by hand: classifying goes on with the rules in effect."""
    await (await bus.kv(Bucket.RULES)).put("rules", b"{not json")

    assert (await classify(bus, verdicts, "", exit_code=137)).spec.phrase == "ContainerSigKillReceived"
    with pytest.raises(BadInput) as refused:
        await ask(bus, RuleAction.LIST)
    assert "not readable" in refused.value.message

    await ask(bus, RuleAction.RESET)
    assert 137 in codes(await ask(bus, RuleAction.LIST))


async def test_rules_outlive_a_restart_of_the_runtime(bus, runtime, verdicts):
    marker = f"LICENSE-EXPIRED-{RUN}"
    await ask(bus, RuleAction.ADD, rule=marker_rule(214, "LicenseExpired", marker))

    await runtime.restart()

    verdict = await classify(bus, verdicts, marker)
    listed = await ask(bus, RuleAction.LIST)

    assert verdict.spec.phrase == "LicenseExpired"
    assert 214 in codes(listed) and listed.changedBy == "ops"


# --- order ------------------------------------------------------------------------


async def test_new_rule_goes_before_the_catch_all_rules_by_default(bus, runtime):
    await ask(bus, RuleAction.ADD, rule=marker_rule(215, "PlacedByDefault", f"DEFAULT-{RUN}"))
    order = codes(await ask(bus, RuleAction.LIST))
    assert order.index(215) == order.index(255) - 1


@pytest.mark.parametrize(
    ("placement", "expected_next"),
    [({"before": 137}, 137), ({"position": 0}, 0)],
    ids=["before-a-code", "at-a-position"],
)
async def test_admin_chooses_where_a_rule_goes(bus, runtime, placement, expected_next):
    added = await ask(bus, RuleAction.ADD, rule=marker_rule(216, "PlacedByAdmin", f"PLACED-{RUN}"), **placement)
    order = codes(await ask(bus, RuleAction.LIST))
    assert order[added.position] == 216
    assert order[added.position + 1] == expected_next


async def test_earlier_rule_wins_when_two_match(bus, runtime, verdicts):
    """A log rule placed before the bare exit-code rule explains a SIGKILL."""
    marker = f"WATCHDOG-KILL-{RUN}"
    await ask(bus, RuleAction.ADD, rule=marker_rule(217, "WatchdogKill", marker), before=137)
    verdict = await classify(bus, verdicts, f"step 12\n{marker}\n", exit_code=137)
    assert verdict.spec.phrase == "WatchdogKill"


# --- refused changes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "path"),
    [
        (marker_rule(218, "Nested", "(a+)+$"), "pattern.runtimeContainerPatterns[0].userLogRegex"),
        (marker_rule(218, "Backref", r"(a)\1"), "pattern.runtimeContainerPatterns[0].userLogRegex"),
        (marker_rule(218, "Unclosed", "oops("), "pattern.runtimeContainerPatterns[0].userLogRegex"),
        (marker_rule(137, "CodeTaken", "x"), "code"),
        (marker_rule(218, "ContainerSigKillReceived", "x"), "phrase"),
        (marker_rule(218, "BadReaction", "x", reaction="SOMETIMES"), "reaction"),
        ({"code": 218, "phrase": "MatchesAll", "pattern": {"runtimeContainerPatterns": [{}]}},
         "pattern.runtimeContainerPatterns[0]"),
        ({"phrase": "NoCode"}, "code"),
    ],
    ids=["nested-quantifier", "backreference", "unbalanced-paren", "duplicate-code", "duplicate-phrase",
         "unknown-reaction", "empty-pattern", "missing-code"],
)
async def test_invalid_rule_is_refused_naming_the_field_and_changes_nothing(bus, runtime, rule, path):
    before = await ask(bus, RuleAction.LIST)
    with pytest.raises(BadInput) as refused:
        await ask(bus, RuleAction.ADD, rule=rule)
    assert path in [error["path"] for error in refused.value.details["errors"]]
    after = await ask(bus, RuleAction.LIST)
    assert (after.revision, after.rules) == (before.revision, before.rules)


@pytest.mark.parametrize(
    ("fields", "path"),
    [({"before": 99}, "before"), ({"position": 10_000}, "position"), ({"position": 0, "before": 137}, "position")],
    ids=["before-unknown-code", "position-out-of-range", "position-and-before"],
)
async def test_impossible_placement_is_refused(bus, runtime, fields, path):
    with pytest.raises(BadInput) as refused:
        await ask(bus, RuleAction.ADD, rule=marker_rule(219, "Misplaced", "x"), **fields)
    assert [error["path"] for error in refused.value.details["errors"]] == [path]


async def test_change_based_on_an_old_revision_is_refused(bus, runtime):
    seen = await ask(bus, RuleAction.LIST)
    await ask(bus, RuleAction.ADD, rule=marker_rule(203, "SomeoneElse", f"ELSE-{RUN}"))
    with pytest.raises(StaleRules):
        await ask(bus, RuleAction.DELETE, code=137, revision=seen.revision)
    assert 137 in codes(await ask(bus, RuleAction.LIST))


# --- replicas ---------------------------------------------------------------------------


async def test_two_replicas_lose_no_concurrent_change_and_both_apply_it(bus, nats_server, runtime, verdicts,
                                                                         tmp_path):
    async with runtime_process(nats_server, tmp_path):
        added = await asyncio.gather(
            *(ask(bus, RuleAction.ADD, rule=marker_rule(code, f"Parallel{code}", f"PARALLEL-{code}-{RUN}"))
              for code in range(200, 210))
        )
        order = codes(await ask(bus, RuleAction.LIST))
        # Whichever replica classifies an exit (they share the consumer) knows every rule.
        found = [await classify(bus, verdicts, f"PARALLEL-{code}-{RUN}") for code in range(200, 210) for _ in range(2)]

    assert len({reply.revision for reply in added}) == len(added)  # one write each, none lost
    assert set(range(200, 210)) <= set(order)
    assert [v.spec.code for v in found] == [code for code in range(200, 210) for _ in range(2)]


# --- the edits themselves ---------------------------------------------------------------

_codes = st.integers(min_value=200, max_value=219) | st.sampled_from([0, 137, 231, 255])
_edits = st.one_of(
    st.tuples(st.just("add"), _codes, st.sampled_from([None, 0, 5, 76]), st.sampled_from([None, 137, 255])),
    st.tuples(st.just("change"), _codes, st.sampled_from([None, 0, 5]), st.sampled_from([None, 137, 255])),
    st.tuples(st.just("delete"), _codes, st.none(), st.none()),
)


def _apply(rules: list[Rule], edit: tuple) -> tuple[list[Rule], int]:
    action, code, position, before = edit
    data = marker_rule(code, f"Edited{code}", f"EDITED-{code}", reaction="RETRY_TO_MAX")
    if action == "add":
        return add_rule(rules, data, position=position, before=before)
    if action == "change":
        return change_rule(rules, code, {**data, "phrase": rules[index_of(rules, code)].phrase},
                           position=position, before=before)
    return delete_rule(rules, code)


@settings(max_examples=80, deadline=None)
@given(edits=st.lists(_edits, max_size=12))
def test_edits_keep_codes_and_phrases_unique_and_leave_other_rules_in_order(edits):
    rules = default_rules()
    for edit in edits:
        action, code = edit[0], edit[1]
        try:
            edited, index = _apply(rules, edit)
        except (RuleError, NoSuchRule):
            continue  # refused: the admin is told why, and nothing changed
        assert [r for r in edited if r.code != code] == [r for r in rules if r.code != code]
        if action == "delete":
            assert code not in [r.code for r in edited]
        else:
            assert edited[index].code == code and edited[index].reaction == "RETRY_TO_MAX"
        assert len({r.code for r in edited}) == len({r.phrase for r in edited}) == len(edited)
        rules = edited
    RuleEngine(rules)  # whatever the edits, the result still compiles
