"""Decode a submitted body into a plain document plus the line of every path.

YAML is read with PyYAML's safe loader (JSON bodies with the json module); the
composed node tree is kept just long enough to learn the line of each key, so
that validation errors can point at a line of the user's file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, ClassVar, NoReturn

import yaml

from libs.common.protocol.blockyaml import NOT_SIMPLE, load_simple
from libs.common.protocol.depth import NestingTooDeep, cannot_nest_deeper_than, check_json_depth, check_yaml_depth
from libs.common.protocol.model import FieldError, ProtocolError
from libs.common.protocol.paths import DocPath, RawMapping, format_path

# The C loader is much faster on large documents; fall back when PyYAML was built without libyaml.
# (Both are the safe loader to a type checker: the same resolver and constructors.)
if TYPE_CHECKING:
    _BaseLoader = yaml.SafeLoader
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Plain scalars remembered with the tag they resolve to (job files repeat the same
# keys and small values); short ones only, and forgotten all at once when full.
_RESOLVED_MAX = 4096
_RESOLVED_MAX_LENGTH = 64


class _YamlLoader(_BaseLoader):
    """The safe loader, with the implicit tag of a plain scalar remembered: the
    composer asks for it once per scalar, through a chain of regular expressions.
    It depends on the scalar's text alone (the safe loader has no path resolvers)."""

    _resolved: ClassVar[dict[tuple[str, bool, bool], str]] = {}

    def resolve(self, kind: type[yaml.Node], value: str, implicit: tuple[bool, bool]) -> str:
        if kind is not yaml.ScalarNode or len(value) > _RESOLVED_MAX_LENGTH or self.yaml_path_resolvers:
            # PyYAML's stubs leave resolve untyped.
            uncached: str = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
            return uncached
        known = (value, *implicit)
        tag = self._resolved.get(known)
        if tag is None:
            tag = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[known] = tag
        return tag

# Aliases let a small document expand into a huge one ("billion laughs"); anything
# beyond this many nodes after expansion is not a job anybody writes by hand.
MAX_EXPANDED_NODES = 200_000

YAML_TYPES = frozenset({"text/yaml", "application/yaml", "application/x-yaml", "text/x-yaml"})
JSON_TYPES = frozenset({"application/json"})
# No content type, or a plain-text one, is read as YAML (YAML also reads JSON).
LENIENT_TYPES = frozenset({"", "text/plain", "application/octet-stream"})


class Document:
    """A loaded body: its data, and the line of each path. The lines are worked out
    from the YAML nodes when first asked for: only a refusal needs them."""

    __slots__ = ("_lines", "_work_out_lines", "data")

    def __init__(self, data: RawMapping, lines: dict[DocPath, int] | None = None,
                 work_out_lines: Callable[[], dict[DocPath, int]] | None = None):
        self.data = data
        self._lines = lines
        self._work_out_lines = work_out_lines

    @property
    def lines(self) -> dict[DocPath, int]:
        if self._lines is None:
            self._lines = self._work_out_lines() if self._work_out_lines is not None else {}
            self._work_out_lines = None
        return self._lines

    def line_of(self, path: DocPath) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        while path:
            line = self.lines.get(path)
            if line is not None:
                return line
            path = path[:-1]
        return None


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def load_document(body: bytes | str, content_type: str | None) -> Document:
    """Raises ProtocolError (path "$") for bodies that are not one YAML/JSON mapping."""
    kind = media_type(content_type)
    is_json = kind in JSON_TYPES or kind.endswith("+json")
    if not is_json and kind not in YAML_TYPES and kind not in LENIENT_TYPES and not kind.endswith("+yaml"):
        _fail("content_type", f"content type {kind!r} is not supported; send text/yaml or application/json")
    text = _decode_text(body)
    _check_depth(text, is_json)
    work_out_lines: Callable[[], dict[DocPath, int]] | None = None
    if is_json:
        data, repeats_a_key = _load_json(text)
        if repeats_a_key:  # the YAML walk says which, with lines, as it always did
            lines, duplicates = _lines_or_nothing(text)
        else:
            lines, duplicates = None, []
            work_out_lines = partial(_json_lines, text)  # only a refusal asks
    else:
        # The common block-style job is read without PyYAML's composer (blockyaml.py);
        # a text long enough to hold more values than the expansion bound goes to
        # PyYAML, whose path refuses it.
        data = load_simple(text) if 4 * len(text) < MAX_EXPANDED_NODES else NOT_SIMPLE
        if type(data) is dict:
            lines, duplicates = None, []  # blockyaml leaves repeated keys to PyYAML
            work_out_lines = partial(_json_lines, text)  # only a refusal asks
        else:
            data, lines, duplicates, root = _load_yaml(text, may_expand=_may_expand(text))
            if root is not None:
                work_out_lines = partial(_node_lines, root)  # only a refusal asks
    if duplicates:
        raise ProtocolError(duplicates)
    if data is None:
        _fail("required", "the job document is empty")
    if not isinstance(data, dict):
        _fail("type", f"the job document must be a mapping, not {type_name(data)}")
    return Document(data, lines, work_out_lines)


