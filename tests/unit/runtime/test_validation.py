"""What an admin hears back when a rule cannot be used."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from libs.common.errors import BadInput
from libs.common.messages import Reaction
from services.runtime.core import MAX_REGEX_LENGTH, RuleError, default_rules, regex_problems, validate_rule

EXISTING = default_rules()

GOOD = {
    "code": 227,
    "phrase": "HuggingFaceHubOffline",
    "issuer": "PAI_RUNTIME",
    "causer": "USER_CONTAINER",
    "type": "USER_FAILURE",
    "stage": "RUNNING",
    "behavior": "TRANSIENT",
    "reaction": "RETRY_TO_MAX",
    "reason": "The task could not download a model from the Hugging Face hub.",
    "solution": ["Set HF_HUB_OFFLINE=1 and read the model from the shared cache"],
    "pattern": {"runtimeContainerPatterns": [{"exitCode": 1, "userLogRegex": "(?i)we couldn't connect to '\\S+'"}]},
}


def with_changes(**changes) -> dict:
    data = {**GOOD, **changes}
    return {key: value for key, value in data.items() if value is not ...}


def with_runtime_pattern(**fields) -> dict:
    return with_changes(pattern={"runtimeContainerPatterns": [fields]})


def test_a_good_rule_is_accepted():
    rule = validate_rule(GOOD, existing=EXISTING)

    assert (rule.code, rule.phrase, rule.reaction) == (227, "HuggingFaceHubOffline", Reaction.RETRY_TO_MAX)
    assert rule.to_dict() == GOOD


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (with_changes(code=...), "code", "required"),
        (with_changes(phrase=...), "phrase", "required"),
        (with_changes(code="227"), "code", "must be an integer"),
        (with_changes(code=True), "code", "must be an integer"),
        (with_changes(code=9000), "code", "between -8000 and 256"),
        (with_changes(phrase="hub offline"), "phrase", "must be a word"),
        (with_changes(reaction="SOMETIMES"), "reaction", "must be one of ALWAYS_RETRY"),
        (with_changes(stage="TRAINING"), "stage", "must be one of SUBMITTING"),
        (with_changes(reasons="typo"), "reasons", "unknown field"),
        (with_changes(solution="one string"), "solution", "list of strings"),
        (with_changes(pattern=[]), "pattern", "must be a mapping"),
        (with_changes(pattern={"runtimePatterns": []}), "pattern.runtimePatterns", "unknown field"),
        (with_runtime_pattern(), "pattern.runtimeContainerPatterns[0]", "would match every exit"),
        (with_runtime_pattern(exitCode="137"), "pattern.runtimeContainerPatterns[0].exitCode", "must be an integer"),
        (with_runtime_pattern(userLogRegex="(unclosed"), "pattern.runtimeContainerPatterns[0].userLogRegex",
         "not a valid regex"),
        (with_runtime_pattern(userLogRegex="(?<=loss )nan"), "pattern.runtimeContainerPatterns[0].userLogRegex",
         "no backreferences or look-around"),
        (with_runtime_pattern(platformLogRegex="(.*)*OOM"), "pattern.runtimeContainerPatterns[0].platformLogRegex",
         "nested quantifier"),
        (with_runtime_pattern(userLogRegex=""), "pattern.runtimeContainerPatterns[0].userLogRegex",
         "matches everything"),
        (with_runtime_pattern(userLogRegex="x" * (MAX_REGEX_LENGTH + 1)),
         "pattern.runtimeContainerPatterns[0].userLogRegex", "longer than"),
        (with_changes(pattern={"controllerPodPatterns": [{"containers": [{"nameRegex": "(a+)+"}]}]}),
         "pattern.controllerPodPatterns[0].containers[0].nameRegex", "nested quantifier"),
        (with_changes(pattern={"controllerPodPatterns": [{}]}), "pattern.controllerPodPatterns[0]",
         "would match every exit"),
    ],
    ids=["missing-code", "missing-phrase", "code-as-text", "code-as-bool", "code-out-of-range", "phrase-not-a-word",
         "unknown-reaction", "unknown-stage", "unknown-field", "solution-not-a-list", "pattern-not-a-mapping",
         "unknown-pattern-kind", "pattern-without-condition", "exit-code-as-text", "bad-regex", "look-behind",
         "runaway-regex", "empty-regex", "regex-too-long", "runaway-container-regex", "empty-pod-pattern"],
)
def test_a_bad_rule_is_refused_naming_the_field(data, path, message):
    with pytest.raises(RuleError) as caught:
        validate_rule(data, existing=EXISTING)

    assert [where for where, _ in caught.value.errors] == [path]
    assert message in caught.value.errors[0][1]
    assert path in str(caught.value)


def test_all_problems_are_reported_at_once():
    data = with_changes(code=..., reaction="SOMETIMES", pattern={"runtimeContainerPatterns": [{"userLogRegex": "("}]})

    with pytest.raises(RuleError) as caught:
        validate_rule(data, existing=EXISTING)

    assert [where for where, _ in caught.value.errors] == [
        "code", "reaction", "pattern.runtimeContainerPatterns[0].userLogRegex"
    ]


@pytest.mark.parametrize(
    ("changes", "path", "message"),
    [
        ({"code": 137}, "code", "already used by rule ContainerSigKillReceived"),
        ({"phrase": "ContainerSigKillReceived"}, "phrase", "already used by rule 137"),
    ],
    ids=["duplicate-code", "duplicate-phrase"],
)
def test_codes_and_phrases_stay_unique(changes, path, message):
    with pytest.raises(RuleError) as caught:
        validate_rule(with_changes(**changes), existing=EXISTING)

    assert caught.value.errors == [(path, caught.value.errors[0][1])]
    assert message in caught.value.errors[0][1]


def test_replacing_a_rule_may_keep_its_code_and_phrase():
    new_text = with_changes(code=137, phrase="ContainerSigKillReceived", reaction="RETRY_TO_MAX")

    rule = validate_rule(new_text, existing=EXISTING, replacing=137)

    assert (rule.code, rule.reaction) == (137, Reaction.RETRY_TO_MAX)


def test_replacing_a_rule_may_not_take_another_rules_phrase():
    with pytest.raises(RuleError) as caught:
        validate_rule(with_changes(code=137, phrase="ContainerSigTermReceived"), existing=EXISTING, replacing=137)

    assert [where for where, _ in caught.value.errors] == ["phrase"]


def test_a_rule_error_is_a_bad_request_with_machine_readable_details():
    with pytest.raises(RuleError) as caught:
        validate_rule(with_changes(code=...), existing=EXISTING)

    error = caught.value
    assert isinstance(error, BadInput) and isinstance(error, ValueError)
    assert error.status == 400
    assert error.details == [{"path": "code", "message": "required"}]


@pytest.mark.parametrize(
    "regex",
    [
        "(?mi)tensorflow.*ResourceExhaustedError.*OOM.*",
        "(?i)^OutOf\\S+$",
        "(?mi).*(not found|cannot find|no such).*",
        "(foo|bar)+",
        "(ab)+c",
        "(a+)?b",
        "[(+)]+",
        "\\(a+\\)+",
        "(?i:nccl)+ error",
        "[[:alpha:]]+ failed",
        "(?m)^(\\[[^\\]\\n]*\\]:?)?SyntaxError: ",
    ],
    ids=["openpai-multi-wildcard", "openpai-anchored", "openpai-alternation", "repeated-alternation",
         "repeated-plain-group", "optional-group-with-repeat", "quantifier-chars-in-class", "escaped-parens",
         "inline-flag-group", "posix-class", "optional-rank-prefix"],
)
def test_safe_regexes_are_accepted(regex):
    assert regex_problems(regex) == []


@pytest.mark.parametrize(
    ("regex", "message"),
    [
        ("(a+)+$", "nested quantifier at offset 4"),
        ("(.*)*", "nested quantifier"),
        ("(\\w+\\s?){2,}", "nested quantifier"),
        ("((ab)*c)+", "nested quantifier"),
        ("(?P<word>x*)+", "nested quantifier"),
        ("(a+){2}", "nested quantifier"),
        ("(a)\\1", "no backreferences"),
        ("(?=a)", "look-around"),
        ("(?i)[a-z]{1000}[0-9]{1000}", "too complex"),
        (42, "must be a string"),
    ],
    ids=["plus-plus", "star-star", "counted-outer", "deep-nesting", "named-group", "repeated-twice",
         "backreference", "look-ahead", "huge-program", "not-a-string"],
)
def test_risky_regexes_are_refused(regex, message):
    problems = regex_problems(regex)

    assert len(problems) == 1 and message in problems[0]


ATOMS = st.sampled_from(["a", ".", "\\d", "[a-z]", "(?:ab)", "\\w", "x|y"])
INNER = st.sampled_from(["*", "+", "{1,}", "*?", "+?"])
OUTER = st.sampled_from(["*", "+", "{2,}", "{2,5}", "{3}", "+?"])


@given(prefix=st.sampled_from(["", "x", "^"]), atom=ATOMS, inner=INNER, outer=OUTER)
def test_any_repeat_of_a_group_with_an_unbounded_repeat_is_refused(prefix, atom, inner, outer):
    regex = f"{prefix}(z{atom}{inner}){outer}"

    assert any("nested quantifier" in problem for problem in regex_problems(regex)), regex
