"""The `pai` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cli import alerts as alerts_cli, nodes, report as report_cli, rules
from cli.client import ApiError, Client, connect
from cli.output import add_output, emit

console = Console()
err_console = Console(stderr=True)

STATE_STYLE = {
    "WAITING": "yellow",
    "RUNNING": "cyan",
    "STOPPING": "magenta",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "STOPPED": "dim",
}


def _when(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def cmd_up(args: argparse.Namespace) -> int:
    from cli.up import Platform
    from libs.common.config import load_config

    overrides: dict[str, Any] = {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.cluster:
        overrides["cluster_file"] = str(Path(args.cluster).resolve())
    if args.port:
        overrides["rest_port"] = args.port
    if args.cpus:
        if args.cpus < 1:
            raise SystemExit("pai up: --cpus must be at least 1")
        overrides["local_cpus"] = args.cpus
    config = load_config(args.config, **overrides)
    platform = Platform(config, print_fn=console.print)
    try:
        platform.take_data_dir()
    except RuntimeError as exc:
        err_console.print(f"[red]{exc}[/]")
        return 1
    signal.signal(signal.SIGTERM, platform.request_stop)
    signal.signal(signal.SIGINT, platform.request_stop)
    # A closed terminal too: the platform stops as on Ctrl-C instead of leaving its
    # nats-server and services running without their supervisor.
    signal.signal(signal.SIGHUP, platform.request_stop)
    try:
        with console.status("starting nats-server and the five services..."):
            conn = platform.start()
        console.print(f"[bold green]PAI is up[/] at [bold]{conn.url}[/]")
        console.print(f"admin token: [bold]{conn.token}[/]")
        _save_up_context(args, conn)
        console.print(f"data: {platform.data}   logs: {platform.logs}")
        if args.example:
            _submit_example(conn, args.example)
        if args.detach_after_example:
            return 0
        console.print("press Ctrl-C to stop")
        platform.supervise()
    except RuntimeError as exc:
        err_console.print(f"[red]{exc}[/]")
        return 1
    finally:
        with console.status("stopping..."):
            platform.stop()
        console.print("PAI stopped")
    return 0


def _save_up_context(args: argparse.Namespace, conn) -> None:
    """The platform just started becomes the current context ("local", or --context),
    so `pai` commands from any directory reach it."""
    from cli import contexts

    name = contexts.check_name(args.context or contexts.LOCAL_CONTEXT)
    path = contexts.put(name, contexts.Context(url=conn.url, token=conn.token, user="admin"))
    console.print(f"context [bold]{name}[/] (now current) in {path}")


def _submit_example(conn, path: str) -> None:
    client = Client(conn)
    body = Path(path).read_bytes()
    try:
        result = asyncio.run(client.request("POST", "/api/v2/jobs", data=body, content_type="text/yaml"))
    except ApiError as exc:
        if exc.status != 409:
            raise
        result = {"job": None}
    job = result.get("job")
    if job is None:
        console.print(f"example {path} was submitted before; see `pai list`")
        return
    console.print(f"submitted example job [bold]{job}[/]")
    deadline = time.monotonic() + 60
    state = "WAITING"
    while time.monotonic() < deadline:
        detail = asyncio.run(client.request("GET", f"/api/v2/jobs/{job}"))
        state = detail["jobStatus"]["state"]
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.3)
    console.print(f"example job {job}: {_state(state)}")
    try:
        log = asyncio.run(client.request("GET", f"/api/v2/jobs/{job}/logs", raw=True))
        console.print(log.decode(errors="replace").rstrip(), markup=False, highlight=False)
    except ApiError:
        pass


def _client(args: argparse.Namespace) -> Client:
    return Client(connect(args))


def cmd_submit(args: argparse.Namespace) -> int:
    body = Path(args.file).read_bytes() if args.file != "-" else sys.stdin.buffer.read()
    ctype = "application/json" if args.file.endswith(".json") else "text/yaml"
    result = asyncio.run(_client(args).request("POST", "/api/v2/jobs", data=body, content_type=ctype))
    if emit(args, result, names=lambda r: [r["job"]]):  # -o name: the job id alone, for scripts
        for warning in result.get("warnings", []):
            err_console.print(f"[yellow]note:[/] {warning}")
        return 0
    console.print(f"submitted [bold]{result['job']}[/]")
    for warning in result.get("warnings", []):
        console.print(f"[yellow]note:[/] {warning}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("username", args.user), ("vc", args.vc), ("state", args.state)) if v}
    rows = asyncio.run(_client(args).request("GET", "/api/v2/jobs", params=params))
    if emit(args, rows, names=lambda rs: [f"{r['username']}~{r['name']}" for r in rs]):
        return 0
    table = Table("job", "state", "vc", "tasks", "gpus", "retries", "submitted", "why waiting")
    for row in rows:
        table.add_row(
            f"{row['username']}~{row['name']}",
            _state(row["state"]),
            row["virtualCluster"],
            str(row["totalTaskNumber"]),
            str(row["totalGpuNumber"]),
            str(row["retries"]),
            _when(row["createdTime"]),
            row.get("waitingReason") or "",
        )
    console.print(table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    detail = asyncio.run(_client(args).request("GET", f"/api/v2/jobs/{args.job}"))
    if emit(args, detail, names=lambda d: [f"{d['jobStatus']['username']}~{d['name']}"]):
        return 0
    s = detail["jobStatus"]
    console.print(f"[bold]{s['username']}~{detail['name']}[/]  {_state(s['state'])}  vc={s['virtualCluster']}  "
                  f"attempt={s['attempt']}  retries={s['retries']}")
    console.print(f"submitted {_when(s['createdTime'])}  launched {_when(s['appLaunchedTime'])}  "
                  f"completed {_when(s['completedTime'])}")
    if detail.get("traceId"):
        console.print(f"[dim]trace: {detail['traceId']}[/]")
    if s.get("waitingReason"):
        console.print(f"[yellow]waiting:[/] {s['waitingReason']}")
    spec = s.get("appExitSpec")
    if spec:
        console.print(f"[red]exit {s['appExitCode']}[/]: {spec.get('phrase')} "
                      f"(task {s.get('appExitTriggerTaskRoleName')}[{s.get('appExitTriggerTaskIndex')}])")
        if spec.get("reason"):
            console.print(f"  why: {spec['reason']}")
        for line in spec.get("solution") or []:
            console.print(f"  fix: {line}")
    if s.get("appExitDiagnostics"):
        console.print("[dim]" + s["appExitDiagnostics"] + "[/]", markup=True, highlight=False)
    table = Table("task", "state", "node", "ip", "gpus", "exit", "retries")
    for role, info in detail["taskRoles"].items():
        for t in info["taskStatuses"]:
            table.add_row(f"{role}[{t['taskIndex']}]", _state(t["taskState"]), t.get("containerNodeName") or "-",
                          t.get("containerIp") or "-", t.get("containerGpus") or "-",
                          "-" if t.get("containerExitCode") is None else str(t["containerExitCode"]), str(t.get("retries", 0)))
    console.print(table)
    for note in detail.get("notes", []) + [f"kept, not acted on: {f}" for f in detail.get("ignoredFields", [])]:
        console.print(f"[dim]note: {note}[/]")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    params: dict[str, Any] = {"taskIndex": args.index}
    if args.role:
        params["taskRole"] = args.role
    if args.tail:
        params["tailBytes"] = args.tail
    if not args.follow:
        sys.stdout.buffer.write(asyncio.run(client.request("GET", f"/api/v2/jobs/{args.job}/logs", params=params, raw=True)))
        return 0
    return asyncio.run(_follow(client, args.job, params))


async def _follow(client: Client, job: str, params: dict[str, Any]) -> int:
    """Print the log as it grows until the job is final (the server streams it)."""

    def sink(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()

    await client.stream(f"/api/v2/jobs/{job}/logs", params=params | {"follow": "true"}, sink=sink)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    answer = asyncio.run(_client(args).request("PUT", f"/api/v2/jobs/{args.job}/executionType",
                                               json_body={"value": "STOP"}))
    if emit(args, answer or {"job": args.job}, names=lambda _: [args.job]):
        return 0
    console.print(f"stop of [bold]{args.job}[/] requested")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    answer = asyncio.run(_client(args).request("DELETE", f"/api/v2/jobs/{args.job}"))
    if emit(args, answer, names=lambda _: [args.job]):
        return 0
    console.print(answer["message"])
    return 0


def cmd_vcs(args: argparse.Namespace) -> int:
    vcs = asyncio.run(_client(args).request("GET", "/api/v2/virtual-clusters"))
    if emit(args, vcs):
        return 0
    table = Table("vc", "sku", "guaranteed", "used", "opportunistic", "total", "queued", "running")
    for name, vc in vcs.items():
        for sku in vc.get("skus", []):
            table.add_row(name, sku["sku"], str(sku["guaranteed"]), str(sku["used"]), str(sku["opportunistic"]),
                          str(sku["total"]), str(vc.get("queued", 0)), str(vc.get("running", 0)))
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pai", description="PAI: run AI jobs on a shared GPU cluster")
    parser.add_argument("--url", help="API URL (default: PAI_URL or the running `pai up`)")
    parser.add_argument("--token", help="bearer token (default: PAI_TOKEN or the running `pai up`)")
    parser.add_argument("--data-dir", help="PAI data directory: `pai up` runs it, other commands use its login "
                                           "(default: PAI_DATA_DIR, else .pai for `pai up`)")
    parser.add_argument("--context", help="the cluster to use, of `pai context list` (default: PAI_CONTEXT, else the "
                                          "current context); `pai login`/`pai up`: the context to write")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run nats-server and all five services on this machine")
    up.add_argument("--cluster", help="HiveD-format cluster file (default: this machine as one node)")
    up.add_argument("--config", help="PAI config file (YAML)")
    up.add_argument("--port", type=int, help="API port (default 9186)")
    up.add_argument("--cpus", type=int, help="CPUs of this machine to offer, without a cluster file "
                                             "(default: all; each is cpu_oversubscription cells, 4 by default)")
    up.add_argument("--example", help="submit this job file once the platform is up and show how it ends")
    up.add_argument("--detach-after-example", action="store_true", help=argparse.SUPPRESS)
    up.set_defaults(func=cmd_up)

    s = sub.add_parser("submit", help="submit an OpenPAI v2 job file (YAML or JSON; - for stdin)")
    s.add_argument("file")
    add_output(s)
    s.set_defaults(func=cmd_submit)

    ls = sub.add_parser("list", help="list jobs")
    ls.add_argument("--user")
    ls.add_argument("--vc")
    ls.add_argument("--state")
    add_output(ls, legacy_json=True)
    ls.set_defaults(func=cmd_list)

    st = sub.add_parser("status", help="show one job: state, tasks, why it waits or failed")
    st.add_argument("job", help="user~name")
    add_output(st, legacy_json=True)
    st.set_defaults(func=cmd_status)

    lg = sub.add_parser("logs", help="show a task's output")
    lg.add_argument("job")
    lg.add_argument("--role")
    lg.add_argument("--index", type=int, default=0)
    lg.add_argument("--tail", type=int, help="only the last N bytes")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.set_defaults(func=cmd_logs)

    sp = sub.add_parser("stop", help="stop a job")
    sp.add_argument("job")
    add_output(sp)
    sp.set_defaults(func=cmd_stop)

    dl = sub.add_parser("delete", help="delete a finished job: its records, logs and files (frees your job quota)")
    dl.add_argument("job", help="user~name")
    add_output(dl)
    dl.set_defaults(func=cmd_delete)

    vc = sub.add_parser("vcs", help="virtual clusters: quota, use and queue")
    add_output(vc, legacy_json=True)
    vc.set_defaults(func=cmd_vcs)
    rules.add_parser(sub)
    alerts_cli.add_parser(sub)
    report_cli.add_parser(sub)
    nodes.add_parser(sub)
    from cli import context_cli, login, ssh as ssh_cli, users, watch
    from cli.simulate import add_parser as add_simulate

    add_simulate(sub)
    login.add_parser(sub)
    users.add_parser(sub)
    watch.add_parser(sub)
    ssh_cli.add_parser(sub)
    from cli import market

    market.add_parser(sub)  # pai market ... (cli/market.py)
    context_cli.add_parser(sub)
    _accept_global_options_after_subcommands(parser)
    return parser


# Options of `pai` itself that read as well after the subcommand: `pai up --data-dir D`
# is `pai --data-dir D up`. Given in both places, the one after the subcommand wins.
GLOBAL_OPTIONS = ("--url", "--token", "--data-dir", "--context")


def _accept_global_options_after_subcommands(parser: argparse.ArgumentParser) -> None:
    globals_ = [a for a in parser._actions if any(o in GLOBAL_OPTIONS for o in a.option_strings)]
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for subparser in set(action.choices.values()):
            taken = {o for a in subparser._actions for o in a.option_strings}
            for option in globals_:
                if not taken.intersection(option.option_strings):
                    # SUPPRESS: not given after the subcommand leaves the value given before it.
                    subparser.add_argument(*option.option_strings, dest=option.dest, help=option.help,
                                           default=argparse.SUPPRESS)
            if _has_subcommands(subparser):  # `pai rules list --url U`
                _accept_global_options_after_subcommands(subparser)


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _complete(parser: argparse.ArgumentParser, **how: Any) -> None:
    """Answer the shell's completion request (`pai completion SHELL` prints the hook
    that asks) and exit; a no-op on any other run. `how`: argcomplete's own
    arguments (the tests give an output stream and an exit of their own)."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser, always_complete_options=False, **how)  # options once a "-" is typed


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ApiError as exc:
        body = exc.body
        err_console.print(f"[red]error {exc.status}[/]: {body.get('message') if isinstance(body, dict) else body}")
        if isinstance(body, dict):
            for e in body.get("errors", []) + (body.get("details") or {}).get("errors", []):
                line = f" (line {e['line']})" if e.get("line") else ""
                err_console.print(f"  {e['path']}{line}: {e['message']} [{e['rule']}]")
        return 2
    except OSError as exc:
        err_console.print(f"[red]cannot reach PAI[/]: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
