"""`pai market ...`: the marketplace from the command line (docs/api.md, "Marketplace").

    pai market list --tag pytorch            # what you may see, most starred first
    pai market show cpu-batch                # its description, parameters and template
    pai market use cpu-batch -p command='echo hi'          # submit a job from it
    pai market use hyperparameter-sweep --sweep lr=0.1,0.01  # one job per value
    pai market create --name "My job" --template job.yaml --tag nlp --share-with team
    pai market import openpai-item.yaml --public             # OpenPAI marketplace v2 file
    pai market export cpu-batch > cpu-batch.yaml
    pai market approve ITEM / reject ITEM --note "..."       # admins
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.table import Table

from cli.client import Client, connect
from cli.output import add_output, emit

ITEMS = "/api/v2/marketplace/items"
console = Console()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    market = subparsers.add_parser("market", help="the marketplace: job templates and data to share and reuse")
    sub = market.add_subparsers(dest="market_command", required=True)

    ls = sub.add_parser("list", help="the items you may see")
    ls.add_argument("query", nargs="?", default="", help="words to look for")
    ls.add_argument("--tag", action="append", default=[], help="only items with this tag (repeat: all of them)")
    ls.add_argument("--category")
    ls.add_argument("--kind", choices=("template", "data"))
    ls.add_argument("--mine", action="store_true", help="only your own")
    ls.add_argument("--starred", action="store_true", help="only those you starred")
    ls.add_argument("--pending", action="store_true", help="public items waiting for an admin's review")
    ls.add_argument("--sort", choices=("stars", "submits", "recent", "name"), default="stars")
    add_output(ls)
    ls.set_defaults(func=cmd_list)

    show = sub.add_parser("show", help="one item: description, parameters, template")
    show.add_argument("item")
    add_output(show)
    show.set_defaults(func=cmd_show)

    for verb in ("create", "edit"):
        p = sub.add_parser(verb, help="publish an item" if verb == "create" else "change your item (the options given)")
        if verb == "edit":
            p.add_argument("item")
        p.add_argument("--name", required=verb == "create")
        p.add_argument("--template", metavar="FILE", help="the job template (OpenPAI v2 YAML; - for stdin)")
        p.add_argument("--data", metavar="URI", help="a data item: its storage path or URI")
        p.add_argument("--summary")
        p.add_argument("--description", metavar="FILE", help="Markdown file (- for stdin)")
        p.add_argument("--category")
        p.add_argument("--tag", action="append", help="a tag (repeat it)")
        _visibility_arguments(p)
        add_output(p)
        p.set_defaults(func=cmd_save, verb=verb)

    rm = sub.add_parser("delete", help="delete your item")
    rm.add_argument("item")
    add_output(rm)
    rm.set_defaults(func=cmd_delete)

    for verb in ("star", "unstar"):
        p = sub.add_parser(verb, help=f"{verb} an item")
        p.add_argument("item")
        add_output(p)
        p.set_defaults(func=cmd_star, on=verb == "star")

    for verb in ("approve", "reject"):
        p = sub.add_parser(verb, help=f"{verb} a public item (admins)")
        p.add_argument("item")
        p.add_argument("--note", default="", help="why, for its owner")
        add_output(p)
        p.set_defaults(func=cmd_review, decision=verb)

    use = sub.add_parser("use", help="submit a job (or a sweep of jobs) from a template")
    use.add_argument("item")
    use.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE", help="a parameter's value")
    use.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
                     help="one job per value (several --sweep: every combination)")
    use.add_argument("--data", action="append", default=[], metavar="PREREQUISITE=ITEM",
                     help="a data prerequisite of the template takes this data item's uri")
    use.add_argument("--name", default="", help="the job's name (default: the template's and a stamp)")
    use.add_argument("--dry-run", action="store_true", help="print the job YAML instead of submitting it")
    add_output(use)
    use.set_defaults(func=cmd_use)

    imp = sub.add_parser("import", help="publish an item from an OpenPAI marketplace v2 file")
    imp.add_argument("file")
    imp.add_argument("--kind", choices=("template", "data"))
    imp.add_argument("--category")
    imp.add_argument("--tag", action="append", default=[])
    _visibility_arguments(imp)
    add_output(imp)
    imp.set_defaults(func=cmd_import)

    exp = sub.add_parser("export", help="print an item as an OpenPAI marketplace v2 file")
    exp.add_argument("item")
    exp.set_defaults(func=cmd_export)


def _visibility_arguments(p: argparse.ArgumentParser) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("--private", dest="visibility", action="store_const", const="private", help="yours alone")
    who.add_argument("--share-with", dest="groups", action="append", metavar="GROUP",
                     help="the members of this group too (repeat it)")
    who.add_argument("--public", dest="visibility", action="store_const", const="public",
                     help="everyone, once an admin approves it")


def _read(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text()


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise SystemExit(f"{what} {value!r}: write NAME=VALUE")
        out[name] = text
    return out


def _run(coro) -> Any:
    return asyncio.run(coro)


def cmd_list(args: argparse.Namespace) -> int:
    params: list[tuple[str, str]] = [("sort", args.sort)]
    params += [("q", args.query)] if args.query else []
    params += [("tag", t) for t in args.tag]
    params += [(k, v) for k, v in (("category", args.category), ("kind", args.kind)) if v]
    params += [("mine", "true")] if args.mine else []
    params += [("starred", "true")] if args.starred else []
    params += [("approval", "pending")] if args.pending else []
    query = "&".join(f"{k}={_quote(v)}" for k, v in params)
    got = _run(Client(connect(args)).request("GET", f"{ITEMS}?{query}"))
    if emit(args, got["items"], names=lambda items: [i["id"] for i in items]):
        return 0
    table = Table(box=None)
    for column in ("ID", "NAME", "KIND", "OWNER", "CATEGORY", "TAGS", "★", "JOBS", "VISIBILITY"):
        table.add_column(column)
    for i in got["items"]:
        shown = i["visibility"] + (f" ({i['approval']})" if i["visibility"] == "public" and i["approval"] != "approved" else "")
        table.add_row(escape(i["id"]), escape(i["name"]), i["kind"], escape(i["owner"]), escape(i["category"]),
                      escape(", ".join(i["tags"])), f"{i['stars']}{'*' if i['starred'] else ''}", str(i["submits"]), shown)
    console.print(table)
    return 0


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def cmd_show(args: argparse.Namespace) -> int:
    item = _run(Client(connect(args)).request("GET", f"{ITEMS}/{_quote(args.item)}"))
    if emit(args, item, names=lambda i: [i["id"]]):
        return 0
    console.print(f"[bold]{escape(item['name'])}[/] ({item['kind']}, {escape(item['category'])}) by "
                  f"{escape(item['owner'])}  ★ {item['stars']}  jobs {item['submits']}  {item['visibility']}"
                  + (f" / {item['approval']}" if item["visibility"] == "public" else ""))
    if item["tags"]:
        console.print("tags: " + escape(", ".join(item["tags"])))
    if item["description"]:
        console.print(Markdown(item["description"]))
    if item["kind"] == "data":
        console.print(f"uri: {escape(item['uri'])}")
    else:
        if item["parameters"]:
            console.print("parameters (pai market use ... -p NAME=VALUE):")
            for name, value in item["parameters"].items():
                console.print(f"  {escape(name)} = {escape(value)}")
        if item.get("data"):
            console.print("data (pai market use ... --data NAME=DATA_ITEM):")
            for name, uris in item["data"].items():
                console.print(f"  {escape(name)} = {escape(', '.join(uris))}")
    return 0


def cmd_save(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.name:
        body["name"] = args.name
    if args.template:
        body["kind"], body["protocol"] = "template", _read(args.template)
    if args.data:
        body["kind"], body["uri"], body["protocol"] = "data", args.data, ""
    if args.description:
        body["description"] = _read(args.description)
    for key in ("summary", "category"):
        if getattr(args, key):
            body[key] = getattr(args, key)
    if args.tag:
        body["tags"] = args.tag
    if args.groups:
        body["visibility"], body["groups"] = "groups", args.groups
    elif args.visibility:
        body["visibility"] = args.visibility
    client = Client(connect(args))
    if args.verb == "create":
        item = _run(client.request("POST", ITEMS, json_body=body))
    else:
        item = _run(client.request("PUT", f"{ITEMS}/{_quote(args.item)}", json_body=body))
    if not emit(args, item, names=lambda i: [i["id"]]):
        waiting = " (waiting for an admin's approval)" if item["approval"] == "pending" else ""
        print(f"{item['id']}: {item['visibility']}{waiting}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    answer = _run(Client(connect(args)).request("DELETE", f"{ITEMS}/{_quote(args.item)}"))
    if not emit(args, answer or {"id": args.item, "deleted": True}, names=lambda _: [args.item]):
        print(f"deleted {args.item}")
    return 0


def cmd_star(args: argparse.Namespace) -> int:
    got = _run(Client(connect(args)).request("PUT" if args.on else "DELETE", f"{ITEMS}/{_quote(args.item)}/star"))
    if not emit(args, got, names=lambda g: [g["id"]]):
        print(f"{got['id']}: {'starred' if got['starred'] else 'not starred'} ({got['stars']} stars)")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    got = _run(Client(connect(args)).request("POST", f"{ITEMS}/{_quote(args.item)}/review",
                                             json_body={"decision": args.decision, "note": args.note}))
    if not emit(args, got, names=lambda g: [g["id"]]):
        print(f"{got['id']}: {got['approval']}")
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    sweep = {k: [v for v in values.split(",") if v] for k, values in _pairs(args.sweep, "--sweep").items()}
    client = Client(connect(args))
    rendered = _run(client.request("POST", f"{ITEMS}/{_quote(args.item)}/render", json_body={
        "parameters": _pairs(args.param, "--param"), "sweep": sweep, "data": _pairs(args.data, "--data"),
        "name": args.name}))
    if args.dry_run:
        print("\n---\n".join(j["config"] for j in rendered["jobs"]), end="")
        return 0

    async def submit_all() -> list[Any]:
        return [await client.request("POST", "/api/v2/jobs", data=j["config"].encode(), content_type="text/yaml")
                for j in rendered["jobs"]]

    accepted = _run(submit_all())
    if not emit(args, accepted, names=lambda jobs: [j["job"] for j in jobs]):
        for job in accepted:
            print(f"submitted {job['job']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    params: list[tuple[str, str]] = [("tag", t) for t in args.tag]
    params += [(k, v) for k, v in (("kind", args.kind), ("category", args.category)) if v]
    if args.groups:
        params += [("visibility", "groups"), *(("group", g) for g in args.groups)]
    elif args.visibility:
        params.append(("visibility", args.visibility))
    query = "&".join(f"{k}={_quote(v)}" for k, v in params)
    item = _run(Client(connect(args)).request("POST", f"/api/v2/marketplace/import?{query}",
                                              data=_read(args.file).encode(), content_type="text/yaml"))
    if not emit(args, item, names=lambda i: [i["id"]]):
        print(f"imported {item['id']} ({item['kind']}, {item['visibility']})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    body = _run(Client(connect(args)).request("GET", f"{ITEMS}/{_quote(args.item)}/export", raw=True))
    sys.stdout.write(body.decode())
    return 0
