"""Compiling rule regexes so that no rule can stall the runtime.

Two layers keep a pathological regex or log from hurting the service:

1. Matching uses RE2 (`google-re2`), an automaton engine whose running time is
   linear in the size of the text, whatever the regex. Logs are cut to their
   last 64 KiB before matching, so one classification is bounded.
2. A rule's regex is refused up front when it is risky anyway, so rules stay
   safe to copy into tools that use a backtracking engine (Python `re`, PCRE):
   - longer than `MAX_REGEX_LENGTH` characters, or empty;
   - not valid RE2: backreferences and look-around are not available;
   - a repeated group that itself contains an unbounded repeat, e.g. `(a+)+`,
     `(.*)*`, `(\\w+\\s?){2,}`: the classic shape of catastrophic backtracking;
   - compiling to more than `MAX_PROGRAM_SIZE` RE2 instructions (large counted
     repeats such as `\\w{500}` blow up the automaton).

Regexes are written in the common syntax of Python `re` and RE2: inline flags
`(?i)`, `(?m)`, `(?s)`, classes, `\\d \\s \\w \\b`, non-greedy repeats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Protocol

import re2

MAX_REGEX_LENGTH = 512
MAX_PROGRAM_SIZE = 2000
# Memory RE2 may use per compiled regex or regex set; the automaton's cache
# lives in it. Generous, so that searching 64 KiB never runs out of it.
REGEX_MAX_MEMORY = 64 << 20

_COUNTED_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")


def re2_options() -> re2.Options:
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEMORY
    # A refused regex is reported to the admin; RE2 must not also print it.
    options.log_errors = False
    return options


_OPTIONS = re2_options()


class RegexMatch(Protocol):
    def start(self) -> int: ...


class Regex(Protocol):
    """What PAI uses of a compiled RE2 regex (google-re2 ships no type information)."""

    @property
    def pattern(self) -> str: ...

    @property
    def programsize(self) -> int: ...

    def search(self, text: bytes) -> RegexMatch | None: ...

    def finditer(self, text: bytes) -> Iterator[RegexMatch]: ...


def compile_regex(pattern: str) -> Regex:
    """Compile with RE2; raises ValueError with RE2's reason when invalid."""
    try:
        compiled: Regex = re2.compile(pattern, _OPTIONS)
        return compiled
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(str(reason)) from None


def regex_problems(pattern: object) -> list[str]:
    """Why this regex is refused as a rule pattern; empty when it is fine."""
    if not isinstance(pattern, str):
        return [f"must be a string (a regular expression), got {type(pattern).__name__}"]
    if not pattern:
        return ["an empty regex matches everything; leave the field out instead"]
    if len(pattern) > MAX_REGEX_LENGTH:
        return [f"longer than {MAX_REGEX_LENGTH} characters ({len(pattern)})"]
    try:
        compiled = compile_regex(pattern)
    except ValueError as error:
        return [
            f"not a valid regex ({error}); use the RE2 syntax: no backreferences or look-around"
        ]
    nested = _nested_quantifier(pattern)
    if nested is not None:
        return [
            f"nested quantifier at offset {nested}: a repeated group containing `*`, `+` or "
            "`{n,}` can run for exponential time on backtracking engines; "
            "repeat the inner part once, e.g. `(ab+)+` -> `(ab+)`"
        ]
    if compiled.programsize > MAX_PROGRAM_SIZE:
        return [
            f"too complex: {compiled.programsize} automaton instructions "
            f"(at most {MAX_PROGRAM_SIZE}); use smaller counted repeats"
        ]
    return []


def _nested_quantifier(pattern: str) -> int | None:
    """The offset of the first repeat applied to a group that itself contains an
    unbounded repeat, or None.

    A small scanner rather than a full parser: it only needs to know group
    nesting, what is escaped or inside a character class, and where repeats are.
    """
    # One flag per open group: does it contain an unbounded repeat?
    has_unbounded = [False]
    previous: str | bool | None = None  # "atom", a closed group's flag, or None
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\":
            i = _skip_escape(pattern, i)
            previous = "atom"
        elif char == "[":
            i = _skip_class(pattern, i)
            previous = "atom"
        elif char == "(":
            has_unbounded.append(False)
            i = _skip_group_header(pattern, i + 1)
            previous = None
        elif char == ")":
            inner = has_unbounded.pop() if len(has_unbounded) > 1 else False
            has_unbounded[-1] = has_unbounded[-1] or inner
            previous = inner
            i += 1
        elif char == "|":
            previous = None
            i += 1
        elif char in "*+?" or (char == "{" and _COUNTED_REPEAT.match(pattern, i)):
            start = i
            unbounded, repeats, i = _read_quantifier(pattern, i)
            if previous is True and repeats:
                return start
            if unbounded:
                has_unbounded[-1] = True
            previous = "quantified"
        else:
            previous = "atom"
            i += 1
    return None


def _skip_escape(pattern: str, i: int) -> int:
    # `\x{41}`, `\p{Greek}`, `\P{Greek}` carry braces; anything else is 2 chars.
    if i + 2 < len(pattern) and pattern[i + 1] in "xpP" and pattern[i + 2] == "{":
        close = pattern.find("}", i + 3)
        return len(pattern) if close == -1 else close + 1
    return i + 2


def _skip_class(pattern: str, i: int) -> int:
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":  # a leading `]` is literal
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        if pattern[j] == "\\":
            j += 2
        elif pattern.startswith("[:", j) and ":]" in pattern[j + 2 :]:
            j = pattern.index(":]", j + 2) + 2
        else:
            j += 1
    return j + 1


def _skip_group_header(pattern: str, i: int) -> int:
    """Skip `?:`, `?i:`, `?P<name>`, `?<name>`; stop before `)` of `(?i)`."""
    if i >= len(pattern) or pattern[i] != "?":
        return i
    if pattern.startswith("?P<", i) or pattern.startswith("?<", i):
        close = pattern.find(">", i)
        return len(pattern) if close == -1 else close + 1
    j = i + 1
    while j < len(pattern) and pattern[j] not in ":)":
        j += 1
    return j + 1 if j < len(pattern) and pattern[j] == ":" else j


def _read_quantifier(pattern: str, i: int) -> tuple[bool, bool, int]:
    """(is unbounded, may repeat more than once, index after it)."""
    char = pattern[i]
    if char == "{":
        counted = _COUNTED_REPEAT.match(pattern, i)
        assert counted is not None
        low = int(counted.group(1))
        has_comma, high = counted.group(2) is not None, counted.group(3)
        unbounded = has_comma and not high
        repeats = unbounded or (int(high) if has_comma else low) > 1
        i = counted.end()
    else:
        unbounded = char in "*+"
        repeats = unbounded
        i += 1
    if i < len(pattern) and pattern[i] in "?+":  # lazy or possessive suffix
        i += 1
    return unbounded, repeats, i
