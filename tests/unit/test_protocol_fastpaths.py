"""The job loader's shortcuts give what the full checks and PyYAML's own constructor
give: the direct construction of plain documents, the nesting bound counted from
characters, and the alias-expansion check skipped for short alias-free texts."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from libs.common.protocol import document
from libs.common.protocol.depth import cannot_nest_deeper_than
from libs.common.protocol.model import ProtocolError

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
REFERENCE = pathlib.Path("/work/shared/reference/openpai")

DOCUMENTS = {
    "job": "protocolVersion: 2\nname: x\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
           "    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands: [\"true\"]\n",
    "scalars": "a: 0x1F\nb: 0o17\nc: 017\nd: 1_000\ne: 1:30\nf: .inf\ng: -.NaN\nh: 1e3\ni: yes\nj: Off\nk: ~\n"
               "l: null\nm: 2001-12-14\nn: 2001-12-14t21:59:43.10-05:00\no: !!binary aGk=\np: !!str 12\nq: '12'\n",
    "keys-of-every-scalar-kind": "1: a\ntrue: b\n~: c\n1.5: d\n2001-01-01: e\n",
    "duplicate-keys-last-wins": "a: 1\na: 2\n",
    "anchors-and-aliases": "base: &b {cpu: 1, list: [1, 2]}\nx: *b\ny: [*b, *b]\n",
    "merge-keys": "base: &b {cpu: 1}\nrole:\n  <<: *b\n  gpu: 2\n",
    "set": "s: !!set {a, b}\n",
    "omap": "o: !!omap [{a: 1}, {b: 2}]\n",
    "pairs": "p: !!pairs [{a: 1}, {a: 2}]\n",
    "mapping-as-key": "? {a: 1}\n: x\n",
    "list-as-key": "? [a]\n: x\n",
    "nested-lists": "- - - a\n  - b\n- []\n- {}\n",
    "explicit-collection-tags": "a: !!map {b: !!seq [1]}\n",
    "empty-values": "a:\nb: ''\nc: []\n",
}


def full(text: str):
    """What PyYAML's safe loader makes of `text`, or the type of what it raises."""
    try:
        return yaml.load(text, Loader=Loader)
    except (yaml.YAMLError, ValueError) as exc:
        return type(exc)


def direct(text: str):
    loader = document._YamlLoader(text)  # with its remembered scalar tags
    try:
        node = loader.get_single_node()
        built, _ = document._construct_plain(loader, node, shares_nodes="&" in text)  # as the loader calls it
        if built is document._NOT_PLAIN:
            built = loader.construct_document(node)
        return built
    except (yaml.YAMLError, ValueError) as exc:
        return type(exc)
    finally:
        loader.dispose()


def reference_files() -> list[pathlib.Path]:
    return sorted(REFERENCE.glob("*.yaml")) if REFERENCE.is_dir() else []


@pytest.mark.parametrize("text", list(DOCUMENTS.values()), ids=list(DOCUMENTS))
def test_direct_construction_is_pyyamls(text):
    assert direct(text) == full(text)
    assert direct(text) == full(text)  # again, every scalar's tag now remembered


def test_a_remembered_tag_is_per_text_and_quoting():
    for text in ("a: 12\nb: '12'\nc: \"12\"\nd: !!str 12\n", "yes: 'yes'\nno: yes\n", "x: ~\ny: '~'\n"):
        assert direct(text) == full(text)
        assert direct(text) == full(text)


@pytest.mark.parametrize("name", ["merge-keys", "set", "omap", "pairs", "mapping-as-key", "list-as-key"])
def test_what_only_the_full_constructor_handles_is_left_to_it(name):
    loader = Loader(DOCUMENTS[name])
    try:
        assert document._construct_plain(loader, loader.get_single_node())[0] is document._NOT_PLAIN
    finally:
        loader.dispose()


def test_an_aliased_node_is_one_object_as_pyyaml_makes_it():
    built = direct(DOCUMENTS["anchors-and-aliases"])
    assert built["x"] is built["base"] and built["y"][0] is built["base"]


def test_the_reference_job_files_load_as_pyyaml_loads_them():
    files = reference_files()
    if not files:
        pytest.skip("the OpenPAI reference files (/work/shared/reference/openpai) are not here")
    for path in files:
        text = path.read_text()
        assert direct(text) == full(text), path.name


