"""The job files people write, read without PyYAML's composer: block mappings and
lists of one-line scalars and one-line flow collections.

Why: PyYAML's C composer builds a Python node per value, then asks a resolver
chain of regular expressions for each scalar's tag, and the constructor walks
the nodes again; for a typical job that is most of the 50 us a submission
spends in YAML (the profile of rest under a burst: about a fifth of its CPU).
This reader takes one pass over the lines of the common subset and gives
exactly what PyYAML's safe loader gives; anything it is not sure of (anchors,
tags, block scalars, multi-line scalars, quoted keys, escapes, tabs, document
markers, repeated keys, a line it cannot place) makes it answer NOT_SIMPLE,
and the caller reads the text with PyYAML as before, errors and all. A plain
scalar's value is PyYAML's own: its resolver picks the tag and its safe
constructor builds the value (remembered per text: every such value is
immutable). tests/unit/protocol/test_blockyaml.py holds it against PyYAML.
"""

from __future__ import annotations

import re

import yaml

from libs.common.protocol.paths import RawMapping

NOT_SIMPLE = object()

# Characters PyYAML reads as printable and not as a line break or tab (\x85,
# \u2028 and \u2029 break lines in YAML; a BOM inside the text is left to PyYAML).
_SIMPLE_TEXT = re.compile("[\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*")
# A block mapping's key: a plain scalar of word characters, then a colon ending the line or followed by a space.
_KEY = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-/]*):(?: +|$)")
# Characters that may not start a plain scalar here (YAML indicators); "-" is allowed before a non-space.
_NOT_PLAIN_START = frozenset("-?:,[]{}#&*!|>'\"%@` ")
# A plain scalar inside a flow collection: no indicator first, no flow indicator, colon, quote or comment inside.
_FLOW_PLAIN = re.compile(r"(?:[^-?:,\[\]{}#&*!|>'\"%@` ]|-[^ ,\[\]{}#:'\"])[^,\[\]{}#:'\"]*")

