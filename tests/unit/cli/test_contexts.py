"""`pai`'s contexts, `-o json|yaml|name` and shell completion, against a small API
of the test's own (an aiohttp server in a thread) that checks each request's token."""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import argcomplete.finders
import argcomplete.io
import pytest
import yaml
from aiohttp import web

from cli.main import _complete as _complete_with, build_parser, main

REPO = Path(__file__).resolve().parents[3]
PASSWORD = "correct horse"


class FakePai:
    """Two users' logins, a job list per token, a submit that names the job."""

    def __init__(self, name: str):
        self.name = name
        self.seen_tokens: list[str] = []
        self.revoked: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v2/authn/basic/login", self.login)
        app.router.add_delete("/api/v2/authn/basic/logout", self.logout)
        app.router.add_get("/api/v2/jobs", self.jobs)
        app.router.add_post("/api/v2/jobs", self.submit)
        return app

    def _user(self, request: web.Request) -> str:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen_tokens.append(token)
        if not token.startswith(f"{self.name}-") or token in self.revoked:
            raise web.HTTPUnauthorized(text=json.dumps({"message": "bad token"}), content_type="application/json")
        return token.split("-", 2)[1]

    async def login(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["password"] != PASSWORD:
            return web.json_response({"message": "wrong password"}, status=401)
        return web.json_response({"token": f"{self.name}-{body['username']}-t", "user": body["username"], "admin": False})

    async def logout(self, request: web.Request) -> web.Response:
        self._user(request)
        self.revoked.add(request.headers["Authorization"].removeprefix("Bearer "))
        return web.json_response({"message": "signed out"})

    async def jobs(self, request: web.Request) -> web.Response:
        user = self._user(request)
        return web.json_response([{"username": user, "name": f"on-{self.name}", "state": "RUNNING", "virtualCluster": "default",
                                   "totalTaskNumber": 1, "totalGpuNumber": 0, "retries": 0, "createdTime": 0}])

    async def submit(self, request: web.Request) -> web.Response:
        user = self._user(request)
        spec = yaml.safe_load(await request.read())
        return web.json_response({"job": f"{user}~{spec['name']}", "warnings": ["a note for people"]}, status=202)


@pytest.fixture(scope="module")
def servers():
    """Two clusters, "a" and "b", each on its own port, served from one thread."""
    loop = asyncio.new_event_loop()
    runners, urls = [], {}

    async def start():
        for name in ("a", "b"):
            runner = web.AppRunner(FakePai(name).app())
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"

    loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield urls
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user's config directory and a working directory of their own, no PAI_* set."""
    for name in ("PAI_URL", "PAI_TOKEN", "PAI_CONTEXT", "PAI_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("PAI_PASSWORD", PASSWORD)
    monkeypatch.setenv("COLUMNS", "200")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def pai(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def config_of(home: Path) -> dict:
    return yaml.safe_load((home / "config" / "pai" / "config.yaml").read_text())


def test_login_adds_contexts_that_every_directory_uses(servers, home, capsys, monkeypatch):
    assert pai(capsys, "--url", servers["a"], "login", "-u", "alice", "--password-from-env")[0] == 0
    path = home / "config" / "pai" / "config.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "it holds tokens"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    host_a = servers["a"].removeprefix("http://")
    assert config_of(home)["current-context"] == host_a
    assert not (home / "work" / ".pai").exists(), "nothing written to the working directory any more"

    # A second cluster under a name of the user's choosing becomes current.
    assert pai(capsys, "login", "--url", servers["b"], "--context", "prod", "-u", "bob", "--password-from-env")[0] == 0

    elsewhere = home / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a `cd` keeps the login
    code, out, _ = pai(capsys, "list", "-o", "name")
    assert (code, out) == (0, "bob~on-b\n")
    assert pai(capsys, "list", "-o", "name", "--context", host_a)[1] == "alice~on-a\n", "--context picks one for a command"
    monkeypatch.setenv("PAI_CONTEXT", host_a)
    assert pai(capsys, "list", "-o", "name")[1] == "alice~on-a\n", "and so does PAI_CONTEXT"
    monkeypatch.delenv("PAI_CONTEXT")

    code, out, _ = pai(capsys, "context", "list", "-o", "json")
    listed = json.loads(out)
    assert [(c["name"], c["current"], c["user"]) for c in listed] == [(host_a, False, "alice"), ("prod", True, "bob")]
    assert "-t" not in out, "a listing never shows a token"

    assert pai(capsys, "context", "use", host_a)[0] == 0
    assert pai(capsys, "list", "-o", "name")[1] == "alice~on-a\n"
    assert pai(capsys, "context", "rename", host_a, "dev")[0] == 0
    assert pai(capsys, "context", "current")[1] == "dev\n", "renaming the current context keeps it current"
    assert pai(capsys, "context", "list", "-o", "name")[1] == "dev\nprod\n"

    with pytest.raises(SystemExit) as refused:
        pai(capsys, "context", "use", "nope")
    assert "no context 'nope'" in str(refused.value.code) and "dev, prod" in str(refused.value.code)
    with pytest.raises(SystemExit) as refused:
        pai(capsys, "context", "rename", "dev", "has space")
    assert "context name 'has space'" in str(refused.value.code)

    assert pai(capsys, "context", "delete", "dev")[0] == 0
    assert "current-context" not in config_of(home), "deleting the current context leaves none current"
    with pytest.raises(SystemExit, match="don't know where PAI runs"):
        pai(capsys, "list")  # no current context left: the command says what to do
    assert pai(capsys, "--context", "prod", "list", "-o", "name")[1] == "bob~on-b\n"

    # Logging out revokes the token and keeps the context, without it.
    assert pai(capsys, "logout", "--context", "prod")[0] == 0
    assert config_of(home)["contexts"]["prod"] == {"url": servers["b"], "user": "bob"}


def test_the_old_login_in_dot_pai_is_moved_once_and_said(servers, home, capsys, monkeypatch):
    old = home / "work" / ".pai"
    old.mkdir()
    (old / "cli.json").write_text(json.dumps({"url": servers["a"], "token": "a-carol-t"}))
    code, out, err = pai(capsys, "list", "-o", "name")
    assert (code, out) == (0, "carol~on-a\n")
    assert "moved the login" in err and "'local'" in err and str(home / "config" / "pai" / "config.yaml") in err
    assert config_of(home) == {"current-context": "local", "contexts": {"local": {"url": servers["a"], "token": "a-carol-t"}}}

    (old / "cli.json").write_text(json.dumps({"url": servers["b"], "token": "b-dave-t"}))  # read once: no longer
    code, out, err = pai(capsys, "list", "-o", "name")
    assert (code, out, err) == (0, "carol~on-a\n", "")


def test_output_formats_and_submit_printing_the_job_id_alone(servers, home, capsys, tmp_path):
    pai(capsys, "--url", servers["a"], "login", "-u", "erin", "--password-from-env")
    job = tmp_path / "job.yaml"
    job.write_text("protocolVersion: 2\nname: train\ntype: job\n")
    code, out, err = pai(capsys, "submit", str(job), "-o", "name")
    assert (code, out) == (0, "erin~train\n"), "a script reads the id from stdout"
    assert "a note for people" in err, "notes go to stderr, not into the id"
    assert json.loads(pai(capsys, "submit", str(job), "-o", "json")[1])["job"] == "erin~train"
    assert yaml.safe_load(pai(capsys, "list", "-o", "yaml")[1])[0]["name"] == "on-a"
    assert json.loads(pai(capsys, "list", "--json")[1])[0]["username"] == "erin", "--json still works"
    assert "submitted" in pai(capsys, "submit", str(job))[1], "without -o: for people"


def test_data_dir_login_keeps_its_connection_file(servers, home, capsys, tmp_path):
    """With --data-dir (a `pai up` platform's), the login goes where it always went."""
    data = tmp_path / "data"
    assert pai(capsys, "--url", servers["a"], "--data-dir", str(data), "login", "-u", "fay", "--password-from-env")[0] == 0
    assert json.loads((data / "cli.json").read_text())["token"] == "a-fay-t"
    assert not (home / "config" / "pai" / "config.yaml").exists()
    assert pai(capsys, "--data-dir", str(data), "list", "-o", "name")[1] == "fay~on-a\n"


class _Answered(Exception):
    pass


def _complete(line: str, monkeypatch) -> list[str]:
    """What `pai` answers the shell for `line`, through argcomplete's protocol (the
    environment bash's hook sets), in this process: each answer a fresh parser."""
    for name, value in {"_ARGCOMPLETE": "1", "_ARGCOMPLETE_SHELL": "bash", "COMP_LINE": line,
                        "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n"}.items():
        monkeypatch.setenv(name, value)
    answer = io.StringIO()
    # argcomplete writes its debug stream to fd 9, one of pytest's own here.
    monkeypatch.setattr(argcomplete.finders.CompletionFinder, "_init_debug_stream",
                        lambda self: setattr(argcomplete.io, "debug_stream", io.StringIO()))

    def answered(code: int = 0) -> None:
        raise _Answered(code)

    with pytest.raises(_Answered) as done:
        _complete_with(build_parser(), output_stream=answer, exit_method=answered)
    assert done.value.args == (0,)
    for name in ("_ARGCOMPLETE", "COMP_LINE", "COMP_POINT"):
        monkeypatch.delenv(name)
    return [w.strip() for w in answer.getvalue().split("\n") if w.strip()]


def test_completion_of_commands_options_and_context_names(servers, home, capsys, monkeypatch):
    pai(capsys, "--url", servers["a"], "login", "--context", "staging", "-u", "gus", "--password-from-env")
    pai(capsys, "--url", servers["b"], "login", "--context", "prod", "-u", "gus", "--password-from-env")
    assert _complete("pai cont", monkeypatch) == ["context"] and _complete("pai comp", monkeypatch) == ["completion"]
    assert set(_complete("pai context use ", monkeypatch)) == {"staging", "prod"}, "context names from the user's config"
    assert set(_complete("pai list -o ", monkeypatch)) == {"json", "yaml", "name"}
    assert "--output" in _complete("pai list --o", monkeypatch) and "--context" in _complete("pai list --con", monkeypatch)


def test_completion_scripts_for_each_shell_and_bash_runs_its_own(servers, home, capsys, tmp_path):
    scripts = {shell: pai(capsys, "completion", shell)[1] for shell in ("bash", "zsh", "fish")}
    assert "complete" in scripts["bash"] and "#compdef pai" in scripts["zsh"] and "complete --command pai" in scripts["fish"]
    pai(capsys, "--url", servers["a"], "login", "--context", "lab", "-u", "hal", "--password-from-env")
    # bash sources the script and completes `pai context use l` through it (pai on PATH: the venv's).
    script = tmp_path / "pai.bash"
    script.write_text(scripts["bash"])
    venv_bin = Path(sys.executable).parent
    bash = (f"source {script}; COMP_LINE='pai context use l'; COMP_POINT=${{#COMP_LINE}}; "
            "COMP_WORDS=(pai context use l); COMP_CWORD=3; _python_argcomplete pai; printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", bash], env={**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}"},
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["lab"], (done.stdout, done.stderr)
