"""`pai login` and `pai logout`: sign in with a user name and password.

The token goes into a context of the CLI's config (cli/contexts.py: named by
`--context`, else the server's host:port), which becomes the current one; every
other `pai` command reads it. With `--data-dir` (or PAI_DATA_DIR) the token goes
into that data directory's connection file (`<data dir>/cli.json`, 0600) instead,
as before contexts."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
from pathlib import Path

import aiohttp
import msgspec
from rich.console import Console

from cli import contexts
from cli.client import ApiError, Client, Connection, connection_file
from cli.output import add_output, emit

console = Console()
DEFAULT_URL = "http://127.0.0.1:9186"


def _data_dir(args: argparse.Namespace) -> str | None:
    """The data directory whose connection file login writes: only one named."""
    return args.data_dir or os.environ.get("PAI_DATA_DIR")


def _saved(args: argparse.Namespace) -> Connection | None:
    data_dir = _data_dir(args)
    if data_dir:
        path = connection_file(data_dir)
        if not path.exists():
            return None
        return msgspec.json.decode(path.read_bytes(), type=Connection)
    found = _context(args)
    return Connection(url=found[1].url, token=found[1].token) if found else None


def _context(args: argparse.Namespace) -> tuple[str, contexts.Context] | None:
    name = getattr(args, "context", None)
    if name and name not in contexts.load().contexts:
        return None  # a context `pai login --context NAME` is to make
    return contexts.selected(name) or contexts.migrate_old_login()


def _url(args: argparse.Namespace) -> str:
    saved = _saved(args)
    return (args.url or os.environ.get("PAI_URL") or (saved.url if saved else "") or DEFAULT_URL).rstrip("/")


def save_connection(data_dir: str, conn: Connection) -> Path:
    """Write the connection file readable by this user alone."""
    path = connection_file(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(conn))
    os.replace(tmp, path)
    return path


async def sign_in(url: str, username: str, password: str, expiration: int | None = None) -> dict:
    body: dict = {"username": username, "password": password}
    if expiration:
        body["expiration"] = expiration
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/api/v2/authn/basic/login", json=body) as resp:
            reply = await resp.json(content_type=None)
            if resp.status >= 400:
                raise ApiError(resp.status, reply)
            return reply


def cmd_login(args: argparse.Namespace) -> int:
    url = _url(args)
    username = args.user or input("username: ").strip()
    password = os.environ.get("PAI_PASSWORD") if args.password_from_env else getpass.getpass("password: ")
    if password is None:
        raise SystemExit("PAI_PASSWORD is not set")
    current = _context(args)
    # Signing in again to the context's own cluster refreshes that context.
    same = current[0] if current is not None and current[1].url.rstrip("/") == url else None
    name = contexts.check_name(args.context or same or contexts.default_name(url))
    reply = asyncio.run(sign_in(url, username, password, args.expiration))
    data_dir = _data_dir(args)
    if data_dir:
        path = save_connection(data_dir, Connection(url=url, token=reply["token"]))
        where = f"token saved in {path}"
    else:
        path = contexts.put(name, contexts.Context(url=url, token=reply["token"], user=reply["user"]))
        where = f"context {name!r} (now current) in {path}"
    if emit(args, {"context": "" if data_dir else name, "url": url, "user": reply["user"],
                   "admin": bool(reply.get("admin"))}, names=lambda d: [d["context"] or d["user"]]):
        return 0
    role = " (admin)" if reply.get("admin") else ""
    console.print(f"signed in to {url} as [bold]{reply['user']}[/]{role}; {where}")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    saved = _saved(args)
    token = args.token or os.environ.get("PAI_TOKEN") or (saved.token if saved else "")
    if not token:
        console.print("not signed in")
        return 0
    url = _url(args)
    try:
        asyncio.run(Client(Connection(url=url, token=token)).request("DELETE", "/api/v2/authn/basic/logout"))
    except ApiError as exc:
        if exc.status != 401:  # 401: the token had expired or was revoked already
            raise
    data_dir = _data_dir(args)
    if saved is not None and saved.token == token:
        if data_dir:
            save_connection(data_dir, Connection(url=url, token=""))
        else:  # the context stays (its URL and user), without the token
            found = _context(args)
            if found is not None:
                name, context = found
                contexts.put(name, msgspec.structs.replace(context, token=""), make_current=False)
    console.print(f"signed out of {url}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    login = subparsers.add_parser("login", help="sign in with a user name and password; later commands use the token")
    login.add_argument("--user", "-u", help="user name (asked for when not given)")
    login.add_argument("--expiration", type=int, help="seconds the token lives (default: the server's, 7 days)")
    login.add_argument("--password-from-env", action="store_true", help="read the password from PAI_PASSWORD")
    add_output(login)
    login.set_defaults(func=cmd_login)
    logout = subparsers.add_parser("logout", help="end this sign-in: the saved token stops working")
    logout.set_defaults(func=cmd_logout)
