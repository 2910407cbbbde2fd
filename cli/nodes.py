"""`pai nodes [cordon|uncordon NODE --reason ...]`: the cluster's nodes and their health.

Listing needs any token; cordon and uncordon need an admin's. A cordoned node
gets no new work (its running tasks go on); its reason shows in the waiting
reason of jobs that would have used it.
"""

from __future__ import annotations

import argparse
import asyncio
from urllib.parse import quote

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.client import Client, connect
from cli.output import add_output, emit

console = Console()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    nodes = subparsers.add_parser("nodes", help="nodes: health, conditions, cordons (cordon/uncordon: admins)")
    add_output(nodes, legacy_json=True)
    nodes.set_defaults(func=cmd_list)
    sub = nodes.add_subparsers(dest="nodes_command")

    cordon = sub.add_parser("cordon", help="take a node out of scheduling (running tasks go on)")
    cordon.add_argument("node")
    cordon.add_argument("--reason", required=True, help="why, for the people whose jobs wait")
    add_output(cordon)
    cordon.set_defaults(func=cmd_cordon)

    uncordon = sub.add_parser("uncordon", help="let a cordoned node take work again")
    uncordon.add_argument("node")
    uncordon.add_argument("--reason", default="", help="optional note")
    add_output(uncordon)
    uncordon.set_defaults(func=cmd_uncordon)


def _client(args: argparse.Namespace) -> Client:
    return Client(connect(args))


def cmd_list(args: argparse.Namespace) -> int:
    rows = asyncio.run(_client(args).request("GET", "/api/v2/cluster/nodes"))
    if emit(args, rows, names=lambda rs: [r["name"] for r in rs]):
        return 0
    table = Table("node", "health", "conditions", "cordoned", "why")
    for row in rows:
        health = "[green]healthy[/]" if row["healthy"] else "[red]unhealthy[/]"
        if not row["agentSeen"] and row["healthy"]:
            health = "[dim]no agent[/]"
        table.add_row(
            escape(row["name"]),
            health,
            ", ".join(row["conditions"]) or "-",
            "yes" if row["cordoned"] else "-",
            escape(row["reason"] or ""),
        )
    console.print(table)
    return 0


def _change(args: argparse.Namespace, method: str) -> int:
    path = f"/api/v2/cluster/nodes/{quote(args.node, safe='')}/cordon"
    body = {"reason": args.reason} if args.reason else None
    result = asyncio.run(_client(args).request(method, path, json_body=body))
    if emit(args, result, names=lambda _: [args.node]):
        return 0
    console.print(result["message"])
    return 0


def cmd_cordon(args: argparse.Namespace) -> int:
    return _change(args, "PUT")


def cmd_uncordon(args: argparse.Namespace) -> int:
    return _change(args, "DELETE")
