"""Strings that cannot be stored (a lone surrogate) are found with their paths, whatever
else the document holds; a document without one is passed."""

from __future__ import annotations

import datetime

import pytest

from libs.common.protocol.encodable import unencodable_paths

CASES = [
    ("clean", {"name": "é-ok", "taskRoles": {"w": {"commands": ["echo ✓"], "instances": 1}}}, []),
    ("clean-with-keys-json-cannot-spell", {None: "x", True: [1, 2], 3: {"a": datetime.date(2026, 1, 2)}}, []),
    ("value-in-a-list", {"taskRoles": {"w": {"commands": ["ok", "bad \ud800"]}}}, [("taskRoles", "w", "commands", 1)]),
    ("a-key", {"parameters": {"k\udfff": 1}}, [("parameters", "k?")]),
    ("beside-a-null-key", {None: 1, "name": "\ud801"}, [("name",)]),
    ("several-in-order", {"a": "\ud800", "b": ["\ud800"]}, [("a",), ("b", 0)]),
]


@pytest.mark.parametrize(("doc", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_unencodable_strings_are_named_by_path(doc, expected):
    assert unencodable_paths(doc) == expected
