"""Reading rule files: OpenPAI's exit-spec format, as it is.

A rule file is YAML (or JSON) with the rules under `spec:`, the layout of
OpenPAI's `k8s-job-exit-spec.yaml`; its other top-level keys (`service_type`,
`schema`) are documentation and are ignored. A bare list of rules is accepted
too. The order of the rules is kept: the first matching rule wins.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from libs.common.protocol.paths import RawMapping
from services.runtime.core.model import Rule
from services.runtime.core.validation import (
    Problem,
    RuleError,
    build_rule,
    rule_problems,
    uniqueness_problems,
)

DEFAULT_RULES_PATH = Path(__file__).resolve().parent.parent / "rules" / "default-rules.yaml"


def load_rules(data: str | bytes | RawMapping | list[object] | Path) -> list[Rule]:
    """Parse and check a whole rule set; raises RuleError naming every problem
    (paths like `spec[12].pattern.runtimeContainerPatterns[0].userLogRegex`).

    `data` is YAML/JSON text, already parsed data, or a file path; a one-line
    string that is not a rule set is taken as a file path too."""
    document = _parse(data)
    if isinstance(document, dict):
        if "spec" not in document:
            raise RuleError([("spec", "required: the list of rules")])
        entries, prefix = document["spec"], "spec"
    else:
        entries, prefix = document, ""
    if not isinstance(entries, list):
        raise RuleError([(prefix, f"must be a list of rules, got {type(entries).__name__}")])

    problems: list[Problem] = []
    rules: list[Rule] = []
    for index, entry in enumerate(entries):
        where = f"{prefix}[{index}]"
        entry_problems = rule_problems(entry, where)
        if not entry_problems:
            entry_problems = uniqueness_problems(entry, rules, where)
        problems += entry_problems
        if not entry_problems:
            rules.append(build_rule(entry))
    if problems:
        raise RuleError(problems)
    return rules


def default_rules() -> list[Rule]:
    """The rule set PAI ships (services/runtime/rules/default-rules.yaml)."""
    return list(_default_rules())


@lru_cache(maxsize=1)
def _default_rules() -> tuple[Rule, ...]:
    return tuple(load_rules(DEFAULT_RULES_PATH))


def _parse(data: str | bytes | RawMapping | list[object] | Path) -> object:
    if isinstance(data, (dict, list)):
        return data
    if isinstance(data, Path):
        path = data
        try:
            data = path.read_bytes()
        except OSError as error:
            raise RuleError([("", f"cannot read rule file {path}: {error.strerror or error}")]) from None
    if not isinstance(data, (str, bytes)):
        raise RuleError([("", f"expected YAML text, a mapping or a path, got {type(data).__name__}")])
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError as error:
        raise RuleError([("", f"not valid YAML: {error}")]) from None
    if isinstance(document, str) and isinstance(data, str) and "\n" not in data.strip():
        # A lone word is never a rule set; a file name given as text (e.g. from
        # a config setting) is read as the file it names.
        return _parse(Path(data.strip()))
    if not isinstance(document, (dict, list)):
        raise RuleError([("", "expected a mapping with `spec:` or a list of rules")])
    return document
