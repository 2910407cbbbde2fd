"""The runtime core's rule book: versions only go forward, edits are planned
on a stored value and put in effect once written, every answer comes from here."""

from __future__ import annotations

import msgspec
import pytest

from libs.common.rules_messages import Outcome, RuleAction, RuleSource, RulesReply, RulesRequest
from services.runtime.core import RuleBook, RuleSet, default_rules
from services.runtime.core.edits import StoredRuleSet, to_stored
from services.runtime.core.rulebook import Edit
from tests.unit.runtime.builders import task_exited

NEW_RULE = {
    "code": 42,
    "phrase": "AnswerNotFound",
    "reaction": "NEVER_RETRY",
    "pattern": {"runtimeContainerPatterns": [{"userLogRegex": "no answer"}]},
}


def a_book() -> RuleBook:
    return RuleBook(RuleSet(rules=tuple(default_rules()), source=RuleSource.DEFAULTS))


def written(book: RuleBook, request: RulesRequest, value: bytes | None = None, revision: int = 0) -> RulesReply:
    edit = book.plan(request, value, revision, now=100.0)
    assert isinstance(edit, Edit)
    assert edit.last == revision
    return book.commit(edit, revision + 1)


def test_an_added_rule_is_in_effect_once_written_and_classifies_the_next_exit() -> None:
    book = a_book()
    edit = book.plan(RulesRequest(action=RuleAction.ADD, rule=NEW_RULE, by="admin"), None, 0, now=100.0)
    assert isinstance(edit, Edit)
    assert book.current.revision == 0  # nothing in effect before the write succeeds
    stored = msgspec.json.decode(edit.value, type=StoredRuleSet)
    assert stored.changedBy == "admin" and any(rule["code"] == 42 for rule in stored.spec)

    reply = book.commit(edit, 7)

    assert (reply.outcome, reply.revision, reply.source, reply.rules[0]["code"]) == (Outcome.OK, 7, "admin", 42)
    assert book.engine.classify(task_exited(1, "no answer\n")).spec.code == 42


def test_a_new_rule_goes_before_the_catch_all_rules() -> None:
    book = a_book()
    reply = written(book, RulesRequest(action=RuleAction.ADD, rule=NEW_RULE))
    codes = [rule.code for rule in book.current.rules]
    assert codes.index(42) == reply.position < codes.index(255)


def test_a_change_pinned_to_an_old_revision_is_stale_and_writes_nothing() -> None:
    book = a_book()
    reply = book.plan(RulesRequest(action=RuleAction.DELETE, code=42, revision=3), None, 5, now=1.0)
    assert isinstance(reply, RulesReply) and (reply.outcome, reply.revision) == (Outcome.STALE, 5)


@pytest.mark.parametrize(
    ("request_", "outcome"),
    [
        (RulesRequest(action=RuleAction.DELETE, code=12345), Outcome.NOT_FOUND),
        (RulesRequest(action=RuleAction.CHANGE, code=1), Outcome.INVALID),
        (RulesRequest(action=RuleAction.ADD, rule={"code": 43, "phrase": "Bad", "nonsense": 1}), Outcome.INVALID),
    ],
    ids=["unknown-code", "change-without-rule", "unknown-field"],
)
def test_bad_commands_are_answered_without_a_write(request_: RulesRequest, outcome: Outcome) -> None:
    reply = a_book().plan(request_, None, 0, now=1.0)
    assert isinstance(reply, RulesReply) and reply.outcome == outcome


def test_versions_only_go_forward_and_an_unreadable_one_is_reported_once() -> None:
    book = a_book()
    newer = msgspec.json.encode(to_stored([*default_rules()][:3], by="b", at=2.0))
    assert book.follow(newer, 4) is None and book.current.revision == 4
    older = msgspec.json.encode(to_stored([], by="a", at=1.0))
    assert book.follow(older, 3) is None and len(book.current.rules) == 3
    assert "not readable" in book.follow(b"{not json", 5)
    assert book.follow(b"{not json", 5) is None  # said once
    assert book.current.revision == 4


def test_a_reset_goes_back_to_the_baseline_even_from_an_unreadable_value() -> None:
    book = a_book()
    written(book, RulesRequest(action=RuleAction.ADD, rule=NEW_RULE))
    reply = written(book, RulesRequest(action=RuleAction.RESET, by="admin"), b"{not json", 1)
    assert (reply.outcome, reply.source, reply.revision) == (Outcome.OK, RuleSource.DEFAULTS, 2)
    assert 42 not in [rule.code for rule in book.current.rules]
