"""`pai users ...`, `pai groups ...` (admins) and `pai tokens ...` (anyone, their own)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from cli.client import Client, connect
from cli.output import add_output, emit

console = Console()


def _client(args: argparse.Namespace) -> Client:
    return Client(connect(args))


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    return asyncio.run(_client(args).request(method, path, json_body=body))


def _print(args: argparse.Namespace, value: Any, names: Any = None) -> None:
    """JSON as these commands always printed it, or what -o asks."""
    if not emit(args, value, names=names):
        print(json.dumps(value, indent=2))


def _password(args: argparse.Namespace) -> str | None:
    if not getattr(args, "set_password", False):
        return None
    first, again = getpass.getpass("new password: "), getpass.getpass("again: ")
    if first != again:
        raise SystemExit("the two passwords differ")
    return first


# --- users --------------------------------------------------------------------------------------


def cmd_users_list(args: argparse.Namespace) -> int:
    users = _call(args, "GET", "/api/v2/users")
    if emit(args, users, names=lambda us: [u["username"] for u in us]):
        return 0
    table = Table("user", "admin", "groups", "virtual clusters", "email")
    for u in users:
        table.add_row(u["username"], "yes" if u["admin"] else "", ", ".join(u["grouplist"]),
                      ", ".join(u["virtualCluster"]), u["email"])
    console.print(table)
    return 0


def cmd_users_show(args: argparse.Namespace) -> int:
    _print(args, _call(args, "GET", f"/api/v2/users/{args.username}"), names=lambda u: [u["username"]])
    return 0


def cmd_users_add(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"username": args.username, "admin": args.admin, "email": args.email or ""}
    if args.groups:
        body["grouplist"] = args.groups.split(",")
    password = _password(args)
    if password is not None:
        body["password"] = password
    created = _call(args, "POST", "/api/v2/users", body)
    if emit(args, created, names=lambda c: [c["username"]]):
        return 0
    console.print(f"created user [bold]{created['username']}[/]; their token (shown once):")
    print(created["token"])
    return 0


def cmd_users_set(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.email is not None:
        body["email"] = args.email
    if args.admin is not None:
        body["admin"] = args.admin == "yes"
    if args.groups is not None:
        body["grouplist"] = [g for g in args.groups.split(",") if g]
    password = _password(args)
    if password is not None:
        body["password"] = password
    if not body:
        raise SystemExit("nothing to change: give --email, --admin, --groups or --set-password")
    _print(args, _call(args, "PUT", f"/api/v2/users/{args.username}", body), names=lambda _: [args.username])
    return 0


def cmd_users_delete(args: argparse.Namespace) -> int:
    answer = _call(args, "DELETE", f"/api/v2/users/{args.username}")
    if not emit(args, answer, names=lambda _: [args.username]):
        print(answer["message"])
    return 0


def cmd_passwd(args: argparse.Namespace) -> int:
    old = getpass.getpass("current password (empty if none): ")
    args.set_password = True
    new = _password(args)
    body = {"password": new, **({"oldPassword": old} if old else {})}
    _call(args, "PUT", "/api/v2/users/me", body)
    console.print("password changed; your other sign-ins have ended")
    return 0


# --- groups --------------------------------------------------------------------------------------


def cmd_groups_list(args: argparse.Namespace) -> int:
    groups = _call(args, "GET", "/api/v2/groups")
    if emit(args, groups, names=lambda gs: [g["groupname"] for g in gs]):
        return 0
    table = Table("group", "admin", "virtual clusters", "priority classes", "storages", "description")
    for g in groups:
        acls = g["extension"]["acls"]
        table.add_row(g["groupname"], "yes" if acls["admin"] else "", ", ".join(acls["virtualClusters"]),
                      ", ".join(acls.get("priorityClasses", [])), ", ".join(acls.get("storageConfigs", [])),
                      g["description"])
    console.print(table)
    return 0


def cmd_groups_show(args: argparse.Namespace) -> int:
    group = _call(args, "GET", f"/api/v2/groups/{args.groupname}")
    members = _call(args, "GET", f"/api/v2/groups/{args.groupname}/userlist")  # OpenPAI's {username, clusterAdmin}
    _print(args, {**group, "members": [m["username"] if isinstance(m, dict) else m for m in members]},
           names=lambda _: [args.groupname])
    return 0


def _acls(args: argparse.Namespace, kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """The group's acls from the options; `kept`: the group's own, for the lists an option does not give."""
    acls: dict[str, Any] = {"admin": bool(args.admin), "virtualClusters": [v for v in (args.vcs or "").split(",") if v]}
    for option, key in (("priority_classes", "priorityClasses"), ("storages", "storageConfigs")):
        given = getattr(args, option)
        if given is not None:
            acls[key] = [c for c in given.split(",") if c]
        elif kept is not None and key in kept:
            acls[key] = kept[key]
    return acls


def cmd_groups_add(args: argparse.Namespace) -> int:
    body = {"groupname": args.groupname, "description": args.description or "", "extension": {"acls": _acls(args)}}
    _print(args, _call(args, "POST", "/api/v2/groups", body), names=lambda _: [args.groupname])
    return 0


def cmd_groups_set(args: argparse.Namespace) -> int:
    kept = None
    if args.priority_classes is None or args.storages is None:  # not given: the group keeps what it grants
        kept = _call(args, "GET", f"/api/v2/groups/{args.groupname}")["extension"]["acls"]
    body: dict[str, Any] = {"extension": {"acls": _acls(args, kept)}}
    if args.description is not None:
        body["description"] = args.description
    _print(args, _call(args, "PUT", f"/api/v2/groups/{args.groupname}", body), names=lambda _: [args.groupname])
    return 0


def cmd_groups_delete(args: argparse.Namespace) -> int:
    answer = _call(args, "DELETE", f"/api/v2/groups/{args.groupname}")
    if not emit(args, answer, names=lambda _: [args.groupname]):
        print(answer["message"])
    return 0


# --- tokens --------------------------------------------------------------------------------------


def cmd_tokens_list(args: argparse.Namespace) -> int:
    tokens = _call(args, "GET", "/api/v2/tokens")["tokens"]
    if emit(args, tokens, names=lambda ts: [t["id"] for t in ts]):
        return 0
    table = Table("id", "kind", "description", "created", "expires")
    from datetime import datetime

    def when(ms):
        return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M") if ms else "never"

    for t in tokens:
        table.add_row(t["id"], t["kind"], t["description"], when(t["createdTime"]), when(t["expiresTime"]))
    console.print(table)
    return 0


def cmd_tokens_add(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"description": args.description or ""}
    if args.expiration:
        body["expiration"] = args.expiration
    made = _call(args, "POST", "/api/v2/tokens", body)
    if emit(args, made, names=lambda m: [m["id"]]):  # -o json has the token itself
        return 0
    console.print(f"token {made['id']} (shown once):")
    print(made["token"])
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    answer = _call(args, "DELETE", f"/api/v2/tokens/{args.id}")
    if not emit(args, answer, names=lambda _: [args.id]):
        print(answer["message"])
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    users = subparsers.add_parser("users", help="users (admins): list, show, add, set, delete")
    u = users.add_subparsers(dest="users_command", required=True)
    ls = u.add_parser("list")
    add_output(ls, legacy_json=True)
    ls.set_defaults(func=cmd_users_list)
    show = u.add_parser("show")
    show.add_argument("username")
    add_output(show)
    show.set_defaults(func=cmd_users_show)
    add = u.add_parser("add", help="create a user; prints their first token")
    add.add_argument("username")
    add.add_argument("--admin", action="store_true")
    add.add_argument("--email")
    add.add_argument("--groups", help="comma-separated groups (default: default)")
    add.add_argument("--set-password", action="store_true", help="ask for a password to sign in with")
    add_output(add)
    add.set_defaults(func=cmd_users_add)
    change = u.add_parser("set", help="change a user's email, admin rights, groups or password")
    change.add_argument("username")
    change.add_argument("--email")
    change.add_argument("--admin", choices=["yes", "no"])
    change.add_argument("--groups", help="comma-separated: the user's whole group list")
    change.add_argument("--set-password", action="store_true")
    add_output(change)
    change.set_defaults(func=cmd_users_set)
    delete = u.add_parser("delete", help="delete a user; their tokens stop working")
    delete.add_argument("username")
    add_output(delete)
    delete.set_defaults(func=cmd_users_delete)

    groups = subparsers.add_parser("groups", help="groups and the VCs they open (admins change them)")
    g = groups.add_subparsers(dest="groups_command", required=True)
    gls = g.add_parser("list")
    add_output(gls, legacy_json=True)
    gls.set_defaults(func=cmd_groups_list)
    gshow = g.add_parser("show", help="a group and its members")
    gshow.add_argument("groupname")
    add_output(gshow)
    gshow.set_defaults(func=cmd_groups_show)
    for name, func, help_text in (("add", cmd_groups_add, "create a group"),
                                  ("set", cmd_groups_set, "change a group's VCs, admin flag, description")):
        p = g.add_parser(name, help=help_text)
        p.add_argument("groupname")
        p.add_argument("--vcs", help="comma-separated virtual clusters its members may submit to")
        p.add_argument("--admin", action="store_true", help="its members are admins")
        p.add_argument("--priority-classes", dest="priority_classes",
                       help="comma-separated job priority classes its members may use beyond test and oppo "
                            "(prod, crit); `set` without it keeps the group's")
        p.add_argument("--storages", help="comma-separated storages its members may mount (docs/storage.md); "
                                          "`set` without it keeps the group's")
        p.add_argument("--description")
        add_output(p)
        p.set_defaults(func=func)
    gdel = g.add_parser("delete", help="delete a group with no members")
    gdel.add_argument("groupname")
    add_output(gdel)
    gdel.set_defaults(func=cmd_groups_delete)

    tokens = subparsers.add_parser("tokens", help="your tokens: list, add (for scripts), revoke")
    t = tokens.add_subparsers(dest="tokens_command", required=True)
    tls = t.add_parser("list")
    add_output(tls)
    tls.set_defaults(func=cmd_tokens_list)
    tadd = t.add_parser("add", help="a token for a script; printed once")
    tadd.add_argument("--expiration", type=int, help="seconds it lives (default: the server's, 90 days)")
    tadd.add_argument("--description")
    add_output(tadd)
    tadd.set_defaults(func=cmd_tokens_add)
    trev = t.add_parser("revoke")
    trev.add_argument("id", help="the token's id from `pai tokens list` (or the token itself)")
    add_output(trev)
    trev.set_defaults(func=cmd_tokens_revoke)

    passwd = subparsers.add_parser("passwd", help="change your password")
    passwd.set_defaults(func=cmd_passwd)
