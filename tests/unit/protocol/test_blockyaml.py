"""blockyaml gives exactly what PyYAML's safe loader gives, or leaves the text to it:
a table of the shapes job files take and of what it must leave alone, and a
property over generated (and mangled) documents."""

from __future__ import annotations

import datetime
import math
import pathlib

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from benchmarks.jobs import trivial_job
from libs.common.protocol.blockyaml import NOT_SIMPLE, load_simple
from libs.common.protocol.document import load_document

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
REFERENCE = pathlib.Path("/work/shared/reference/openpai")
ERROR = object()


def pyyaml(text: str) -> object:
    try:
        return yaml.load(text, Loader=Loader)
    except (yaml.YAMLError, ValueError, OverflowError):
        return ERROR


def same(a: object, b: object) -> bool:
    """Equal values of the same types all the way down (1 == True == 1.0 is not enough),
    mappings in the same order; NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(ka, kb) and same(va, vb)
                                        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, datetime.datetime):
        return a == b and a.tzinfo == b.tzinfo
    return a == b


def check(text: str) -> object:
    got = load_simple(text)
    if got is not NOT_SIMPLE:
        expected = pyyaml(text)
        assert expected is not ERROR, f"read {text!r}, which PyYAML refuses"
        assert same(got, expected), f"{text!r}: {got!r} != {expected!r}"
    return got


READ = {
    "benchmark-job": trivial_job("x").decode(),
    "block-job": "protocolVersion: 2\nname: train-1\ntype: job\njobRetryCount: 0\nprerequisites:\n"
                 "  - type: dockerimage\n    uri: 'openpai/standard:python_3.6'\n    name: image\n"
                 "taskRoles:\n  worker:\n    instances: 2\n    dockerImage: image\n    resourcePerInstance:\n"
                 "      gpu: 1\n      cpu: 4\n      memoryMB: 8192\n    commands:\n      - cd /src\n"
                 "      - python train.py --lr 0.1 --epochs=3  # a comment\n"
                 "defaults:\n  virtualCluster: default\n",
    "indentless-list": "commands:\n- a\n- b\nname: x\n",
    "compact-nested": "- a: 1\n  b: [x, y]\n- - p\n  - q\n-\n  c: 3\n- \n",
    "scalars": "a: 0x1F\nb: 0o17\nc: 017\nd: 1_000\ne: 1:30\nf: .inf\ng: -.NaN\nh: 1e3\ni: yes\nj: Off\n"
               "k: ~\nl: null\nm: 2001-12-14\nn: 2001-12-14t21:59:43.10-05:00\no: +12\np: 1.5e+3\nq: -0.5\n",
    "keys-of-every-kind": "1: a\ntrue: b\n1.5: d\n2001-01-01: e\nno: f\n",
    "keys-equal-as-values": "1: a\n0x1: b\n",
    "quotes": "a: 'it''s'\nb: \"x: y # z\"\nc: ''\nd: \"\"\ne: ' padded '\nf: it's\ng: say \"hi\"\n",
    "plain-with-indicators-inside": "a: a:b\nb: a#b\nc: x,y\nd: a]b{c}\ne: -x\nf: --flag=1\ng: 50%\n",
    "flow": "a: {cpu: 1, gpu: 0,}\nb: [1, two, 'three', \"four\"]\nc: []\nd: {}\ne: [ ]\nf: {a: [1, {b: c}]}\n"
            "g: [\"x\", ]\nh: ['a,b', \"c]\"]\n",
    "empty-values": "a:\nb: # nothing\nc:\n  # a comment line\nd: 1\n",
    "comments-and-blank-lines": "# head\n\na: 1   \n  # indented comment\n\nb:\n    c: 2 # tail\n",
    "unicode": "name: 训练\ndescription: café ☕\n",
    "deeper-root": "  a: 1\n  b: 2\n",
}

LEFT_TO_PYYAML = {
    "anchor-alias": "a: &x 1\nb: *x\n",
    "merge-key": "a: {x: 1}\nb:\n  <<: {y: 2}\n",
    "tag": "a: !!str 12\n",
    "literal-block": "a: |\n  text\n",
    "folded-block": "a: >-\n  text\n",
    "multi-line-plain": "a: one\n  two\n",
    "multi-line-flow": "a: [1,\n  2]\n",
    "multi-line-quoted": "a: 'one\n  two'\n",
    "escapes": "a: \"tab\\there\"\n",
    "quoted-key": "\"a\": 1\n",
    "repeated-key": "a: 1\na: 2\n",
    "repeated-flow-key": "a: {b: 1, b: 2}\n",
    "tab": "a:\t1\n",
    "crlf": "a: 1\r\nb: 2\r\n",
    "document-marker": "---\na: 1\n",
    "directive": "%YAML 1.1\n---\na: 1\n",
    "explicit-key": "? a\n: 1\n",
    "mapping-in-plain": "a: b: c\n",
    "bad-indent": "a:\n    b: 1\n  c: 2\n",
    "key-without-value-in-flow": "a: {b}\n",
    "scalar-document": "just text\n",
    "empty": "",
    "only-comments": "# nothing\n",
    "bad-date": "a: 2001-13-45\n",
    "control-character": "a: \x07\n",
    "line-separator": "a: x\u2028y\n",
    "json": "{\"a\": 1}\n",
}


@pytest.mark.parametrize("text", list(READ.values()), ids=list(READ))
def test_read_as_pyyaml_reads_it(text):
    assert check(text) is not NOT_SIMPLE
    assert check(text) is not NOT_SIMPLE  # again, with the scalars' values remembered


@pytest.mark.parametrize("text", list(LEFT_TO_PYYAML.values()), ids=list(LEFT_TO_PYYAML))
def test_left_to_pyyaml(text):
    assert load_simple(text) is NOT_SIMPLE


@pytest.mark.parametrize("path", sorted(REFERENCE.glob("*.yaml")) if REFERENCE.is_dir() else [],
                         ids=lambda p: p.name)
def test_openpai_examples_read_alike_or_left(path):
    check(path.read_text())


def test_a_document_read_here_still_reports_lines_on_refusal():
    text = "protocolVersion: 2\nname: x\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n" \
           "    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands: [\"true\"]\n    bogus: 1\n"
    assert load_simple(text) is not NOT_SIMPLE
    document = load_document(text, "text/yaml")
    assert document.line_of(("taskRoles", "main", "bogus")) == 9
    assert document.line_of(("taskRoles", "main", "commands", 0)) == 8


# --- property: generated documents, some of them mangled -------------------------

SCALARS = ["a", "x y", "-1", "1", "0x1F", "017", "1_000", "1:30", "1e3", "1.5", ".inf", "-.NaN", "yes", "Off",
           "~", "null", "true", "2001-12-14", "2001-13-45", "'q'", "'it''s'", '"d"', '"a\\nb"', "it's", "a: b",
           "a:b", "a #c", "a#b", "[a, b]", "{a: 1}", "{a:1}", "[a,]", "[,]", '["x", ]', "&a x", "*a", "!!str 1",
           "|", ">-", "? x", "- x", "-", "%x", "@x", "`x", "a]", "a}", "a,b", "{}", "[]", "[ ]", "{a: [b, {c: d}]}",
           "é", "\xa0x", "<<", "=", "''", '""', "' a '", "[1, 'two', \"three\"]", "{a: , b: 1}", "{a: 1, a: 2}",
           "-x", "--f=1", "x:", ":x", "# c", "a   # c", "[a] # c", "[a]x", "'a'x", "{a: [1,2]}", "[{a: 1}]"]
KEYS = ["a", "b", "name", "taskRoles", "1", "yes", "0x1", "1.5", "~", "<<", "=", "a.b", "a-b", "a/b", "2001-01-01",
        "a b", "-a", "'q'", "é"]
MANGLE = ["\t", " ", "  ", "\n", "#", ":", "- ", "'", '"', "[", "]", "{", "}", ",", "&", "*", "!", "|", "---\n"]


def blocks(depth: int) -> st.SearchStrategy:
    scalar = st.sampled_from(SCALARS)
    if depth == 0:
        return scalar
    inner = blocks(depth - 1)
    mapping = st.lists(st.tuples(st.sampled_from(KEYS), inner), min_size=1, max_size=4).map(lambda kv: ("map", kv))
    sequence = st.lists(inner, min_size=1, max_size=3).map(lambda items: ("seq", items))
    return st.one_of(scalar, mapping, sequence)


# Built once: a strategy built anew in every example costs Hypothesis more than the
# example itself (validation, labels), several seconds over the property's examples.
ROOT = st.lists(st.tuples(st.sampled_from(KEYS), blocks(2)), min_size=1, max_size=5)
AFTER_KEY = st.sampled_from(["", "  ", " # c"])
FIRST_INDENT = st.sampled_from([0, 0, 1, 2])
STEP = st.sampled_from([1, 2, 4])
BLANK = st.sampled_from(["", "# c", "   # c", "  "])
ENDING = st.sampled_from(["\n", "", "\n\n"])
MANGLING = st.sampled_from(MANGLE)


def render(node, indent: int, step: int, draw) -> list[str]:
    """Lines of `node` at `indent` (a scalar: one line without indent)."""
    pad = " " * indent
    if isinstance(node, str):
        return [node]
    kind, entries = node
    lines: list[str] = []
    if kind == "map":
        for key, value in entries:
            if isinstance(value, str):
                lines.append(f"{pad}{key}: {value}")
            else:
                lines.append(f"{pad}{key}:" + draw(AFTER_KEY))
                indentless = value[0] == "seq" and draw(st.booleans())
                lines += render(value, indent if indentless else indent + step, step, draw)
    else:
        for item in entries:
            if isinstance(item, str):
                lines.append(f"{pad}- {item}")
            elif draw(st.booleans()):  # compact: the first line of the item on the dash's line
                nested = render(item, indent + 2, step, draw)
                lines.append(f"{pad}- {nested[0][indent + 2:]}")
                lines += nested[1:]
            else:
                lines.append(f"{pad}-")
                lines += render(item, indent + step, step, draw)
    return lines


@st.composite
def documents(draw) -> str:
    root = draw(ROOT)
    lines = render(("map", root), draw(FIRST_INDENT), draw(STEP), draw)
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(BLANK))
    text = "\n".join(lines) + draw(ENDING)
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(MANGLING) + text[at + draw(st.integers(0, 1)):]
    return text


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_whatever_it_reads_pyyaml_reads_the_same(text):
    check(text)
