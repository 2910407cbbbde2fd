"""`pai rules ...`: read and change the failure rules (changes need an admin token).

A rule file holds one rule in OpenPAI's exit-spec format, YAML or JSON, e.g.

    code: 211
    phrase: DatasetMountMissing
    type: USER_FAILURE
    reaction: NEVER_RETRY
    reason: "The dataset volume is not mounted."
    solution: ["Add the dataset to the job's storage section"]
    pattern:
      runtimeContainerPatterns:
      - userLogRegex: 'dataset root .* does not exist'

The first matching rule wins: `--before CODE` or `--position N` choose where a
rule goes (default: before the catch-all rules).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm
from rich.syntax import Syntax
from rich.table import Table

from cli.client import ApiError, Client, connect
from cli.output import add_output, emit

console = Console()
err_console = Console(stderr=True)

REACTION_STYLE = {
    "NEVER_RETRY": "red",
    "RETRY_TO_MAX": "yellow",
    "ALWAYS_RETRY": "green",
    "ALWAYS_BACKOFF_RETRY": "cyan",
}
SUMMARY_CHARS = 70


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    rules = subparsers.add_parser(
        "rules", help="failure rules: how PAI explains a failed task and whether it retries the job"
    )
    sub = rules.add_subparsers(dest="rules_command", required=True)

    ls = sub.add_parser("list", help="every rule, in the order they are tried")
    add_output(ls, legacy_json=True)
    ls.set_defaults(func=cmd_list)

    show = sub.add_parser("show", help="one rule, as it would be written in a rule file")
    show.add_argument("code", type=int)
    add_output(show, legacy_json=True)
    show.set_defaults(func=cmd_show)

    add = sub.add_parser("add", help="add a rule from a YAML/JSON file (- for stdin); admin only")
    add.add_argument("file")
    _placement_arguments(add)
    add_output(add)
    add.set_defaults(func=cmd_add)

    change = sub.add_parser("change", help="replace rule CODE with the rule in FILE; admin only")
    change.add_argument("code", type=int)
    change.add_argument("file")
    _placement_arguments(change)
    add_output(change)
    change.set_defaults(func=cmd_change)

    delete = sub.add_parser("delete", help="delete rule CODE; admin only")
    delete.add_argument("code", type=int)
    add_output(delete)
    delete.set_defaults(func=cmd_delete)

    reset = sub.add_parser("reset", help="drop every change and use the rules PAI starts with; admin only")
    reset.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    add_output(reset)
    reset.set_defaults(func=cmd_reset)


def _placement_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--before", type=int, metavar="CODE", help="put the rule just before rule CODE")
    where.add_argument("--position", type=int, metavar="N", help="put the rule at index N (0 = tried first)")


def _reports_refusals(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A refused rule is listed field by field (`pai` reports other errors)."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ApiError as error:
            details = error.body.get("details") if isinstance(error.body, dict) else None
            problems = details.get("errors") if isinstance(details, dict) else None
            if not isinstance(problems, list) or not problems:
                raise
            err_console.print(f"[red]error {error.status}[/]: the rule was refused")
            for problem in problems:
                path, message = problem.get("path") or "(the file)", problem.get("message", "")
                err_console.print(f"  {escape(path)}: {escape(message)}")
            return 2

    return run


# --- commands --------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    answer = _request(args, "GET", "/api/v2/rules")
    if emit(args, answer, names=lambda a: [str(rule["code"]) for rule in a["rules"]]):
        return 0
    table = Table("#", "code", "phrase", "reaction", "type", "recognised by", title=_rule_set_line(answer))
    for index, rule in enumerate(answer["rules"]):
        table.add_row(
            str(index),
            str(rule["code"]),
            rule["phrase"],
            _reaction(rule.get("reaction", "")),
            rule.get("type", ""),
            _summary(rule.get("pattern")),
        )
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    answer = _request(args, "GET", f"/api/v2/rules/{args.code}")
    if emit(args, answer, names=lambda a: [str(a["rule"]["code"])]):
        return 0
    rule = answer["rule"]
    where = f"at position {answer['position']} ({_rule_set_line(answer)})"
    text = yaml.safe_dump(rule, sort_keys=False, allow_unicode=True, width=100)
    if console.is_terminal:
        console.print(f"[bold]{rule['code']} {rule['phrase']}[/]  {_reaction(rule.get('reaction', ''))}  {where}")
        console.print(Syntax(text, "yaml"))
    else:  # a rule file as it is, to be saved, edited and sent back with `pai rules change`
        print(f"# {where}\n{text}", end="")
    return 0


@_reports_refusals
def cmd_add(args: argparse.Namespace) -> int:
    data, content_type = _read_file(args.file)
    answer = _request(args, "POST", "/api/v2/rules", data=data, content_type=content_type, params=_placement(args))
    if not emit(args, answer, names=lambda a: [str(a["rule"]["code"])]):
        _changed("added", answer)
    return 0


@_reports_refusals
def cmd_change(args: argparse.Namespace) -> int:
    data, content_type = _read_file(args.file)
    answer = _request(
        args, "PUT", f"/api/v2/rules/{args.code}", data=data, content_type=content_type, params=_placement(args)
    )
    if not emit(args, answer, names=lambda a: [str(a["rule"]["code"])]):
        _changed("changed", answer)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    answer = _request(args, "DELETE", f"/api/v2/rules/{args.code}")
    if emit(args, answer, names=lambda a: [str(a["deleted"]["code"])]):
        return 0
    rule = answer["deleted"]
    console.print(f"deleted rule [bold]{rule['code']} {rule['phrase']}[/]; rules now at revision {answer['revision']}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            console.print("nothing changed: confirm the reset with --yes")
            return 1
        if not Confirm.ask("Drop every change to the failure rules and use the rules PAI starts with?"):
            console.print("nothing changed")
            return 1
    answer = _request(args, "POST", "/api/v2/rules/reset")
    if emit(args, answer, names=lambda a: [str(a["revision"])]):
        return 0
    console.print(f"rules reset to the {_source(answer['source'])}; revision {answer['revision']}")
    return 0


# --- helpers ---------------------------------------------------------------------


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    client = Client(connect(args))
    return asyncio.run(client.request(method, path, **kwargs))


def _read_file(name: str) -> tuple[bytes, str]:
    data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    return data, "application/json" if name.endswith(".json") else "text/yaml"


def _placement(args: argparse.Namespace) -> dict[str, int]:
    return {key: value for key in ("before", "position") if (value := getattr(args, key)) is not None}


def _changed(verb: str, answer: dict) -> None:
    rule = answer["rule"]
    console.print(
        f"{verb} rule [bold]{rule['code']} {rule['phrase']}[/] ({_reaction(rule.get('reaction', ''))}), "
        f"at position {answer['position']}; rules now at revision {answer['revision']}"
    )


def _source(source: str) -> str:
    return {"defaults": "shipped defaults", "file": "configured rules file", "admin": "rules changed by admins"}.get(
        source, source
    )


def _rule_set_line(answer: dict) -> str:
    line = f"{_source(answer['source'])}, revision {answer['revision']}"
    if answer.get("changedBy"):
        when = datetime.fromtimestamp(answer["changedTime"] / 1000).strftime("%Y-%m-%d %H:%M:%S")
        line += f", last changed by {answer['changedBy']} at {when}"
    return line


def _reaction(reaction: str) -> str:
    return f"[{REACTION_STYLE.get(reaction, 'white')}]{reaction}[/]"


def _summary(pattern: dict | None) -> str:
    """What a rule looks at, in a few words: `exit 137`, `log /regex/`, ..."""
    if not pattern:
        return "[dim]assigned by PAI[/]"
    parts = []
    for entry in pattern.get("runtimeContainerPatterns", []):
        words = []
        if "exitCode" in entry:
            words.append(f"exit {entry['exitCode']}")
        if "userLogRegex" in entry:
            words.append(f"log /{entry['userLogRegex']}/")
        if "platformLogRegex" in entry:
            words.append(f"platform /{entry['platformLogRegex']}/")
        if "gpuInfo" in entry:
            words.append("gpu info")
        parts.append(" and ".join(words))
    for entry in pattern.get("controllerPodPatterns", []):
        words = []
        if "reasonRegex" in entry:
            words.append(f"reason /{entry['reasonRegex']}/")
        if "messageRegex" in entry:
            words.append(f"message /{entry['messageRegex']}/")
        if entry.get("containers"):
            words.append("container state")
        parts.append(" and ".join(words))
    text = " | ".join(parts)
    text = text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
    return escape(text)  # regexes are not rich markup
