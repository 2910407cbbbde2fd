"""`pai context list|current|use|rename|delete` (the clusters the CLI knows,
cli/contexts.py) and `pai completion bash|zsh|fish` (shell completion)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from cli import contexts
from cli.output import add_output, emit

console = Console()
SHELLS = ("bash", "zsh", "fish")


def context_names(**_: Any) -> list[str]:
    """The completer of a context-name argument (argcomplete calls it while completing)."""
    try:
        return sorted(contexts.load().contexts)
    except SystemExit:
        return []


def _rows() -> list[dict[str, Any]]:
    config = contexts.load()
    # Never the token: a listing is something people paste into chats and tickets.
    return [{"name": name, "current": name == config.current, "url": c.url, "user": c.user,
             "signedIn": bool(c.token)} for name, c in config.contexts.items()]


def cmd_list(args: argparse.Namespace) -> int:
    rows = _rows()
    if emit(args, rows, names=lambda rs: [r["name"] for r in rs]):
        return 0
    if not rows:
        console.print(f"no contexts in {contexts.config_path()}: `pai login --url URL` adds one")
        return 0
    table = Table("", "context", "url", "user", "signed in")
    for row in rows:
        table.add_row("*" if row["current"] else "", row["name"], row["url"], row["user"] or "-",
                      "yes" if row["signedIn"] else "no")
    console.print(table)
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    found = contexts.selected(None)
    if found is None:
        raise contexts.ContextError(f"no current context in {contexts.config_path()}")
    name, context = found
    if not emit(args, {"name": name, "url": context.url, "user": context.user}, names=lambda d: [d["name"]]):
        print(name)
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    contexts.use(args.name)
    if not emit(args, {"name": args.name}, names=lambda d: [d["name"]]):
        console.print(f"now using context [bold]{args.name}[/]")
    return 0


def cmd_rename(args: argparse.Namespace) -> int:
    contexts.rename(args.old, args.new)
    if not emit(args, {"name": args.new, "was": args.old}, names=lambda d: [d["name"]]):
        console.print(f"context {args.old} is now [bold]{args.new}[/]")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    contexts.delete(args.name)
    if not emit(args, {"name": args.name, "deleted": True}, names=lambda d: [d["name"]]):
        console.print(f"context {args.name} deleted (its token still works until it expires; `pai logout` revokes it)")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    import argcomplete

    print(argcomplete.shellcode(["pai"], shell=args.shell))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    ctx = subparsers.add_parser("context", help="the clusters this CLI knows: list, current, use, rename, delete")
    sub = ctx.add_subparsers(dest="context_command", required=True)
    ls = sub.add_parser("list", help="every context; * marks the current one")
    add_output(ls)
    ls.set_defaults(func=cmd_list)
    cur = sub.add_parser("current", help="the current context's name")
    add_output(cur)
    cur.set_defaults(func=cmd_current)
    use = sub.add_parser("use", help="make a context the current one")
    use.add_argument("name").completer = context_names  # type: ignore[attr-defined,unused-ignore]
    add_output(use)
    use.set_defaults(func=cmd_use)
    ren = sub.add_parser("rename", help="rename a context")
    ren.add_argument("old").completer = context_names  # type: ignore[attr-defined,unused-ignore]
    ren.add_argument("new")
    add_output(ren)
    ren.set_defaults(func=cmd_rename)
    rm = sub.add_parser("delete", help="forget a context")
    rm.add_argument("name").completer = context_names  # type: ignore[attr-defined,unused-ignore]
    add_output(rm)
    rm.set_defaults(func=cmd_delete)

    comp = subparsers.add_parser("completion", help="print the shell completion script: "
                                                    "`source <(pai completion bash)`, or zsh, or fish")
    comp.add_argument("shell", choices=SHELLS)
    comp.set_defaults(func=cmd_completion)
