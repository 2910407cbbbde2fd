"""Rule files in OpenPAI's exit-spec format: loading, errors, the reference file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from libs.common.messages import Reaction
from services.runtime.core import DEFAULT_RULES_PATH, RuleEngine, RuleError, default_rules, load_rules
from tests.unit.runtime.builders import task_exited

REFERENCE_SPEC = (
    Path(__file__).resolve().parents[3] / ".." / "shared" / "reference" / "openpai" / "k8s-job-exit-spec.yaml"
)

SMALL_FILE = """\
service_type: k8s
schema: []          # documentation only, ignored
spec:
- code: 0
  phrase: Succeeded
  reaction: NEVER_RETRY
- code: 137
  phrase: ContainerSigKillReceived
  reaction: ALWAYS_RETRY
  reason: "Killed by SIGKILL"
  pattern:
    runtimeContainerPatterns:
    - exitCode: 137
"""


def reference_spec() -> Path:
    if not REFERENCE_SPEC.exists():
        pytest.skip(f"reference files not present: {REFERENCE_SPEC}")
    return REFERENCE_SPEC


@pytest.mark.parametrize(
    "source",
    [
        SMALL_FILE,
        SMALL_FILE.encode(),
        yaml.safe_load(SMALL_FILE),
        yaml.safe_load(SMALL_FILE)["spec"],
        json.dumps(yaml.safe_load(SMALL_FILE)),
    ],
    ids=["yaml-text", "yaml-bytes", "mapping", "bare-list", "json-text"],
)
def test_rules_load_from_text_bytes_or_data(source):
    rules = load_rules(source)

    assert [(rule.code, rule.phrase, rule.reaction) for rule in rules] == [
        (0, "Succeeded", Reaction.NEVER_RETRY),
        (137, "ContainerSigKillReceived", Reaction.ALWAYS_RETRY),
    ]
    assert rules[1].pattern.runtimeContainerPatterns[0].exitCode == 137


@pytest.mark.parametrize("as_text", [False, True], ids=["path", "path-as-text"])
def test_rules_load_from_a_file(tmp_path, as_text):
    path = tmp_path / "rules.yaml"
    path.write_text(SMALL_FILE)

    assert [rule.code for rule in load_rules(str(path) if as_text else path)] == [0, 137]


def test_a_rule_writes_back_to_the_same_rule():
    rules = default_rules()

    assert load_rules([rule.to_dict() for rule in rules]) == rules


def test_a_broken_file_names_every_problem_and_where():
    broken = {
        "spec": [
            {"code": 1, "phrase": "Fine", "pattern": {"runtimeContainerPatterns": [{"exitCode": 1}]}},
            {"code": 1, "phrase": "SameCode"},
            {"code": 2, "phrase": "BadRegex", "pattern": {"runtimeContainerPatterns": [{"userLogRegex": "(oops"}]}},
            {"phrase": "NoCode", "reaction": "SOMETIMES"},
        ]
    }

    with pytest.raises(RuleError) as caught:
        load_rules(broken)

    paths = [path for path, _ in caught.value.errors]
    assert paths == [
        "spec[1].code",
        "spec[2].pattern.runtimeContainerPatterns[0].userLogRegex",
        "spec[3].code",
        "spec[3].reaction",
    ]
    assert "already used by rule Fine" in caught.value.errors[0][1]


@pytest.mark.parametrize(
    ("source", "path", "message"),
    [
        ("spec: [\n  - code: 1\n", "", "not valid YAML"),
        ("service_type: k8s\n", "spec", "required"),
        ("spec: {code: 1}\n", "spec", "must be a list"),
        ("- just\n- words\n", "[0]", "a rule must be a mapping"),
        ("/etc/pai/no-such-rules.yaml", "", "cannot read rule file"),
        (Path("/nonexistent/rules.yaml"), "", "cannot read rule file"),
    ],
    ids=["bad-yaml", "no-spec", "spec-not-a-list", "rules-not-mappings", "missing-file-named-in-text",
         "missing-file"],
)
def test_an_unusable_file_says_why(source, path, message):
    with pytest.raises(RuleError) as caught:
        load_rules(source)

    assert caught.value.errors[0][0] == path
    assert message in caught.value.errors[0][1]


def test_the_default_rules_are_the_shipped_file():
    assert DEFAULT_RULES_PATH.name == "default-rules.yaml"
    assert default_rules() == load_rules(DEFAULT_RULES_PATH)


# --- OpenPAI's own file ---------------------------------------------------------------


def test_the_reference_exit_spec_loads_unchanged():
    path = reference_spec()
    entries = yaml.safe_load(path.read_text())["spec"]

    rules = load_rules(path)

    assert [(rule.code, rule.phrase, rule.reaction.value) for rule in rules] == [
        (entry["code"], entry["phrase"], entry["reaction"]) for entry in entries
    ]


@pytest.mark.parametrize(
    ("exit_code", "reason", "message", "log", "code"),
    [
        (137, "", "", "", 137),
        (1, "", "", "Traceback (most recent call last):\nImportError: cannot import name 'x'\n", 232),
        (127, "", "", "bash: trainn: command not found\n", 220),
        (-1, "Evicted", "The node was low on resource: memory.", "", -1000),
        (137, "Init:OOMKilled", "", "", -1300),
        (137, "OOMKilled", "", "", -1200),
        (1, "", "", "exited for a reason no rule knows\n", 255),
        (-5, "", "", "", -5),
        (0, "", "", "", 0),
        # -1204 comes before the more specific -1205 in that file: the first match wins.
        (128, "ContainerCannotRun", "nvidia-container-cli: device error: unknown device id", "", -1204),
    ],
    ids=["sigkill", "import-error", "command-not-found", "evicted", "init-oom", "oom", "unknown", "negative",
         "success", "file-order-decides"],
)
def test_the_reference_exit_spec_classifies(exit_code, reason, message, log, code):
    engine = RuleEngine(load_rules(reference_spec()))

    verdict = engine.classify(task_exited(exit_code, log, reason=reason, message=message))

    assert verdict.spec.code == code


def test_default_rules_keep_openpai_codes_and_cover_every_pattern_class():
    reference = {entry["code"]: entry for entry in yaml.safe_load(reference_spec().read_text())["spec"]}
    ours = {rule.code: rule for rule in default_rules()}

    for code, entry in reference.items():
        rule = ours[code]
        assert (rule.phrase, rule.reaction.value, rule.type, rule.causer) == (
            entry["phrase"], entry["reaction"], entry["type"], entry["causer"]
        ), code
        for kind in ("runtimeContainerPatterns", "controllerPodPatterns"):
            if (entry.get("pattern") or {}).get(kind):
                assert getattr(rule.pattern, kind), f"{code} has no {kind}"
        assert rule.reason != entry.get("reason"), f"{code}: explained in PAI's own words"
