"""`pai report`: GPU-hours per VC and per user, the top jobs and idle GPUs (admins).

    pai report               the last 7 days
    pai report --days 30 --send    and mail it to the admins (admin_emails)
"""

from __future__ import annotations

import argparse
import asyncio

from rich.console import Console
from rich.table import Table

from cli.client import Client, connect
from cli.output import add_output, emit

console = Console()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="usage report: GPU-hours per VC and user, top jobs, idle GPUs")
    report.add_argument("--days", type=float, default=7.0, help="how far back (default 7)")
    report.add_argument("--send", action="store_true", help="also mail it to the admins")
    add_output(report, legacy_json=True)
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    client = Client(connect(args))
    answer = asyncio.run(client.request("POST" if args.send else "GET", "/api/v2/report", params={"days": args.days}))
    if emit(args, answer, names=lambda a: [f"{a['from']}..{a['to']}"]):
        return 0
    console.print(f"[bold]PAI usage[/] {answer['from']} to {answer['to']}: {answer['gpuHours']} GPU-hours")
    for title, key, label in (("per virtual cluster", "gpuHoursByVc", "VC"), ("per user", "gpuHoursByUser", "user")):
        table = Table(label, "GPU-hours", title=title)
        for name, hours in answer[key].items():
            table.add_row(name, str(hours))
        console.print(table)
    jobs = Table("job", "VC", "GPUs", "state", "GPU-hours", title="top jobs")
    for job in answer["topJobs"]:
        jobs.add_row(job["job"], job["vc"], str(job["gpus"]), job["state"], str(job["gpuHours"]))
    console.print(jobs)
    idle = Table("node", "GPU", "busy %", "held by a running job", title=f"idle GPUs now (of {answer['gpus']})")
    for gpu in answer["idleGpus"]:
        idle.add_row(gpu["node"], str(gpu["gpu"]), str(gpu["utilization"]), "yes" if gpu["heldByRunningJob"] else "no")
    console.print(idle)
    if args.send:
        console.print("mailed to the admins" if answer["mailed"] else "[yellow]not mailed[/] (no smtp_host or admin_emails?)")
    return 0
