"""The CLI's configuration: the clusters it knows (contexts) and which one is current.

One YAML file in the user's config directory, `$XDG_CONFIG_HOME/pai/config.yaml`
(`~/.config/pai/config.yaml` when XDG_CONFIG_HOME is unset), 0600 in a 0700
directory, since it holds tokens:

    current-context: prod
    contexts:
      prod: {url: https://pai.example.com, token: alice.<secret>, user: alice}
      local: {url: http://127.0.0.1:9186, token: admin.<secret>, user: admin}

`pai login` adds or refreshes a context and makes it current, `pai up` does the same
for the platform it started ("local"), `pai context list|use|rename|delete` manage
them, and `--context NAME` (or `PAI_CONTEXT`) picks one for a single command.

Before contexts, the login lived in `./.pai/cli.json` of whatever directory the
command ran in. That file is read once, when no config file exists yet: it becomes
the context "local" and the command says so (`migrate_old_login`).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import yaml

CONFIG_NAME = "config.yaml"
OLD_LOGIN = Path(".pai") / "cli.json"  # where the login lived before contexts (relative to the cwd)
LOCAL_CONTEXT = "local"  # the context `pai up` and the migration write
# A context name is also a shell word and a YAML key: no spaces, no slashes.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,62}$")


class ContextError(SystemExit):
    """A wrong context name or a config file that cannot be read: the message (on
    stderr, exit status 1) says which and where."""

    def __init__(self, message: str):
        super().__init__(f"pai: {message}")


class Context(msgspec.Struct, kw_only=True, omit_defaults=True):
    url: str
    token: str = ""
    user: str = ""


class CliConfig(msgspec.Struct, kw_only=True, omit_defaults=True, rename={"current": "current-context"}):
    current: str = ""
    contexts: dict[str, Context] = {}


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    # The XDG spec: a relative XDG_CONFIG_HOME is invalid and to be ignored.
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "pai"


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ContextError(f"context name {name!r}: use 1 to 63 letters, digits or . _ @ : - (starting with a letter or digit)")
    return name


def default_name(url: str) -> str:
    """A new login's context name when none is given: the server's host[:port]."""
    netloc = urlsplit(url).netloc.rsplit("@", 1)[-1]
    return netloc or LOCAL_CONTEXT


def load(path: Path | None = None) -> CliConfig:
    path = path or config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return CliConfig()
    try:
        return msgspec.convert(yaml.safe_load(raw) or {}, CliConfig)
    except (yaml.YAMLError, msgspec.ValidationError) as error:
        raise ContextError(f"{path} is not a PAI CLI config: {error}") from None


def save(config: CliConfig, path: Path | None = None) -> Path:
    """Write the file readable by this user alone, atomically (a crash leaves the old one)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = yaml.safe_dump(msgspec.to_builtins(config), sort_keys=False)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
    return path


def put(name: str, context: Context, *, make_current: bool = True) -> Path:
    """Add or replace context `name` (and make it current)."""
    config = load()
    contexts = {**config.contexts, check_name(name): context}
    current = name if make_current or not config.current else config.current
    return save(CliConfig(current=current, contexts=contexts))


def selected(name: str | None = None) -> tuple[str, Context] | None:
    """The context a command uses: `name` (--context), else PAI_CONTEXT, else the
    current one; None when there is none. A named context that does not exist is an
    error naming the known ones."""
    config = load()
    wanted = name or os.environ.get("PAI_CONTEXT") or ""
    if wanted:
        if wanted not in config.contexts:
            known = ", ".join(sorted(config.contexts)) or "none"
            raise ContextError(f"no context {wanted!r} in {config_path()} (known: {known})")
        return wanted, config.contexts[wanted]
    if config.current and config.current in config.contexts:
        return config.current, config.contexts[config.current]
    return None


def migrate_old_login() -> tuple[str, Context] | None:
    """Once, while no config file exists: take the login kept in ./.pai/cli.json
    (before contexts) as the context "local", and say so on stderr."""
    if config_path().exists() or not OLD_LOGIN.is_file():
        return None
    try:
        old = msgspec.json.decode(OLD_LOGIN.read_bytes(), type=Context)
    except (msgspec.DecodeError, msgspec.ValidationError, OSError):
        return None
    path = put(LOCAL_CONTEXT, old)
    print(f"pai: moved the login in {OLD_LOGIN.resolve()} to the context {LOCAL_CONTEXT!r} in {path}; "
          "from now on that file is not read (see `pai context list`)", file=sys.stderr)
    return LOCAL_CONTEXT, old


def use(name: str) -> Path:
    config = load()
    _known(config, name)
    return save(CliConfig(current=name, contexts=config.contexts))


def rename(old: str, new: str) -> Path:
    config = load()
    _known(config, old)
    check_name(new)
    if new in config.contexts and new != old:
        raise ContextError(f"a context {new!r} exists already; delete it first")
    contexts = {(new if k == old else k): v for k, v in config.contexts.items()}
    return save(CliConfig(current=new if config.current == old else config.current, contexts=contexts))


def delete(name: str) -> Path:
    config = load()
    _known(config, name)
    contexts = {k: v for k, v in config.contexts.items() if k != name}
    return save(CliConfig(current="" if config.current == name else config.current, contexts=contexts))


def _known(config: CliConfig, name: str) -> None:
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none"
        raise ContextError(f"no context {name!r} in {config_path()} (known: {known})")
