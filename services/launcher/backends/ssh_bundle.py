"""The ssh plugin's server for container tasks, whatever their image: a bundle PAI brings.

A container task of a role that runs the ssh plugin (libs/common/protocol/ssh.py) gets
this node's OpenSSH `sshd` and `ssh`, bound read-only at MOUNT_POINT, so an image need
not have OpenSSH, nor even a C library (a busybox-static image has none). The bundle is
made once per launcher data dir from the node's own files: the two programs, every
shared library they and libnss_wrapper need (as the node's loader resolves them), and
the dynamic loader itself. Each program is started through a small `/bin/sh` wrapper
that runs it with the bundle's loader, library path and libnss_wrapper preloaded (the
job's uid has no passwd entry in the image; the plugin's passwd file gives it one), and
tells it the wrapper's path as its argv[0]: sshd re-executes itself for every
connection by that path, so each session goes through the wrapper again. Nothing of
the bundle reaches the image's own programs: no LD_PRELOAD or library path is exported.
The node's loader must know --argv0 and --preload (glibc 2.33 or later: Debian 12 has 2.36).

Made in a directory named after what it holds (the programs' sizes and times), written
to a temporary directory and renamed into place, so a launcher killed while making it
leaves nothing half made in use, and an upgraded OpenSSH gets a bundle of its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from libs.common.protocol import ssh as protocol_ssh

log = logging.getLogger(__name__)

MOUNT_POINT = "/pai/ssh"
SSH_CLIENT = "/usr/bin/ssh"
# Where libnss_wrapper is on Debian and the like.
NSS_WRAPPER_GLOB = f"/usr/lib/*/{protocol_ssh.NSS_WRAPPER}"
PROGRAMS = {"sbin/sshd": protocol_ssh.SSHD, "bin/ssh": SSH_CLIENT}
_LDD_LINE = re.compile(r"^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")


def _needed(binary: str) -> list[str]:
    """The shared libraries `binary` loads and the loader, as the node's ldd resolves them."""
    done = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30, check=True)
    return [m.group(1) for m in map(_LDD_LINE.match, done.stdout.splitlines()) if m]


def _nss_wrapper() -> str | None:
    found = sorted(Path("/usr/lib").glob(f"*/{protocol_ssh.NSS_WRAPPER}"))
    return str(found[0]) if found else None


def _identity(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        st = os.stat(path)
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def _wrapper(loader: str, real: str, shown: str) -> str:
    lib = f"{MOUNT_POINT}/lib"
    return (f"#!/bin/sh\n# PAI's ssh plugin: {Path(real).name} from the node, with its own libraries "
            "(services/launcher/backends/ssh_bundle.py)\n"
            f'exec {lib}/{loader} --library-path {lib} --preload {lib}/{protocol_ssh.NSS_WRAPPER} '
            f'--argv0 {shown} {MOUNT_POINT}/libexec/{Path(real).name} "$@"\n')


class Unavailable(Exception):
    """What this node lacks to make the bundle from."""


def _sources() -> list[str]:
    """sshd, ssh and libnss_wrapper of this node, or Unavailable naming what is missing."""
    nss = _nss_wrapper()
    missing = [p for p in (protocol_ssh.SSHD, SSH_CLIENT) if not os.access(p, os.X_OK)] + ([] if nss else [NSS_WRAPPER_GLOB])
    if missing or shutil.which("ldd") is None:
        raise Unavailable(f"{', '.join(missing) or 'ldd'} missing on this node (Debian: openssh-server, "
                          "openssh-client, libnss-wrapper, libc-bin)")
    assert nss is not None
    return [protocol_ssh.SSHD, SSH_CLIENT, nss]


def fill(work: Path, sources: list[str]) -> int:
    """Write the bundle into the empty directory `work` (to be seen at MOUNT_POINT by the
    task); the number of libraries it holds."""
    libraries: dict[str, str] = {}
    for binary in sources:
        for path in _needed(binary):
            libraries.setdefault(Path(path).name, os.path.realpath(path))
    loader = next((name for name in libraries if name.startswith("ld-linux")), None)
    if loader is None:
        raise Unavailable(f"no dynamic loader found for {protocol_ssh.SSHD}")
    libraries[protocol_ssh.NSS_WRAPPER] = sources[-1]
    for sub in ("lib", "libexec", "sbin", "bin"):
        (work / sub).mkdir()
    for name, path in libraries.items():
        shutil.copy2(path, work / "lib" / name)
    for shown, real in PROGRAMS.items():
        shutil.copy2(real, work / "libexec" / Path(real).name)
        (work / shown).write_text(_wrapper(loader, real, f"{MOUNT_POINT}/{shown}"))
    for made in work.rglob("*"):  # every part readable and runnable by the job's uid
        made.chmod(0o755)
    return len(libraries)


def prepare(under: Path) -> Path | None:
    """The bundle's directory under `under` (made when missing), or None where this node
    has no OpenSSH server, client or libnss_wrapper to make it from (said in the log)."""
    try:
        sources = _sources()
    except Unavailable as exc:
        log.warning("the ssh plugin cannot run in container tasks: %s", exc)
        return None
    target = under / f"ssh-bundle-{_identity(sources)}"
    if (target / "sbin" / "sshd").exists():
        return target
    under.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".ssh-bundle-", dir=under))
    try:
        try:
            count = fill(work, sources)
        except Unavailable as exc:
            log.warning("the ssh plugin cannot run in container tasks: %s", exc)
            shutil.rmtree(work, ignore_errors=True)
            return None
        work.chmod(0o755)
        try:
            work.rename(target)
        except OSError:  # made meanwhile by another launcher of this data dir
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("made the ssh plugin's bundle for container tasks: %s (%d libraries)", target, count)
    return target


def wants_ssh(env: dict[str, str]) -> bool:
    """Whether a task runs the ssh plugin's server: its role was given the plugin's port."""
    return "PAI_CONTAINER_SSH_PORT" in env


class Bundles:
    """The bundle of one data dir, made at the first task that needs it."""

    def __init__(self, under: Path):
        self.under = under
        self._made: Path | None = None
        self._tried = False

    def binds(self, env: dict[str, str]) -> list[str]:
        if not wants_ssh(env):
            return []
        if not self._tried:
            self._tried = True
            try:
                self._made = prepare(self.under)
            except (OSError, subprocess.SubprocessError) as exc:
                log.error("the ssh plugin's bundle for container tasks could not be made: %s", exc)
        return [f"{self._made}:{MOUNT_POINT}:ro"] if self._made is not None else []


def main(argv: list[str] | None = None) -> int:
    """`python -m services.launcher.backends.ssh_bundle DIR`: the bundle written into the
    empty directory DIR, from this image's OpenSSH. A Kubernetes task Pod's init container
    runs it in PAI's launcher image, DIR the emptyDir its task sees read-only at
    MOUNT_POINT (services/launcher/backends/kube_pods.py). Where it cannot be made, it
    says why and exits 0: the task runs without the server, its ssh step saying so, as in
    a local container task."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m services.launcher.backends.ssh_bundle DIR (an empty directory)", file=sys.stderr)
        return 2
    work = Path(args[0])
    try:
        count = fill(work, _sources())
    except (Unavailable, OSError, subprocess.SubprocessError) as exc:
        print(f"[PAI] ssh plugin: no server bundle for this task: {exc}", file=sys.stderr)
        return 0
    print(f"[PAI] ssh plugin: server bundle made in {work} ({count} libraries)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