def type_name(value: object) -> str:
    match value:
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "a list"
        case dict():
            return "a mapping"
        case None:
            return "null"
        case _:
            return f"a {type(value).__name__}"


def _fail(rule: str, message: str, line: int | None = None) -> NoReturn:
    raise ProtocolError([FieldError(path="$", rule=rule, message=message, line=line)])


def _check_depth(text: str, is_json: bool) -> None:
    """Refuse a body nested too deeply before a loader recurses into it (see depth.py)."""
    if cannot_nest_deeper_than(text):
        return
    try:
        # A JSON body is composed by the YAML loader too, for its lines.
        if is_json:
            check_json_depth(text)
        check_yaml_depth(text)
    except NestingTooDeep as exc:
        _fail("max_depth", str(exc), exc.line)


def _decode_text(body: bytes | str) -> str:
    if isinstance(body, str):
        return body
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        _fail("encoding", f"the job document is not valid UTF-8 (byte {exc.start})")
    raise AssertionError("unreachable")


def _load_json(text: str) -> tuple[object, bool]:
    """The document, and whether an object in it repeats a key."""
    repeats = False

    def mapping(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal repeats
        built = dict(pairs)
        if len(built) < len(pairs):
            repeats = True
        return built

    try:
        return json.loads(text, object_pairs_hook=mapping), repeats
    except json.JSONDecodeError as exc:
        _fail("json_syntax", f"JSON syntax error: {exc.msg} (column {exc.colno})", exc.lineno)
    except RecursionError:
        _fail("too_complex", "the job document is nested too deeply")
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        _fail("json_syntax", f"JSON value not accepted: {_first_words(exc)}")
    raise AssertionError("unreachable")


def _first_words(exc: Exception) -> str:
    """The start of an error's text, never a piece of the document."""
    return str(exc).split(";", 1)[0][:120]


def _may_expand(text: str) -> bool:
    """Whether the document could hold more than MAX_EXPANDED_NODES values or refer
    to itself: only through an alias (`*name`), or by being long enough to hold that
    many values outright (a value takes at least half a character of the text)."""
    return "*" in text or 4 * len(text) >= MAX_EXPANDED_NODES


def _load_yaml(text: str, *, may_expand: bool = True
               ) -> tuple[object, dict[DocPath, int] | None, list[FieldError], yaml.Node | None]:
    """(data, the line of each path or None when left to be worked out from the
    returned root node, duplicate keys found)."""
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}, [], None
        if may_expand:
            _check_expansion(node)
        data, repeats_a_key = _construct_plain(loader, node, shares_nodes="&" in text)
        if data is not _NOT_PLAIN and not repeats_a_key:
            return data, None, [], node  # no duplicate key: the lines can wait
        lines, duplicates = _walk_lines(node)
        if data is _NOT_PLAIN:
            data = loader.construct_document(node)
        return data, lines, duplicates, None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        # Only the problem text: a snippet of the document could hold a secret.
        problem = exc.problem or exc.context or "invalid YAML"
        line = mark.line + 1 if mark is not None else None
        where = f" (line {line}, column {mark.column + 1})" if mark is not None else ""
        _fail("yaml_syntax", f"YAML syntax error: {problem}{where}", line)
    except yaml.YAMLError as exc:
        _fail("yaml_syntax", f"YAML syntax error: {type(exc).__name__}")
    except RecursionError:
        _fail("too_complex", "the job document is nested too deeply")
    except ProtocolError:
        raise  # a ValueError too, raised on purpose above
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        _fail("yaml_syntax", f"YAML value not accepted: {_first_words(exc)}")
    finally:
        loader.dispose()
    raise AssertionError("unreachable")


_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
# Scalar tags whose constructor is a plain function of the node (PyYAML's own).
_SCALAR_TAGS = frozenset({"tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                          "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:timestamp",
                          "tag:yaml.org,2002:binary"})
