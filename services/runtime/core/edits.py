"""The edits admins make to the rule set, and its stored form.

The whole ordered rule set is one value in OpenPAI's exit-spec file format
(`spec:` list) plus who changed it and when; `spec: null` (what a reset writes)
means "the rule set PAI starts with": the shipped defaults or the configured
rules file.

The edits are pure functions of the current rule list; they validate with the
same checks as a rule file, so codes and phrases stay unique and every regex
is one RE2 runs in linear time.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.exitspecs import CATCH_ALL_CODES
from libs.common.protocol.paths import RawMapping
from libs.common.rules_messages import NoSuchRule
from services.runtime.core.loading import load_rules
from services.runtime.core.model import Rule
from services.runtime.core.validation import RuleError, validate_rule


class StoredRuleSet(msgspec.Struct, frozen=True, kw_only=True):
    spec: list[dict[str, Any]] | None = None  # None: the rule set PAI starts with
    changedBy: str = ""
    changedAt: float = 0.0


def decode_stored(value: bytes | None) -> StoredRuleSet | None:
    """The stored rule set; None when nothing is stored.

    Raises RuleError for a value PAI did not write (e.g. edited by hand)."""
    if not value:
        return None
    try:
        return msgspec.json.decode(value, type=StoredRuleSet)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise RuleError([("", f"the stored rule set is not readable: {error}")]) from None


def stored_rules(stored: StoredRuleSet) -> list[Rule] | None:
    """The rules of a stored set, checked again; None for "as PAI starts"."""
    if stored.spec is None:
        return None
    return load_rules({"spec": stored.spec})


def to_stored(rules: list[Rule] | None, *, by: str, at: float) -> StoredRuleSet:
    spec = None if rules is None else [rule.to_dict() for rule in rules]
    return StoredRuleSet(spec=spec, changedBy=by, changedAt=at)


def index_of(rules: list[Rule], code: int) -> int:
    for index, rule in enumerate(rules):
        if rule.code == code:
            return index
    raise NoSuchRule(f"no rule with code {code}")


def add_rule(
    rules: list[Rule], data: RawMapping, *, position: int | None = None, before: int | None = None
) -> tuple[list[Rule], int]:
    """The rule set with the admin's new rule in it, and the rule's index.
    A new rule goes before the catch-all rules unless the admin chooses its place."""
    rule = validate_rule(data, existing=rules)
    default = next((i for i, r in enumerate(rules) if r.code in CATCH_ALL_CODES), len(rules))
    index = _placement(rules, position=position, before=before, default=default)
    return rules[:index] + [rule] + rules[index:], index


def change_rule(
    rules: list[Rule], code: int, data: RawMapping, *, position: int | None = None, before: int | None = None
) -> tuple[list[Rule], int]:
    """The rule set with rule `code` replaced by the admin's version of it,
    in the same place unless `position` or `before` moves it."""
    old = index_of(rules, code)
    rule = validate_rule({"code": code, **data}, existing=rules, replacing=code)
    if before == code:
        raise RuleError([("before", "a rule cannot go before itself")])
    others = rules[:old] + rules[old + 1 :]
    index = _placement(others, position=position, before=before, default=old)
    return others[:index] + [rule] + others[index:], index


def delete_rule(rules: list[Rule], code: int) -> tuple[list[Rule], int]:
    """The rule set without rule `code`, and the index the rule had."""
    index = index_of(rules, code)
    return rules[:index] + rules[index + 1 :], index


def _placement(rules: list[Rule], *, position: int | None, before: int | None, default: int) -> int:
    if position is not None and before is not None:
        raise RuleError([("position", "give either position or before, not both")])
    if position is not None:
        if not 0 <= position <= len(rules):
            raise RuleError([("position", f"must be between 0 and {len(rules)}, got {position}")])
        return position
    if before is not None:
        for index, rule in enumerate(rules):
            if rule.code == before:
                return index
        raise RuleError([("before", f"no rule with code {before} to go before")])
    return default
