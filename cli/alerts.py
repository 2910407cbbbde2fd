"""`pai alerts ...`: the alerts PAI raised, and the alert rules (changes need an admin token).

    pai alerts                      firing and recent alerts (yours; every one for an admin)
    pai alerts --state firing --job alice~train
    pai alerts rules get [-o FILE]  the rule document in effect (YAML)
    pai alerts rules set FILE       replace it (- for stdin); refused if someone changed it since
                                    you read it (--revision N), or if a rule is wrong (each named)
    pai alerts rules reset          back to the rules PAI ships
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.client import ApiError, Client, connect
from cli.output import add_output, emit

console = Console()

SEVERITY_STYLE = {"critical": "red", "warning": "yellow", "info": "cyan"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    alerts = subparsers.add_parser("alerts", help="alerts and alert rules (node, GPU, job and service health)")
    alerts.add_argument("--state", choices=["firing", "resolved"])
    alerts.add_argument("--job", help="only alerts about this job (user~name)")
    add_output(alerts, legacy_json=True)
    alerts.set_defaults(func=cmd_list)
    sub = alerts.add_subparsers(dest="alerts_command")
    rules = sub.add_parser("rules", help="read or replace the alert rules")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    get = rules_sub.add_parser("get", help="print the rule document in effect (YAML)")
    get.add_argument("-o", "--output", help="write it to this file instead")
    get.set_defaults(func=cmd_rules_get)
    put = rules_sub.add_parser("set", help="replace the rule document with FILE (YAML, - for stdin); admin only")
    put.add_argument("file")
    put.add_argument("--revision", type=int, help="only if the rules are still at this revision (from `get`)")
    add_output(put)
    put.set_defaults(func=cmd_rules_set)
    reset = rules_sub.add_parser("reset", help="back to the rules PAI ships; admin only")
    add_output(reset)
    reset.set_defaults(func=cmd_rules_reset)


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    client = Client(connect(args))
    return asyncio.run(client.request(method, path, **kwargs))


def cmd_list(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("state", args.state), ("job", args.job)) if v}
    answer = _request(args, "GET", "/api/v2/alerts", params=params)
    if emit(args, answer, names=lambda a: [alert["fingerprint"] for alert in a["alerts"]]):
        return 0
    table = Table("state", "severity", "rule", "about", "since", "summary", title="alerts")
    for alert in answer["alerts"]:
        about = alert["node"] or alert["job"] or alert["service"]
        state = alert["state"] + (" (silenced)" if alert.get("inhibitedBy") else "")
        style = SEVERITY_STYLE.get(alert["severity"], "white")
        table.add_row(state, f"[{style}]{alert['severity']}[/]", alert["rule"], escape(about),
                      datetime.fromtimestamp(alert["startsAt"]).strftime("%Y-%m-%d %H:%M"), escape(alert["summary"]))
    console.print(table)
    return 0


def _describe(answer: dict) -> str:
    who = f", changed by {answer['changedBy']}" if answer.get("changedBy") else ""
    return f"revision {answer['revision']} ({answer['source']}{who})"


def cmd_rules_get(args: argparse.Namespace) -> int:
    answer = _request(args, "GET", "/api/v2/alerts/rules")
    if args.output:
        Path(args.output).write_text(answer["rules"])
        console.print(f"alert rules {_describe(answer)} written to {escape(args.output)}")
    else:
        sys.stdout.write(answer["rules"])
        print(f"# {_describe(answer)}", file=sys.stderr)
    return 0


def cmd_rules_set(args: argparse.Namespace) -> int:
    data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    client = Client(connect(args))
    answer = asyncio.run(_put_rules(client, data, args.revision))
    if emit(args, answer, names=lambda a: [str(a["revision"])]):
        return 0
    console.print(f"alert rules now at {_describe(answer)}; every monitor applies them at its next evaluation")
    return 0


async def _put_rules(client: Client, data: bytes, revision: int | None) -> Any:
    """PUT with `If-Match` when a revision is given (the shared client sends no extra headers)."""
    headers = {"Authorization": f"Bearer {client.conn.token}", "Content-Type": "text/yaml"}
    if revision is not None:
        headers["If-Match"] = f'"{revision}"'
    async with aiohttp.ClientSession() as session:
        async with session.put(client.conn.url + "/api/v2/alerts/rules", data=data, headers=headers) as resp:
            body = await resp.json(content_type=None)
            if resp.status >= 400:
                raise ApiError(resp.status, body)
            return body


def cmd_rules_reset(args: argparse.Namespace) -> int:
    answer = _request(args, "POST", "/api/v2/alerts/rules/reset")
    if emit(args, answer, names=lambda a: [str(a["revision"])]):
        return 0
    console.print(f"alert rules back to {_describe(answer)}")
    return 0
