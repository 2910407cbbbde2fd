"""The rules in effect and how admins change them: versions, edits, replies.

`RuleBook` is this replica's view of the rule set: the version in effect (by
bucket revision, only ever forward, whatever order changes arrive in) and its
compiled engine, swapped together. Admin commands are answered in two steps so
the shell only moves bytes:

    plan(request, stored value, revision, now) -> Edit | RulesReply
        the new stored value to write with `last=revision`, or the answer
        (LIST/GET, a stale revision, an invalid rule) when nothing is written;
    commit(edit, new revision) -> RulesReply
        the write succeeded: install the new version, and the admin's answer.

A write that loses the race (someone wrote first) is simply planned again on
top of the winner's value. Pure: no I/O, the clock passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from libs.common.rules_messages import NoSuchRule, Outcome, RuleAction, RuleProblem, RuleSource, RulesReply, RulesRequest
from services.runtime.core.edits import (
    add_rule,
    change_rule,
    decode_stored,
    delete_rule,
    index_of,
    stored_rules,
    to_stored,
)
from services.runtime.core.engine import RuleEngine
from services.runtime.core.model import Rule
from services.runtime.core.validation import RuleError

# NATS refuses messages over 1 MiB; a rule set this size is hundreds of rules.
MAX_STORED_BYTES = 512 * 1024

_DONE = {RuleAction.ADD: "added", RuleAction.CHANGE: "changed", RuleAction.DELETE: "deleted"}


class RuleSet(msgspec.Struct, frozen=True, kw_only=True):
    """One version of the rules, with where it came from."""

    rules: tuple[Rule, ...]
    source: RuleSource
    revision: int = 0  # of the bucket's `rules` key; 0 before any change at run time
    changedBy: str = ""
    changedAt: float = 0.0


@dataclass(frozen=True)
class Edit:
    """A planned change: what to write, and what it becomes once written."""

    request: RulesRequest
    value: bytes  # the stored rule set to write
    last: int  # the revision it was planned on
    rules: tuple[Rule, ...] | None  # None: back to the baseline
    changedBy: str
    changedAt: float
    focus: Rule | None  # the rule the admin named, for the answer
    index: int | None
    engine: RuleEngine | None  # compiled while planning (it checks the regexes together)


class RuleBook:
    def __init__(self, baseline: RuleSet):
        self.baseline = baseline
        self.current = baseline
        self.engine = RuleEngine(list(baseline.rules))
        self._unreadable_revision = -1

    # --- versions ------------------------------------------------------------------

    def resolve(self, value: bytes | None, revision: int) -> RuleSet:
        """The rule set a bucket value stands for; RuleError when it is unreadable."""
        if revision == self.current.revision:
            return self.current
        stored = decode_stored(value)
        rules = stored_rules(stored) if stored is not None else None
        if stored is None or rules is None:
            return msgspec.structs.replace(
                self.baseline,
                revision=revision,
                changedBy=stored.changedBy if stored else "",
                changedAt=stored.changedAt if stored else 0.0,
            )
        return RuleSet(
            rules=tuple(rules),
            source=RuleSource.ADMIN,
            revision=revision,
            changedBy=stored.changedBy,
            changedAt=stored.changedAt,
        )

    def install(self, rule_set: RuleSet, engine: RuleEngine | None = None) -> bool:
        """Put `rule_set` in effect if it is newer than the one in effect."""
        if rule_set.revision <= self.current.revision:
            return False
        self.engine = engine or RuleEngine(list(rule_set.rules))
        self.current = rule_set
        return True

    def follow(self, value: bytes | None, revision: int) -> str | None:
        """Take up a change seen in the bucket. An unreadable one is reported
        once (the returned problem) and the rules in effect stay: classifying
        must go on."""
        if revision <= self.current.revision or revision == self._unreadable_revision:
            return None
        try:
            self.install(self.resolve(value, revision))
        except RuleError as error:
            self._unreadable_revision = revision
            return error.message
        return None

    # --- admin commands ----------------------------------------------------------------

    def plan(self, request: RulesRequest, value: bytes | None, revision: int, *, now: float) -> Edit | RulesReply:
        try:
            return self._plan(request, value, revision, now)
        except RuleError as error:
            return invalid(error)
        except NoSuchRule as error:
            return RulesReply(outcome=Outcome.NOT_FOUND, message=error.message)

    def commit(self, edit: Edit, revision: int) -> RulesReply:
        """`edit` is stored at `revision`: put it in effect and answer the admin."""
        if edit.rules is None:
            rule_set = msgspec.structs.replace(
                self.baseline, revision=revision, changedBy=edit.changedBy, changedAt=edit.changedAt
            )
        else:
            rule_set = RuleSet(
                rules=edit.rules,
                source=RuleSource.ADMIN,
                revision=revision,
                changedBy=edit.changedBy,
                changedAt=edit.changedAt,
            )
        self.install(rule_set, edit.engine)
        if edit.focus is None:
            return _reply(rule_set)
        return _reply(rule_set, rules=[edit.focus.to_dict()], position=edit.index)

    @staticmethod
    def describe(edit: Edit, revision: int) -> str:
        what = "reset the rules" if edit.focus is None else f"{_DONE[edit.request.action]} rule {edit.focus.code}"
        return f"{edit.request.by or 'someone'} {what}; rules now at revision {revision}"

    def _plan(self, request: RulesRequest, value: bytes | None, revision: int, now: float) -> Edit | RulesReply:
        _check_arguments(request)
        match request.action:
            case RuleAction.LIST:
                rule_set = self.resolve(value, revision)
                return _reply(rule_set, rules=[rule.to_dict() for rule in rule_set.rules])
            case RuleAction.GET:
                rule_set = self.resolve(value, revision)
                found = index_of(list(rule_set.rules), _code(request))
                return _reply(rule_set, rules=[rule_set.rules[found].to_dict()], position=found)
        if request.revision is not None and request.revision != revision:
            return RulesReply(
                outcome=Outcome.STALE,
                message=(
                    f"the rules changed since revision {request.revision} (now {revision}); "
                    "list them again and redo the change"
                ),
                revision=revision,
            )
        # A reset must work even when the stored rule set cannot be read.
        current = [] if request.action == RuleAction.RESET else list(self.resolve(value, revision).rules)
        new_rules, index = _apply(request, current)
        engine = RuleEngine(new_rules) if new_rules is not None else None
        stored = to_stored(new_rules, by=request.by, at=now)
        encoded = msgspec.json.encode(stored)
        if len(encoded) > MAX_STORED_BYTES:
            raise RuleError([("", f"the rule set would take {len(encoded)} bytes; at most {MAX_STORED_BYTES} fit")])
        if index is None:
            focus = None
        elif request.action == RuleAction.DELETE:
            focus = current[index]
        else:
            assert new_rules is not None  # an edit that places a rule returns the rule set it is in
            focus = new_rules[index]
        return Edit(
            request=request,
            value=encoded,
            last=revision,
            rules=None if new_rules is None else tuple(new_rules),
            changedBy=stored.changedBy,
            changedAt=stored.changedAt,
            focus=focus,
            index=index,
            engine=engine,
        )


def _apply(request: RulesRequest, rules: list[Rule]) -> tuple[list[Rule] | None, int | None]:
    match request.action:
        case RuleAction.ADD:
            return add_rule(rules, _rule(request), position=request.position, before=request.before)
        case RuleAction.CHANGE:
            return change_rule(rules, _code(request), _rule(request), position=request.position, before=request.before)
        case RuleAction.DELETE:
            return delete_rule(rules, _code(request))
        case RuleAction.RESET:
            return None, None
    raise RuleError([("action", f"not an edit: {request.action}")])


def invalid(error: RuleError) -> RulesReply:
    problems = [RuleProblem(path=path, message=message) for path, message in error.errors]
    return RulesReply(outcome=Outcome.INVALID, message=error.message, problems=problems)


_NO_CODE = ("code", "required: the code of the rule")
_NO_RULE = ("rule", "required: the rule in exit-spec format")


def _check_arguments(request: RulesRequest) -> None:
    problems = []
    if request.action in (RuleAction.GET, RuleAction.CHANGE, RuleAction.DELETE) and request.code is None:
        problems.append(_NO_CODE)
    if request.action in (RuleAction.ADD, RuleAction.CHANGE) and request.rule is None:
        problems.append(_NO_RULE)
    if problems:
        raise RuleError(problems)


def _code(request: RulesRequest) -> int:
    """The code of the rule the request is about (`_check_arguments` asked for it)."""
    if request.code is None:
        raise RuleError([_NO_CODE])
    return request.code


def _rule(request: RulesRequest) -> dict[str, Any]:
    """The rule the request brings (`_check_arguments` asked for it)."""
    if request.rule is None:
        raise RuleError([_NO_RULE])
    return request.rule


def _reply(rule_set: RuleSet, *, rules: list[dict[str, Any]] | None = None, position: int | None = None) -> RulesReply:
    return RulesReply(
        outcome=Outcome.OK,
        rules=rules or [],
        position=position,
        revision=rule_set.revision,
        source=rule_set.source,
        changedBy=rule_set.changedBy,
        changedAt=rule_set.changedAt,
    )