_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
# Tags whose safe constructor depends on the scalar's text alone.
_PLAIN_TAGS = frozenset({"tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                         "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:timestamp"})
# The first characters for which the resolver tries a type; a plain scalar starting
# with any other is a string (job names, commands, most values: nothing to remember).
# (None: a resolver for any first character, which the safe loader has not.)
_TYPED_STARTS = frozenset(_RESOLVER.yaml_implicit_resolvers) | {""}
_SOME_STARTS_UNTYPED = None not in _TYPED_STARTS
_PLAIN_VALUES: dict[str, object] = {}
_PLAIN_VALUES_MAX = 4096


class _NotSimple(Exception):
    pass


def load_simple(text: str) -> object:
    """What yaml.safe_load(text) gives, or NOT_SIMPLE when the text is outside the
    subset this reader is sure of (then nothing is known: not even that it is YAML)."""
    if "\t" in text or "\r" in text or not _SIMPLE_TEXT.fullmatch(text):
        return NOT_SIMPLE
    lines: list[tuple[int, str]] = []
    for line in text.split("\n"):
        content = line.lstrip(" ")
        if not content or content[0] == "#":
            continue
        column = len(line) - len(content)
        if column == 0 and (content.startswith(("---", "...", "%"))):
            return NOT_SIMPLE  # document markers and directives
        lines.append((column, content.rstrip(" ")))
    if not lines:
        return NOT_SIMPLE
    reader = _Reader(lines)
    try:
        data = reader.block(lines[0][0])
    except (_NotSimple, ValueError, OverflowError):
        return NOT_SIMPLE  # ValueError: left for PyYAML to refuse in its own words
    if reader.at < len(lines):
        return NOT_SIMPLE
    return data


class _Reader:
    __slots__ = ("at", "lines")

    def __init__(self, lines: list[tuple[int, str]]):
        self.lines = lines
        self.at = 0

    def block(self, column: int) -> object:
        """The block node whose first line is the current one, at `column`."""
        content = self.lines[self.at][1]
        if content == "-" or content.startswith("- "):
            return self.sequence(column, indentless=False)
        if _KEY.match(content):
            return self.mapping(column)
        raise _NotSimple  # a scalar on a line of its own, or something else

    def mapping(self, column: int) -> RawMapping:
        lines = self.lines
        mapping: RawMapping = {}
        keys: set[str] = set()
        while self.at < len(lines):
            line_column, content = lines[self.at]
            if line_column < column:
                break
            if line_column > column:
                raise _NotSimple
            found = _KEY.match(content)
            if found is None:
                raise _NotSimple
            key_text = found.group(1)
            if key_text in keys:
                raise _NotSimple  # PyYAML's path reports the repeated key with its line
            keys.add(key_text)
            key = _plain(key_text)
            rest = content[found.end():]
            self.at += 1
            if rest and rest[0] != "#":
                mapping[key] = _inline(rest)
                continue
            following = lines[self.at] if self.at < len(lines) else None
            if following is not None and following[0] > column:
                mapping[key] = self.block(following[0])
            elif following is not None and following[0] == column and (
                    following[1] == "-" or following[1].startswith("- ")):
                mapping[key] = self.sequence(column, indentless=True)
            else:
                mapping[key] = None
        return mapping

    def sequence(self, column: int, *, indentless: bool) -> list[object]:
        lines = self.lines
        items: list[object] = []
        while self.at < len(lines):
            line_column, content = lines[self.at]
            if line_column < column:
                break
            if line_column > column:
                raise _NotSimple
            if content != "-" and not content.startswith("- "):
                if indentless:
                    break  # the next key of the mapping this list is a value of
                raise _NotSimple
            spaces = len(content) - 1 - len(content[1:].lstrip(" "))
            rest = content[1 + spaces:]
            if not rest or rest[0] == "#":
                self.at += 1
                following = lines[self.at] if self.at < len(lines) else None
                if following is not None and following[0] > column:
                    items.append(self.block(following[0]))
                else:
                    items.append(None)
            elif rest == "-" or rest.startswith("- ") or _KEY.match(rest):
                # A compact nested node ("- - a", "- key: value"): the rest of the line
                # stands as a line of its own at its column.
                lines[self.at] = (column + 1 + spaces, rest)
                items.append(self.block(column + 1 + spaces))
            else:
                self.at += 1
                items.append(_inline(rest))
        return items


def _inline(text: str) -> object:
    """A value on the rest of a line: a quoted or plain scalar, or a flow collection."""
    first = text[0]
    if first in "[{":
        value, end = _flow(text, 0)
        _expect_line_end(text, end)
        return value
    if first in "'\"":
        value, end = _quoted(text, 0)
        _expect_line_end(text, end)
        return value
    if first in _NOT_PLAIN_START and not (first == "-" and len(text) > 1 and text[1] != " "):
        raise _NotSimple
    comment = text.find(" #")
    if comment >= 0:
        text = text[:comment].rstrip(" ")
    if ": " in text or text.endswith(":"):
        raise _NotSimple  # a mapping where a scalar was expected: PyYAML refuses it
    return _plain(text)


def _expect_line_end(text: str, end: int) -> None:
    rest = text[end:]
    if rest and not (rest[0] == " " and rest.lstrip(" ").startswith("#")):
        raise _NotSimple


def _quoted(text: str, start: int) -> tuple[str, int]:
    """A one-line quoted scalar at `start`: (its value, the index after it). Double
    quotes with an escape are left to PyYAML."""
    quote = text[start]
    if quote == '"':
        end = text.find('"', start + 1)
        if end < 0 or "\\" in text[start + 1:end]:
            raise _NotSimple
        return text[start + 1:end], end + 1
    parts = []
    at = start + 1
    while True:
        end = text.find("'", at)
        if end < 0:
            raise _NotSimple  # the scalar goes on to the next line
        parts.append(text[at:end])
        if text.startswith("''", end):
            parts.append("'")
            at = end + 2
        else:
            return "".join(parts), end + 1


# Flow collections without nesting, quotes or comments (`{cpu: 1, gpu: 0}`, `[a, b]`),
# and lists of double-quoted strings without escapes (`["true"]`): read by splitting.
_FLAT_FLOW = re.compile(r"\{([^\[\]{}'\"#]*)\}|\[([^\[\]{}'\"#]*)\]")
_QUOTED_LIST = re.compile(r'\[((?: *"[^"\\]*" *,)* *"[^"\\]*" *,? *)\]')
_QUOTED_ITEM = re.compile(r'"([^"\\]*)"')


def _flow(text: str, start: int) -> tuple[object, int]:
    """A one-line flow list or mapping at `start`: (its value, the index after it)."""
    flat = _FLAT_FLOW.match(text, start)
    if flat is not None:
        inner = flat.group(1)
        body = inner if inner is not None else flat.group(2)
        if not body.strip(" "):
            return ({} if inner is not None else []), flat.end()
        pieces = body.split(",")
        if len(pieces) > 1 and not pieces[-1].strip(" "):
            pieces.pop()  # a trailing comma; an empty piece anywhere else is refused below
        if inner is None:
            return [_flow_plain(piece) for piece in pieces], flat.end()
        mapping: dict[str, str] = {}
        for piece in pieces:
            key_text, colon, value_text = piece.partition(": ")
            key_text = key_text.strip(" ")
            if not colon or key_text in mapping or not key_text:
                raise _NotSimple  # a key without a value, or a repeated one (see below)
            mapping[key_text] = value_text
        return {_flow_plain(key): _flow_plain(value) for key, value in mapping.items()}, flat.end()
    quoted = _QUOTED_LIST.match(text, start)
    if quoted is not None:
        return _QUOTED_ITEM.findall(quoted.group(1)), quoted.end()
    return _nested_flow(text, start)


def _flow_plain(text: str) -> object:
    text = text.strip(" ")
    if not _FLOW_PLAIN.fullmatch(text):
        raise _NotSimple
    return _plain(text)


def _nested_flow(text: str, start: int) -> tuple[object, int]:
    closing = "]" if text[start] == "[" else "}"
    items: list[object] = []
    mapping: RawMapping = {}
    keys: set[str] = set()
    at = _skip_spaces(text, start + 1)
    while True:
        if at >= len(text):
            raise _NotSimple  # goes on to the next line
        if text[at] == closing:
            return (items if closing == "]" else mapping), at + 1
        if closing == "]":
            item, at = _flow_node(text, at)
            items.append(item)
        else:
            if text[at] in "[{":
                raise _NotSimple  # a collection as a key
            key_start = at
            key, at = _flow_node(text, at)
            if not text.startswith(": ", at):
                raise _NotSimple  # a key without a value, or "a:b"
            key_text = text[key_start:at]
            if key_text in keys:
                raise _NotSimple
            keys.add(key_text)
            value, at = _flow_node(text, _skip_spaces(text, at + 2))
            mapping[key] = value
        at = _skip_spaces(text, at)
        if at < len(text) and text[at] == ",":
            at = _skip_spaces(text, at + 1)
        elif at >= len(text) or text[at] != closing:
            raise _NotSimple


def _flow_node(text: str, at: int) -> tuple[object, int]:
    if at >= len(text):
        raise _NotSimple
    first = text[at]
    if first in "[{":
        return _flow(text, at)
    if first in "'\"":
        return _quoted(text, at)
    found = _FLOW_PLAIN.match(text, at)
    if found is None:
        raise _NotSimple
    return _plain(found.group().rstrip(" ")), found.end()


def _skip_spaces(text: str, at: int) -> int:
    while at < len(text) and text[at] == " ":
        at += 1
    return at


def _plain(text: str) -> object:
    """A plain scalar's value, as PyYAML's resolver and safe constructor make it."""
    if _SOME_STARTS_UNTYPED and text[:1] not in _TYPED_STARTS:
        return text
    value = _PLAIN_VALUES.get(text, _PLAIN_VALUES)
    if value is not _PLAIN_VALUES:
        return value
    tag = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]  # untyped in PyYAML's stubs
    if tag not in _PLAIN_TAGS:
        raise _NotSimple  # "<<" or "=": PyYAML's full constructor decides
    value = _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, yaml.ScalarNode(tag, text))
    if len(_PLAIN_VALUES) >= _PLAIN_VALUES_MAX:
        _PLAIN_VALUES.clear()
    _PLAIN_VALUES[text] = value
    return value