_STR_TAG = "tag:yaml.org,2002:str"
_NOT_PLAIN = object()
_ScalarNode, _MappingNode, _SequenceNode = yaml.ScalarNode, yaml.MappingNode, yaml.SequenceNode


class _NotPlain(Exception):
    """The document uses what only PyYAML's full constructor handles."""


def _construct_plain(loader: yaml.SafeLoader, root: yaml.Node, *, shares_nodes: bool = True) -> tuple[object, bool]:
    """The document PyYAML's safe constructor makes of `root`, built in one direct
    walk (a job file's mappings, lists and scalars), or `_NOT_PLAIN` when the
    document needs the full constructor: merge keys (`<<`), sets, ordered maps,
    pairs, unknown tags, or a key that is a mapping or list. Each scalar goes
    through PyYAML's own constructor of its tag, so every value is the one
    PyYAML makes; an aliased node is built once and shared, as PyYAML does
    (`shares_nodes`: False when the text has no anchor, so no node is reached twice).
    Also whether a mapping repeats a key's text (what `_walk_lines` reports)."""
    scalar_constructors = {tag: loader.yaml_constructors[tag] for tag in _SCALAR_TAGS}
    built: dict[int, object] = {}
    repeats = False

    def build(node: yaml.Node) -> object:
        if shares_nodes and id(node) in built:
            return built[id(node)]
        kind, tag = type(node), node.tag
        if kind is _ScalarNode:
            if tag == _STR_TAG:
                value: object = node.value
            else:
                construct = scalar_constructors.get(tag)
                if construct is None:
                    raise _NotPlain
                value = construct(loader, node)
            if shares_nodes:
                built[id(node)] = value
            return value
        if kind is _MappingNode and tag == _MAP_TAG:
            mapping: RawMapping = {}
            if shares_nodes:
                built[id(node)] = mapping
            pairs = node.value
            for key_node, _ in pairs:
                if type(key_node) is not _ScalarNode or key_node.tag not in _SCALAR_TAGS:
                    raise _NotPlain  # merge keys, `=` keys, collections as keys
            if len({key_node.value for key_node, _ in pairs}) < len(pairs):
                nonlocal repeats
                repeats = True
            for key_node, value_node in pairs:
                mapping[build(key_node)] = build(value_node)
            return mapping
        if kind is _SequenceNode and tag == _SEQ_TAG:
            items: list[object] = []
            if shares_nodes:
                built[id(node)] = items
            items.extend(map(build, node.value))
            return items
        raise _NotPlain

    try:
        return build(root), repeats
    except _NotPlain:
        return _NOT_PLAIN, repeats


def _lines_or_nothing(text: str) -> tuple[dict[DocPath, int], list[FieldError]]:
    """Lines for a JSON body: JSON is (nearly always) YAML, so reuse the YAML walk."""
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        return _walk_lines(node) if node is not None else ({}, [])
    except (yaml.YAMLError, RecursionError):
        return {}, []
    finally:
        loader.dispose()


def _json_lines(text: str) -> dict[DocPath, int]:
    return _lines_or_nothing(text)[0]


def _node_lines(root: yaml.Node) -> dict[DocPath, int]:
    return _walk_lines(root)[0]


def _check_expansion(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            _fail("too_complex", "the job document refers to itself through an alias", node.start_mark.line + 1)
        in_progress.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        if total > MAX_EXPANDED_NODES:
            _fail("too_complex", f"the job document expands to more than {MAX_EXPANDED_NODES} values through aliases")
        in_progress.discard(key)
        sizes[key] = total
        return total

    size(root)


def _walk_lines(root: yaml.Node) -> tuple[dict[DocPath, int], list[FieldError]]:
    lines: dict[DocPath, int] = {}
    duplicates: list[FieldError] = []
    seen: set[int] = set()

    def walk(node: yaml.Node, path: DocPath) -> None:
        if id(node) in seen:  # an alias: its lines were recorded where it was defined
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys_here: set[str] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.start_mark)
                child = (*path, key)
                line = key_node.start_mark.line + 1
                if key in keys_here and key != "<<":
                    duplicates.append(FieldError(path=format_path(child), rule="duplicate_key",
                                                 message=f"key {key!r} appears more than once", line=line))
                keys_here.add(key)
                lines.setdefault(child, line)
                walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                lines.setdefault(child, item.start_mark.line + 1)
                walk(item, child)

    walk(root, ())
    return lines, duplicates