def max_depth(text: str) -> int:
    depth = deepest = 0
    for event in yaml.parse(text, Loader=Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            deepest = max(deepest, depth)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return deepest


NESTED = ["- - - - - a", "[[[[[]]]]]", "- ? a\n  : - b", "? - a\n: b", "[a: b, c: [d: {e: f}]]", "- !!seq []",
          "a:\n  b:\n    c:\n      - d: [e, {f: g}]\n", "--- \n- a: b\n  c: d\n", "{? , ? }", "?\n?\n?\n"]


@pytest.mark.parametrize("text", NESTED + list(DOCUMENTS.values()))
def test_the_character_count_bounds_the_depth(text):
    depth = max_depth(text)
    assert not cannot_nest_deeper_than(text, depth - 1), "the bound said shallower than the text is"


DENSE = ["?\n" * 50, "{a,b,c,d,e}", "-\n" * 30, "[a,b,c,d]", "a:\n" * 3, "{? , ? }", "- - - - - a", "[[[[[]]]]]"]


def node_count(text: str) -> int:
    count = 0
    stack = [yaml.compose(text, Loader=Loader)]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return count


@pytest.mark.parametrize("text", DENSE + list(DOCUMENTS.values()))
def test_an_alias_free_text_holds_at_most_two_values_per_character(text):
    # What lets the loader skip the expansion check below MAX_EXPANDED_NODES / 4 characters.
    assert node_count(text) <= 2 * len(text) + 1


def test_the_expansion_check_is_skipped_only_without_aliases_and_below_the_bound():
    assert not document._may_expand("a: [1, 2]")
    assert document._may_expand("a: &x [1]\nb: *x")
    assert document._may_expand("a: " + "x" * document.MAX_EXPANDED_NODES)


def eager_lines(text: str) -> tuple[dict, list]:
    return document._walk_lines(yaml.compose(text, Loader=Loader))


# Documents the loader refuses (a duplicate key, a collection as a key, not a mapping).
REFUSED = ("duplicate-keys-last-wins", "mapping-as-key", "list-as-key", "nested-lists")


@pytest.mark.parametrize("name", [n for n in DOCUMENTS if n not in REFUSED])
def test_lines_worked_out_later_are_those_of_the_walk(name):
    text = DOCUMENTS[name]
    assert document.load_document(text, "text/yaml").lines == eager_lines(text)[0]


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n",
    "a:\n  b: 1\n  c: 2\n  b: 3\n",
    "x: &m {k: 1, k: 2}\ny: *m\n",
    "'a': 1\na: 2\n",
    "1: a\n01: b\n",  # the same integer, different texts: not a duplicate (as before)
    "<<: {a: 1}\n<<: {b: 2}\n",
], ids=["top", "nested", "in-an-anchor", "quoted-and-plain", "same-value-other-text", "merge-keys-twice"])
def test_duplicate_keys_are_refused_as_the_walk_refuses_them(text):
    _, expected = eager_lines(text)
    if expected:
        with pytest.raises(ProtocolError) as err:
            document.load_document(text, "text/yaml")
        assert err.value.errors == expected
    else:
        document.load_document(text, "text/yaml")


JSON_DOCUMENTS = {
    "plain": '{"protocolVersion": 2, "name": "x", "taskRoles": {"main": {"commands": ["true"]}}}',
    "top-repeat": '{"a": 1, "a": 2}',
    "nested-repeat": '{"a": {"b": 1, "c": [{"d": 1, "d": 2}]}}',
    "escaped-repeat": '{"a": 1, "\\u0061": 2}',
    "no-repeat-lookalike": '{"a": 1, "A": 2}',
}


@pytest.mark.parametrize("text", list(JSON_DOCUMENTS.values()), ids=list(JSON_DOCUMENTS))
def test_a_json_body_is_refused_for_duplicates_and_located_as_the_yaml_walk_says(text):
    lines, duplicates = document._lines_or_nothing(text)
    if duplicates:
        with pytest.raises(ProtocolError) as err:
            document.load_document(text, "application/json")
        assert err.value.errors == duplicates
    else:
        loaded = document.load_document(text, "application/json")
        assert loaded.lines == lines
