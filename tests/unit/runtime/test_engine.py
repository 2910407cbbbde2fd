"""The matching semantics of OpenPAI's exit spec, on small hand-made rule sets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from libs.common.messages import Reaction, TaskExited
from services.runtime.core import (
    LOG_LIMIT_BYTES,
    ExitPattern,
    Rule,
    RuleEngine,
    RuleError,
    RuntimePattern,
    cut_log,
    default_rules,
    load_rules,
)
from services.runtime.core.engine import _RegexBank
from tests.unit.runtime.builders import task_exited


def engine_for(*rules: dict) -> RuleEngine:
    return RuleEngine(load_rules({"spec": list(rules)}))


def rule(code: int, phrase: str, *patterns: dict, pods: tuple[dict, ...] = (), **fields) -> dict:
    data = {"code": code, "phrase": phrase, **fields}
    pattern = {}
    if patterns:
        pattern["runtimeContainerPatterns"] = list(patterns)
    if pods:
        pattern["controllerPodPatterns"] = list(pods)
    if pattern:
        data["pattern"] = pattern
    return data


def classify(engine: RuleEngine, exit_code: int = 1, log: str = "", **kwargs):
    return engine.classify(task_exited(exit_code, log, preamble=False, **kwargs))


# --- order and combination ------------------------------------------------------


def test_the_first_matching_rule_wins_even_when_a_later_one_is_more_specific():
    engine = engine_for(
        rule(220, "Broad", {"userLogRegex": "Error"}),
        rule(221, "Specific", {"exitCode": 1, "userLogRegex": "CUDA Error"}),
    )

    assert classify(engine, 1, "CUDA Error: boom\n").spec.phrase == "Broad"


def test_reordering_the_rules_changes_the_verdict():
    broad = rule(220, "Broad", {"userLogRegex": "Error"})
    specific = rule(221, "Specific", {"exitCode": 1, "userLogRegex": "CUDA Error"})

    assert classify(engine_for(specific, broad), 1, "CUDA Error: boom\n").spec.phrase == "Specific"


@pytest.mark.parametrize(
    ("exit_code", "log", "reason", "matches"),
    [
        (3, "fatal: boom\n", "Flaky", True),
        (4, "fatal: boom\n", "Flaky", False),
        (3, "all good\n", "Flaky", False),
        (3, "fatal: boom\n", "Other", False),
    ],
    ids=["all-three-fields-match", "exit-code-differs", "log-differs", "platform-log-differs"],
)
def test_a_pattern_matches_only_when_all_its_fields_match(exit_code, log, reason, matches):
    engine = engine_for(
        rule(222, "AllThree", {"exitCode": 3, "userLogRegex": "fatal: ", "platformLogRegex": "^Flaky\n"})
    )

    verdict = classify(engine, exit_code, log, reason=reason)

    assert (verdict.spec.phrase == "AllThree") is matches


@pytest.mark.parametrize(
    ("exit_code", "log"),
    [(5, ""), (1, "disk on fire\n")],
    ids=["first-pattern", "second-pattern"],
)
def test_a_rule_matches_when_any_of_its_patterns_matches(exit_code, log):
    engine = engine_for(rule(223, "Either", {"exitCode": 5}, {"userLogRegex": "on fire"}))

    assert classify(engine, exit_code, log).spec.phrase == "Either"


def test_the_platform_log_is_reason_then_message_on_the_next_line():
    engine = engine_for(rule(224, "Both", {"platformLogRegex": "(?m)^Error\nXid 79$"}))

    assert classify(engine, 1, reason="Error", message="Xid 79").spec.phrase == "Both"


# --- pod patterns -------------------------------------------------------------------


POD_RULES = (
    rule(-1300, "InitOom", pods=({"containers": [{"nameRegex": "^init$", "reasonRegex": "^OOMKilled$"}]},)),
    rule(-1200, "Oom", pods=({"containers": [{"reasonRegex": "^OOMKilled$"}]},)),
    rule(-1000, "Evicted", pods=({"reasonRegex": "(?i)^evicted$", "messageRegex": "(?s).*"},)),
    rule(-1203, "NoCmd", pods=({"containers": [{"reasonRegex": "^ContainerCannotRun$", "exitCode": 127}]},)),
    rule(-1299, "MainOnly", pods=({"containers": [{"nameRegex": "^trainer$", "messageRegex": "quota"}]},)),
)


@pytest.mark.parametrize(
    ("exit_code", "reason", "message", "role", "phrase"),
    [
        (137, "Init:OOMKilled", "", "worker", "InitOom"),
        (137, "OOMKilled", "", "worker", "Oom"),
        (-1, "Evicted", "The node was low on resource: memory.", "worker", "Evicted"),
        (127, "ContainerCannotRun", "exec: train: not found", "worker", "NoCmd"),
        (126, "ContainerCannotRun", "permission denied", "worker", "PAIRuntimeUnknownFailed"),
        (1, "Error", "disk quota exceeded", "trainer", "MainOnly"),
        (1, "Error", "disk quota exceeded", "worker", "PAIRuntimeUnknownFailed"),
    ],
    ids=["init-container-by-prefix", "main-container", "pod-reason-and-message", "container-exit-code",
         "container-exit-code-differs", "container-named-after-role", "other-role"],
)
def test_pod_patterns_read_what_the_platform_reported(exit_code, reason, message, role, phrase):
    verdict = RuleEngine(load_rules({"spec": list(POD_RULES)})).classify(
        task_exited(exit_code, "", reason=reason, message=message, role=role)
    )

    assert verdict.spec.phrase == phrase


def test_an_engine_refuses_rules_whose_regex_does_not_compile():
    pattern = ExitPattern(runtimeContainerPatterns=[RuntimePattern(userLogRegex="(")])
    broken = Rule(code=1, phrase="Broken", pattern=pattern)

    with pytest.raises(RuleError) as caught:
        RuleEngine([broken])

    assert [where for where, _ in caught.value.errors] == ["rules[0].pattern.runtimeContainerPatterns[0].userLogRegex"]


def test_spec_for_gives_a_rules_spec_or_a_builtin_fallback():
    engine = engine_for(rule(-210, "StopFrameworkRequested", reason="Stopped on request."))

    assert engine.spec_for(-210).reason == "Stopped on request."
    assert engine.spec_for(255).phrase == "PAIRuntimeUnknownFailed"
    assert engine.spec_for(77) is None


def test_openpai_gpu_info_patterns_load_but_never_match():
    engine = engine_for(rule(128, "EccMaybe", {"gpuInfo": {"nvidiaDoubleEccError": True}}))

    assert classify(engine, 1, "anything\n").spec.phrase == "PAIRuntimeUnknownFailed"


# --- success, signals, fallbacks ------------------------------------------------


def test_exit_code_zero_is_success_without_looking_at_rules():
    engine = engine_for(rule(225, "Anything", {"userLogRegex": "."}))

    verdict = classify(engine, 0, "Traceback (most recent call last):\n")

    assert (verdict.spec.code, verdict.spec.phrase, verdict.rule_code) == (0, "Succeeded", 0)


def test_exit_code_zero_with_a_platform_reason_needs_platform_evidence_to_fail():
    engine = engine_for(
        rule(226, "LogOnly", {"userLogRegex": "Traceback"}),
        rule(-210, "Stopped", pods=({"reasonRegex": "^Stopped$"},)),
    )

    assert classify(engine, 0, "Traceback\n", reason="Stopped").spec.phrase == "Stopped"
    assert classify(engine, 0, "Traceback\n", reason="Completed").spec.phrase == "Succeeded"


@pytest.mark.parametrize(
    ("exit_code", "signal", "seen_as"),
    [(-9, 9, 137), (0, 15, 143), (137, 9, 137), (1, None, 1)],
    ids=["negative-code-with-signal", "zero-with-signal", "shell-style-code", "no-signal"],
)
def test_a_signal_death_counts_as_128_plus_the_signal(exit_code, signal, seen_as):
    engine = engine_for(rule(137, "Kill", {"exitCode": 137}), rule(143, "Term", {"exitCode": 143}))

    verdict = engine.classify(task_exited(exit_code, "", signal=signal))

    expected = {137: "Kill", 143: "Term"}.get(seen_as, "PAIRuntimeUnknownFailed")
    assert verdict.spec.phrase == expected


@pytest.mark.parametrize(
    ("exit_code", "code", "phrase", "rule_code"),
    [
        (1, 255, "PAIRuntimeUnknownFailed", 255),
        (42, 255, "PAIRuntimeUnknownFailed", 255),
        (-7, -7, "ContainerUndefinedNegativeExitCode", -8000),
        (300, 300, "PAIRuntimeExitAbnormally", 256),
    ],
    ids=["exit-1", "exit-42", "undefined-negative-keeps-raw-code", "above-255-keeps-raw-code"],
)
def test_unrecognised_failures_fall_back_to_openpai_catch_all_codes(exit_code, code, phrase, rule_code):
    log = "".join(f"line {n}\n" for n in range(1, 40)) + "the real error is here\n"

    for engine in (engine_for(rule(220, "Unrelated", {"exitCode": 99})), RuleEngine(default_rules())):
        verdict = classify(engine, exit_code, log)

        assert (verdict.spec.code, verdict.spec.phrase, verdict.rule_code) == (code, phrase, rule_code)
        assert verdict.diagnostics[-1] == "the real error is here"
        assert "line 1" not in verdict.diagnostics, "only the last lines"


def test_fallbacks_use_the_rule_sets_own_text_when_it_has_one():
    engine = engine_for(rule(255, "PAIRuntimeUnknownFailed", reason="Ask #ml-infra on chat.", reaction="NEVER_RETRY"))

    verdict = classify(engine, 1, "boom\n")

    assert verdict.spec.reason == "Ask #ml-infra on chat."
    assert verdict.spec.reaction == Reaction.NEVER_RETRY


# --- syntax errors are never retried ----------------------------------------------


@pytest.mark.parametrize(
    "log",
    [
        '  File "train.py", line 3\n    def f(:\n          ^\nSyntaxError: invalid syntax\n',
        '  File "train.py", line 9\n    return 1\nIndentationError: unexpected indent\n',
        "[rank0]:   File \"train.py\", line 9\n[rank0]: TabError: inconsistent use of tabs and spaces in indentation\n",
    ],
    ids=["syntax-error", "indentation-error", "tab-error-behind-rank-prefix"],
)
def test_a_python_syntax_error_is_never_retried_whatever_rule_matched(log):
    engine = engine_for(
        rule(220, "RetryAnything", {"exitCode": 1}, reaction="ALWAYS_RETRY"),
    )

    verdict = classify(engine, 1, log)

    assert verdict.spec.phrase == "RetryAnything"
    assert verdict.spec.reaction == Reaction.NEVER_RETRY
    assert any("Error: " in line for line in verdict.diagnostics)


def test_a_syntax_error_in_an_unrecognised_failure_is_never_retried():
    verdict = classify(engine_for(rule(220, "Unrelated", {"exitCode": 99})), 1, "SyntaxError: invalid syntax\n")

    assert (verdict.spec.phrase, verdict.spec.reaction) == ("PAIRuntimeUnknownFailed", Reaction.NEVER_RETRY)


def test_syntax_error_guard_leaves_platform_decisions_alone():
    engine = engine_for(rule(-410, "TaskPreempted", pods=({"reasonRegex": "^Preempted$"},), reaction="ALWAYS_RETRY"))

    verdict = classify(engine, 143, "SyntaxError: in a notebook cell the job printed\n", reason="Preempted")

    assert verdict.spec.reaction == Reaction.ALWAYS_RETRY


# --- diagnostics -------------------------------------------------------------------


def test_diagnostics_are_the_matched_lines_a_few_at_most_and_short():
    engine = engine_for(rule(227, "Nan", {"userLogRegex": "loss is nan"}))
    log = "".join(f"step {n}: loss is nan {'x' * 1000}\n" for n in range(10))

    verdict = classify(engine, 1, log)

    assert len(verdict.diagnostics) == 3
    assert verdict.diagnostics[0].startswith("step 0: loss is nan")
    assert all(len(line) <= 300 for line in verdict.diagnostics)


def test_diagnostics_of_a_progress_bar_line_show_the_match():
    engine = engine_for(rule(227, "Nan", {"userLogRegex": "loss is nan"}))
    bar = "".join(f"\r{n}%|{'#' * (n // 10)}| step {n}" for n in range(100))

    verdict = classify(engine, 1, bar + " loss is nan\n")

    assert verdict.diagnostics == ["99%|#########| step 99 loss is nan"]


# --- bounded work ---------------------------------------------------------------------


def test_only_the_last_64_kib_of_the_log_are_read():
    engine = engine_for(rule(228, "OldNews", {"userLogRegex": "MARKER"}))
    far = "MARKER at the start\n" + "x" * LOG_LIMIT_BYTES
    near = "y" * LOG_LIMIT_BYTES + "MARKER near the end\n"

    assert classify(engine, 1, far).spec.phrase == "PAIRuntimeUnknownFailed"
    assert classify(engine, 1, near).spec.phrase == "OldNews"


def test_a_long_platform_message_is_cut_too():
    engine = engine_for(rule(229, "Hidden", pods=({"messageRegex": "^MARKER"},)))

    verdict = classify(engine, 1, reason="Error", message="MARKER" + "z" * (2 * LOG_LIMIT_BYTES))

    assert verdict.spec.phrase == "PAIRuntimeUnknownFailed"


def test_a_pathological_log_still_gets_a_verdict():
    # Backtracking engines take exponential time on this pair; the log is
    # far longer than the cut, so the cut is exercised as well.
    engine = engine_for(
        rule(230, "Runaway", {"userLogRegex": "(?s)a.*a.*a.*a.*a.*a.*b"}),
        rule(231, "AlsoRunaway", {"userLogRegex": "(x|xx|xxx)*y"}),
    )
    log = "a" * (4 * LOG_LIMIT_BYTES) + "\n" + "x" * 50_000

    verdict = classify(engine, 1, log)

    assert verdict.spec.phrase == "PAIRuntimeUnknownFailed"
    assert verdict.diagnostics and len(verdict.diagnostics[-1]) <= 300


def test_matching_stays_correct_when_the_set_matcher_runs_out_of_memory():
    bank = _RegexBank()
    indexes = [bank.add(f"(?i)needle{n}[a-z]*haystack") for n in range(200)]
    bank.compile()
    text = " ".join(f"needle{n}abchaystack" for n in range(0, 200, 7)).encode()

    class GaveUp:  # what RE2's set matcher reports when its automaton runs out of memory
        def Match(self, text):
            return None

    expected = bank.hits(text)
    bank._set = GaveUp()

    assert bank.hits(text) == expected == {indexes[n] for n in range(0, 200, 7)}


@given(st.text(max_size=3000), st.integers(min_value=1, max_value=LOG_LIMIT_BYTES))
def test_cut_log_keeps_a_valid_utf8_suffix_within_the_limit(text, limit):
    encoded = text.encode("utf-8", "replace")

    cut = cut_log(text, limit)

    assert len(cut) <= limit
    assert encoded.endswith(cut)
    cut.decode("utf-8")  # starts on a character boundary
    assert len(cut) >= min(len(encoded), limit) - 3  # at most a cut character's remaining bytes dropped


DEFAULT_ENGINE = RuleEngine(default_rules())


@settings(max_examples=60, deadline=None)
@given(
    exit_code=st.integers(min_value=-9000, max_value=400),
    signal=st.one_of(st.none(), st.integers(min_value=1, max_value=64)),
    reason=st.sampled_from(["", "OOMKilled", "Init:OOMKilled", "Evicted", "Preempted", "Stopped", "Error", "Whatever"]),
    message=st.text(max_size=200),
    log=st.text(max_size=2000),
)
def test_every_exit_gets_an_explained_verdict(exit_code, signal, reason, message, log):
    exit = TaskExited(
        id="u~j/0/r/0/0/exited", job="u~j", vc="default", attempt=0, role="r", index=0,
        exitCode=exit_code, signal=signal, platformReason=reason, platformMessage=message, userLogTail=log,
    )

    verdict = DEFAULT_ENGINE.classify(exit)

    assert verdict.spec.phrase
    assert len(verdict.diagnostics) <= 8 and all(len(line) <= 300 for line in verdict.diagnostics)
    if verdict.spec.phrase == "Succeeded":
        assert verdict.spec.code == 0 and exit_code == 0 and signal is None
    else:
        assert verdict.spec.code != 0
