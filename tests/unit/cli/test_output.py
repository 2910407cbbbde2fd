"""Every `pai` command that prints a result takes `-o json|yaml|name`."""

from __future__ import annotations

import argparse

from cli.main import build_parser

# Commands whose output is a stream or a program of their own, not a result:
# the platform's own log, a job's log, state changes as they come, an ssh session,
# the simulator's report files, a password prompt, a shell's completion script.
NOT_RESULTS = {"up", "logs", "watch", "ssh", "simulate", "passwd", "completion", "logout"}
# `pai alerts rules get -o FILE`: -o was the file to write the rules to before -o
# meant a format (docs/alerts.md); kept. `pai market export`: prints an OpenPAI
# marketplace file, a format of its own.
OWN_O = {"alerts rules get", "market export"}


def leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix.strip(): parser}
    for name, sub in subs[0].choices.items():
        found |= leaves(sub, f"{prefix} {name}")
    # A command that is also a command of its own (`pai alerts`, `pai nodes`).
    if parser.get_default("func") is not None:
        found[prefix.strip()] = parser
    return found


def test_every_command_that_prints_takes_the_output_formats():
    missing = []
    for name, parser in leaves(build_parser()).items():
        if name.split()[0] in NOT_RESULTS or name in OWN_O:
            continue
        option = next((a for a in parser._actions if "--output" in a.option_strings), None)
        if option is None or set(option.choices or ()) != {"json", "yaml", "name"}:
            missing.append(name)
    assert not missing, f"no -o json|yaml|name: {missing}"
