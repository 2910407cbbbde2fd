"""The ssh plugin's bundle for container tasks (services/launcher/backends/ssh_bundle.py):
made once from the node's OpenSSH with every library and the loader, its programs run
through wrappers at the mount point; bound only into tasks whose role runs the plugin.
(That it serves a busybox image: tests/integration/test_containers.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libs.common.protocol import ssh as protocol_ssh
from services.launcher.backends import ssh_bundle

HAVE_OPENSSH = os.access(protocol_ssh.SSHD, os.X_OK) and os.access(ssh_bundle.SSH_CLIENT, os.X_OK) \
    and bool(list(Path("/usr/lib").glob(f"*/{protocol_ssh.NSS_WRAPPER}")))


def test_a_task_without_the_plugins_port_gets_no_bundle(tmp_path: Path):
    bundles = ssh_bundle.Bundles(tmp_path)
    assert bundles.binds({"PAI_CONTAINER_HOST_PORT_LIST": "http:1;"}) == []
    assert list(tmp_path.iterdir()) == []  # nothing made for it


@pytest.mark.skipif(not HAVE_OPENSSH, reason="needs the node's openssh-server, openssh-client and libnss-wrapper")
def test_the_bundle_holds_the_programs_their_libraries_and_the_loader(tmp_path: Path):
    made = ssh_bundle.prepare(tmp_path)
    assert made is not None and ssh_bundle.prepare(tmp_path) == made  # once
    libs = {p.name for p in (made / "lib").iterdir()}
    assert {"libc.so.6", "libcrypto.so.3", protocol_ssh.NSS_WRAPPER} <= libs
    loader = next(name for name in libs if name.startswith("ld-linux"))
    wrapper = (made / "sbin" / "sshd").read_text()
    assert wrapper.startswith("#!/bin/sh\n")
    # Run by the bundle's loader, told its wrapper's path: sshd re-executes itself by it.
    assert f"exec /pai/ssh/lib/{loader} --library-path /pai/ssh/lib --preload /pai/ssh/lib/{protocol_ssh.NSS_WRAPPER} " \
           "--argv0 /pai/ssh/sbin/sshd /pai/ssh/libexec/sshd" in wrapper
    assert (made / "libexec" / "sshd").read_bytes() == Path(protocol_ssh.SSHD).read_bytes()
    assert all(p.stat().st_mode & 0o005 == 0o005 for p in (made / "sbin" / "sshd", made / "bin" / "ssh", made / "lib"))
    bundles = ssh_bundle.Bundles(tmp_path)
    assert bundles.binds({"PAI_CONTAINER_SSH_PORT": "20022"}) == [f"{made}:/pai/ssh:ro"]
    assert [p.name for p in tmp_path.iterdir()] == [made.name]  # no half-made directory left
