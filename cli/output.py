"""`-o json|yaml|name` for every `pai` command that prints something.

Without `-o`, a command prints for people (tables, colours). `-o json` and `-o yaml`
print what the API answered (the same data the table shows, and more); `-o name`
prints the name of each thing, one a line, for scripts
(`job=$(pai submit -o name job.yaml)`). The `--json` flag some commands had is
kept as a synonym of `-o json`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from typing import Any

import yaml

FORMATS = ("json", "yaml", "name")


def add_output(parser: argparse.ArgumentParser, *, legacy_json: bool = False) -> None:
    parser.add_argument("-o", "--output", choices=FORMATS, default=None,
                        help="print json, yaml, or only the name of each thing (one a line) instead of a table")
    if legacy_json:
        parser.add_argument("--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS)


def emit(args: argparse.Namespace, data: Any, *, names: Callable[[Any], Iterable[str]] | None = None) -> bool:
    """Print `data` in the format `-o` asked for; False when none was asked (the
    caller then prints for people). `names` lists the names in `data` for `-o name`
    (default: the data itself when it is a string, or the strings in a list)."""
    fmt = getattr(args, "output", None)
    if fmt is None:
        return False
    if fmt == "json":
        print(json.dumps(data, indent=2))
    elif fmt == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        for name in (names or _names)(data):
            print(name)
    return True


def _names(data: Any) -> Iterable[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, list):
        return [str(item) for item in data]
    if isinstance(data, dict):
        return [str(key) for key in data]
    return [str(data)]
