"""Checking a rule before PAI uses it: every problem, with where it is.

The admin API and the rule-file loader share these checks, so a rule that an
admin could not add through the API cannot sneak in through a file either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from libs.common.errors import BadInput
from libs.common.messages import Reaction
from libs.common.protocol.paths import RawMapping
from services.runtime.core.model import (
    BEHAVIORS,
    CAUSERS,
    ISSUERS,
    MAX_CODE,
    MIN_CODE,
    STAGES,
    TYPES,
    Rule,
)
from services.runtime.core.regexes import regex_problems

Problem = tuple[str, str]  # (where: a field path like "pattern.runtimeContainerPatterns[0].exitCode", what)

# Phrases are identifiers (metric labels, CLI output, e-mail subjects).
_PHRASE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

_ENUMS: dict[str, tuple[str, ...]] = {
    "issuer": ISSUERS,
    "causer": CAUSERS,
    "type": TYPES,
    "stage": STAGES,
    "behavior": BEHAVIORS,
    "reaction": tuple(reaction.value for reaction in Reaction),
}
_RULE_FIELDS = ("code", "phrase", *_ENUMS, "reason", "repro", "solution", "pattern")
_RUNTIME_FIELDS = ("exitCode", "userLogRegex", "platformLogRegex", "gpuInfo")
_POD_FIELDS = ("reasonRegex", "messageRegex", "containers")
_CONTAINER_FIELDS = ("nameRegex", "reasonRegex", "messageRegex", "exitCode")


class RuleError(BadInput, ValueError):
    """A rule (or rule file) is invalid; `errors` says what is wrong and where."""

    def __init__(self, errors: list[Problem]):
        self.errors = list(errors)
        summary = "; ".join(f"{path or '<rule>'}: {message}" for path, message in self.errors[:5])
        if len(self.errors) > 5:
            summary += f"; and {len(self.errors) - 5} more"
        super().__init__(
            f"invalid rule: {summary}",
            details=[{"path": path, "message": message} for path, message in self.errors],
        )


def validate_rule(data: RawMapping, *, existing: list[Rule], replacing: int | None = None) -> Rule:
    """Check one rule as an admin submitted it and build it.

    `existing` is the current rule set; the new rule's code and phrase must not
    be used by another rule in it. `replacing` is the code of the rule this one
    replaces (its own code and phrase are then free to keep).
    """
    problems = rule_problems(data)
    if not problems:
        others = [rule for rule in existing if replacing is None or rule.code != replacing]
        problems = uniqueness_problems(data, others)
    if problems:
        raise RuleError(problems)
    return build_rule(data)


def build_rule(data: RawMapping) -> Rule:
    """Build a rule that `rule_problems` accepted."""
    return msgspec.convert(_without_nulls(data), Rule)


def _without_nulls(value: object) -> object:
    # An empty YAML field (`reason:`) means "not given", like a missing one.
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def uniqueness_problems(data: RawMapping, others: Iterable[Rule], prefix: str = "") -> list[Problem]:
    problems: list[Problem] = []
    for rule in others:
        if rule.code == data["code"]:
            problems.append((_join(prefix, "code"), f"code {rule.code} is already used by rule {rule.phrase}"))
        if rule.phrase == data["phrase"]:
            problems.append((_join(prefix, "phrase"), f"phrase {rule.phrase} is already used by rule {rule.code}"))
    return problems


def rule_problems(data: object, prefix: str = "") -> list[Problem]:
    """Every problem of one rule, without looking at other rules."""
    if not isinstance(data, dict):
        return [(prefix, f"a rule must be a mapping, got {_kind(data)}")]
    problems = _unknown_fields(data, _RULE_FIELDS, prefix)

    code = data.get("code")
    if code is None:
        problems.append((_join(prefix, "code"), "required"))
    elif not _is_int(code):
        problems.append((_join(prefix, "code"), f"must be an integer, got {_kind(code)}"))
    elif not MIN_CODE <= code <= MAX_CODE:
        problems.append((_join(prefix, "code"), f"must be between {MIN_CODE} and {MAX_CODE}, got {code}"))

    phrase = data.get("phrase")
    if phrase is None:
        problems.append((_join(prefix, "phrase"), "required"))
    elif not isinstance(phrase, str) or not _PHRASE.match(phrase):
        problems.append(
            (_join(prefix, "phrase"), f"must be a word like ContainerSigKillReceived, got {phrase!r}")
        )

    for name, allowed in _ENUMS.items():
        value = data.get(name)
        if value is not None and value not in allowed:
            problems.append((_join(prefix, name), f"must be one of {', '.join(allowed)}; got {value!r}"))

    if data.get("reason") is not None and not isinstance(data["reason"], str):
        problems.append((_join(prefix, "reason"), f"must be a string, got {_kind(data['reason'])}"))
    for name in ("repro", "solution"):
        value = data.get(name)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append((_join(prefix, name), "must be a list of strings"))

    if data.get("pattern") is not None:
        problems += _pattern_problems(data["pattern"], _join(prefix, "pattern"))
    return problems


def _pattern_problems(pattern: object, where: str) -> list[Problem]:
    if not isinstance(pattern, dict):
        return [(where, f"must be a mapping, got {_kind(pattern)}")]
    problems = _unknown_fields(pattern, ("runtimeContainerPatterns", "controllerPodPatterns"), where)
    for name, check in (
        ("runtimeContainerPatterns", _runtime_problems),
        ("controllerPodPatterns", _pod_problems),
    ):
        entries = pattern.get(name)
        if entries is None:
            continue
        if not isinstance(entries, list):
            problems.append((_join(where, name), f"must be a list, got {_kind(entries)}"))
            continue
        for index, entry in enumerate(entries):
            problems += check(entry, f"{_join(where, name)}[{index}]")
    return problems


def _runtime_problems(entry: object, where: str) -> list[Problem]:
    if not isinstance(entry, dict):
        return [(where, f"must be a mapping, got {_kind(entry)}")]
    problems = _unknown_fields(entry, _RUNTIME_FIELDS, where)
    problems += _exit_code_problems(entry, where)
    problems += _regex_field_problems(entry, ("userLogRegex", "platformLogRegex"), where)
    gpu_info = entry.get("gpuInfo")
    if gpu_info is not None and not (
        isinstance(gpu_info, dict) and all(isinstance(k, str) and isinstance(v, bool) for k, v in gpu_info.items())
    ):
        problems.append((_join(where, "gpuInfo"), "must map names to true/false"))
    if not any(entry.get(name) is not None for name in _RUNTIME_FIELDS):
        problems.append((where, "a pattern without any condition would match every exit"))
    return problems


def _pod_problems(entry: object, where: str) -> list[Problem]:
    if not isinstance(entry, dict):
        return [(where, f"must be a mapping, got {_kind(entry)}")]
    problems = _unknown_fields(entry, _POD_FIELDS, where)
    problems += _regex_field_problems(entry, ("reasonRegex", "messageRegex"), where)
    containers = entry.get("containers")
    if containers is not None:
        if not isinstance(containers, list):
            problems.append((_join(where, "containers"), f"must be a list, got {_kind(containers)}"))
        else:
            for index, container in enumerate(containers):
                problems += _container_problems(container, f"{_join(where, 'containers')}[{index}]")
    if entry.get("reasonRegex") is None and entry.get("messageRegex") is None and not containers:
        problems.append((where, "a pattern without any condition would match every exit"))
    return problems


def _container_problems(entry: object, where: str) -> list[Problem]:
    if not isinstance(entry, dict):
        return [(where, f"must be a mapping, got {_kind(entry)}")]
    problems = _unknown_fields(entry, _CONTAINER_FIELDS, where)
    problems += _exit_code_problems(entry, where)
    problems += _regex_field_problems(entry, ("nameRegex", "reasonRegex", "messageRegex"), where)
    if not any(entry.get(name) is not None for name in _CONTAINER_FIELDS):
        problems.append((where, "a container pattern without any condition matches every container"))
    return problems


def _exit_code_problems(entry: RawMapping, where: str) -> list[Problem]:
    value = entry.get("exitCode")
    if value is not None and not _is_int(value):
        return [(_join(where, "exitCode"), f"must be an integer, got {_kind(value)}")]
    return []


def _regex_field_problems(entry: RawMapping, names: tuple[str, ...], where: str) -> list[Problem]:
    problems: list[Problem] = []
    for name in names:
        if entry.get(name) is not None:
            problems += [(_join(where, name), message) for message in regex_problems(entry[name])]
    return problems


def _unknown_fields(data: RawMapping, known: tuple[str, ...], where: str) -> list[Problem]:
    return [
        (_join(where, str(key)), f"unknown field; expected one of {', '.join(known)}")
        for key in data
        if key not in known
    ]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
