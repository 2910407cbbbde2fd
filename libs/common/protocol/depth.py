"""How deeply a body nests, found before any loader builds it.

PyYAML's C composer recurses once per level and takes the whole process down at
about 25,000 levels; json and the Python composer raise RecursionError far
earlier. Both are checked here without recursion: YAML on the parser's event
stream (libyaml's parser keeps its own stack, so scanning events is safe at any
depth), JSON by counting brackets outside strings.
"""

from __future__ import annotations

import re

import yaml

from libs.common.protocol.limits import MAX_NESTING_DEPTH

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENING_EVENTS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSING_EVENTS = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
# How libyaml (PyYAML 6.0.4 on) refuses a text nesting past its own bound (1,000
# levels, far above MAX_NESTING_DEPTH): its scanner looks ahead, so this can come
# before the parser has handed over as many levels as the limit.
_LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"
# A JSON string (escapes included) or one bracket: strings are skipped whole.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class NestingTooDeep(ValueError):
    def __init__(self, limit: int, line: int | None):
        self.limit = limit
        self.line = line
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"the body nests mappings and lists more than {limit} levels deep{where}")


# Every mapping or list a YAML (or JSON) text opens starts at one of these
# characters of its own: `-` (a block list's first entry), `?` or `:` (a mapping's
# first key), `[` or `{` (flow collections). A text holding no more of them than
# the limit cannot nest deeper than the limit, whatever else it holds.
_OPENERS = "-?:[{"


def cannot_nest_deeper_than(text: str, limit: int = MAX_NESTING_DEPTH) -> bool:
    """True when `text` is certainly no deeper than `limit`, by counting characters
    (most job files: the event scan below is then not needed)."""
    total = 0
    for opener in _OPENERS:
        total += text.count(opener)
        if total > limit:
            return False
    return True


def check_yaml_depth(text: str, limit: int = MAX_NESTING_DEPTH) -> None:
    """Raise NestingTooDeep when the YAML (or JSON) text nests deeper than `limit`.

    A syntax error stops the scan quietly: the loader meets the same error at
    the same place, before it has nested any deeper than seen here. Except
    libyaml's own nesting bound, which is deeper than `limit`: that text is too deep.
    """
    depth = 0
    loader = _YamlLoader(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, _OPENING_EVENTS):
                depth += 1
                if depth > limit:
                    mark = event.start_mark
                    raise NestingTooDeep(limit, mark.line + 1 if mark is not None else None)
            elif isinstance(event, _CLOSING_EVENTS):
                depth -= 1
    except yaml.YAMLError as error:
        if _LIBYAML_TOO_DEEP in str(getattr(error, "problem", "") or ""):
            mark = getattr(error, "problem_mark", None)
            raise NestingTooDeep(limit, mark.line + 1 if mark is not None else None) from None
        return
    finally:
        loader.dispose()


def check_json_depth(text: str, limit: int = MAX_NESTING_DEPTH) -> None:
    """Raise NestingTooDeep when the JSON text nests deeper than `limit`."""
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        kind = token.group()
        if kind in "[{":
            depth += 1
            if depth > limit:
                raise NestingTooDeep(limit, text.count("\n", 0, token.start()) + 1)
        elif kind in "]}":
            depth -= 1
