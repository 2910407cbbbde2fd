"""The Helm chart's NATS features against a real nats-server:

- TLS: a server that requires TLS of its clients (the chart's nats.tls), PAI's bus
  connecting over tls:// and checking the server against the chart's CA file
  (nats_tls_ca_file); a CA that did not sign the server's certificate is refused;
- the config reloader (`busauth nats-reload`, the NATS pod's sidecar): a user's key
  rotated in the mounted Secret reaches the running server, which reloads it on
  SIGHUP: the new key logs in, the old one is refused, the server never restarted.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import secrets
import ssl
import subprocess
from pathlib import Path

import nats.errors
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from libs.common import busauth
from libs.common.bus import Bus
from libs.common.busauth import TlsFiles, load_or_create_credentials
from libs.common.natsserver import NatsServer, binary, free_port, wait_for_port

pytestmark = pytest.mark.timeout(60)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(folder: Path, name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (folder / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def make_server_cert(folder: Path, ca_key, ca_cert) -> tuple[Path, Path]:
    """A server certificate for localhost, as cert-manager would issue the chart's."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    crt, pem = folder / "tls.crt", folder / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


async def test_the_bus_speaks_tls_to_a_server_that_requires_it_and_checks_its_ca(tmp_path: Path) -> None:
    ca_key, ca_cert = make_ca(tmp_path, "ca")
    make_ca(tmp_path, "other-ca")
    crt, key = make_server_cert(tmp_path, ca_key, ca_cert)
    auth = load_or_create_credentials(tmp_path / "credentials.json")
    tls = TlsFiles(cert_file=str(crt), key_file=str(key), ca_file=str(tmp_path / "ca.crt"))
    with NatsServer(tmp_path / "store", host="127.0.0.1", auth=auth, tls=tls) as server:
        url = f"tls://localhost:{server.port}"
        bus = await Bus.connect(url, name="tls-platform", tls_ca_file=str(tmp_path / "ca.crt"),
                                **auth.login(busauth.PLATFORM))
        try:
            await bus.bootstrap()  # JetStream's API over the TLS connection
            info = await bus.js.account_info()
            assert info.streams >= 1
            assert bus.nc.connected_url is not None and bus.nc.connected_url.scheme == "tls"
        finally:
            await bus.close()
        # A CA that did not sign the server's certificate: no connection (nats-py keeps
        # retrying the handshake, each refused with CERTIFICATE_VERIFY_FAILED).
        with pytest.raises((TimeoutError, OSError, ssl.SSLError, nats.errors.Error)):
            await asyncio.wait_for(Bus.connect(url, name="tls-wrong-ca", tls_ca_file=str(tmp_path / "other-ca.crt"),
                                               connect_timeout=3, **auth.login(busauth.PLATFORM)), 8)


async def test_a_rotated_key_reaches_the_running_server_through_the_reloader(tmp_path: Path) -> None:
    keys = tmp_path / "pai-bus-keys"  # the mounted credentials Secret: one file per user
    keys.mkdir()
    for user in busauth.ACCESS:
        (keys / user).write_text(secrets.token_hex(20))
    port = free_port()
    base = tmp_path / "nats-base.conf"  # the chart's ConfigMap, reduced to one server
    pid_file = tmp_path / "nats.pid"
    base.write_text(f"port: {port}\nhost: 127.0.0.1\npid_file: {pid_file}\n"
                    f"jetstream {{\n  store_dir: {tmp_path / 'js'}\n}}\n")
    conf = tmp_path / "nats.conf"
    busauth.write_chart_server_config(base, keys, conf)  # the init container
    server = subprocess.Popen([binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port)
        url = f"nats://127.0.0.1:{port}"
        old = (keys / "rest").read_text()
        bus = await Bus.connect(url, name="before", user="rest", nkey_seed=old, connect_timeout=5)
        await bus.close()
        (keys / "rest").write_text(secrets.token_hex(20))  # the operator rotates rest's key
        # One round of the sidecar's loop: the configuration made again, written, SIGHUP.
        await asyncio.to_thread(busauth.reload_when_changed, base, keys, conf, pid_file,
                                sleep=lambda _: None, rounds=1)
        assert busauth.public_key((keys / "rest").read_text()) in conf.read_text()
        new = (keys / "rest").read_text()
        for _ in range(50):  # the server reloads in the background
            try:
                bus = await Bus.connect(url, name="after", user="rest", nkey_seed=new, connect_timeout=1)
                await bus.close()
                break
            except PermissionError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the rotated key was never accepted")
        with pytest.raises(PermissionError):
            await Bus.connect(url, name="old", user="rest", nkey_seed=old, connect_timeout=2)
        assert server.poll() is None and int(pid_file.read_text()) == server.pid  # reloaded, not restarted
        # A configuration that cannot be made (a key file gone) is not written: the server keeps its own.
        before = conf.read_text()
        os.remove(keys / "runtime")
        await asyncio.to_thread(busauth.reload_when_changed, base, keys, conf, pid_file,
                                sleep=lambda _: None, rounds=1)
        assert conf.read_text() == before
    finally:
        server.terminate()
        server.wait(10)
