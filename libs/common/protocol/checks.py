"""The collector every validation step writes to, and its small typed checks.

Validation never stops at the first problem: each check records a FieldError and
tells the caller whether the value is usable, so later checks can skip what
depends on a broken value instead of piling up follow-on errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeGuard

import msgspec

from libs.common.protocol.document import type_name
from libs.common.protocol.model import FieldError
from libs.common.protocol.paths import DocPath, RawMapping, format_path

# Task role names and port labels become parts of environment variable names
# (PAI_TASK_ROLE_TASK_COUNT_<role>), so the schema asks for C identifiers.
IDENTIFIER_PATTERN = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# The usual cause of a mapping where a command was meant.
QUOTE_HINT = " (YAML reads a line holding ': ' as a mapping: quote the whole line)"


class Ignored(msgspec.Struct, frozen=True, kw_only=True):
    """A field PAI keeps in the job's config but does not act on."""

    path: DocPath
    reason: str


class Checker:
    def __init__(self, line_of: Callable[[DocPath], int | None]):
        self._line_of = line_of
        self.errors: list[FieldError] = []
        self.ignored: list[Ignored] = []

    def error(self, path: DocPath, rule: str, message: str) -> None:
        self.errors.append(FieldError(path=format_path(path), rule=rule, message=message, line=self._line_of(path)))

    def ignore(self, path: DocPath, reason: str) -> None:
        self.ignored.append(Ignored(path=path, reason=reason))

    # Each check below returns True when the value is of the expected shape (TypeGuard:
    # the type checker then knows it in the caller's branch).

    def mapping(self, value: object, path: DocPath) -> TypeGuard[RawMapping]:
        if isinstance(value, dict):
            return True
        self.error(path, "type", f"must be a mapping, not {type_name(value)}")
        return False

    def string(self, value: object, path: DocPath, *, non_empty: bool = False) -> TypeGuard[str]:
        if not isinstance(value, str):
            self.error(path, "type", f"must be a string, not {type_name(value)}")
            return False
        if non_empty and not value.strip():
            self.error(path, "minLength", "must not be empty")
            return False
        return True

    def text(self, value: object, path: DocPath) -> bool:
        """Free text such as `version: 1.0`: any single value, as OpenPAI files write numbers there."""
        if isinstance(value, (dict, list)):
            self.error(path, "type", f"must be a single value, not {type_name(value)}")
            return False
        return True

    def boolean(self, value: object, path: DocPath) -> TypeGuard[bool]:
        if isinstance(value, bool):
            return True
        self.error(path, "type", f"must be true or false, not {type_name(value)}")
        return False

    def integer(self, value: object, path: DocPath, *, minimum: int | None = None,
                maximum: int | None = None, limit: str = "") -> TypeGuard[int]:
        """`limit` names PAI's bound behind `maximum` for the message (see limits.py)."""
        # YAML reads `yes` as a boolean, and bool is an int in Python: reject it explicitly.
        if not isinstance(value, int) or isinstance(value, bool):
            self.error(path, "type", f"must be an integer, not {type_name(value)}")
            return False
        if minimum is not None and value < minimum:
            self.error(path, "minimum", f"must be at least {minimum}, got {_short(value)}")
            return False
        if maximum is not None and value > maximum:
            self.error(path, "maximum", f"must be at most {maximum}{f' ({limit})' if limit else ''}, got {_short(value)}")
            return False
        return True

    def max_length(self, value: str, path: DocPath, maximum: int, what: str) -> bool:
        if len(value) <= maximum:
            return True
        self.error(path, "maxLength", f"a {what} is at most {maximum} characters, got {len(value)}")
        return False

    def string_list(self, value: object, path: DocPath, *, non_empty: bool) -> TypeGuard[list[str]]:
        if not isinstance(value, list):
            self.error(path, "type", f"must be a list of strings, not {type_name(value)}")
            return False
        if non_empty and not value:
            self.error(path, "minItems", "must list at least one item")
            return False
        ok = True
        for index, item in enumerate(value):
            if not isinstance(item, str):
                hint = QUOTE_HINT if isinstance(item, dict) else ""
                self.error((*path, index), "type", f"must be a string, not {type_name(item)}{hint}")
                ok = False
        return ok

    def pattern(self, value: str, path: DocPath, pattern: re.Pattern[str], what: str) -> bool:
        if pattern.match(value):
            return True
        self.error(path, "pattern", f"{value!r} is not a valid {what}: use only {_describe(pattern)}")
        return False

    def known_keys(self, mapping: RawMapping, path: DocPath, known: Iterable[str]) -> None:
        """Reject keys the schema does not allow here (`additionalProperties: false`)."""
        allowed = sorted(known)
        for key in mapping:
            if key not in allowed:
                self.error((*path, str(key)), "unknown_key",
                           f"unknown key {str(key)!r}; allowed here: {', '.join(allowed)}")

    def required(self, mapping: RawMapping, path: DocPath, keys: Iterable[str]) -> bool:
        ok = True
        for key in keys:
            if key not in mapping:
                self.error((*path, key), "required", f"{key!r} is required")
                ok = False
        return ok


def _short(number: int) -> str:
    """A number for a message: 10**30 is not worth 31 digits."""
    if number.bit_length() <= 64:
        return str(number)
    return f"a number of about {int(number.bit_length() * 0.30103) + 1} digits"


def _describe(pattern: re.Pattern[str]) -> str:
    if pattern.pattern == IDENTIFIER_PATTERN.pattern:
        return "letters, digits and _ , not starting with a digit"
    return "letters, digits, _ and -"
