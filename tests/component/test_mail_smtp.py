"""Alert and job mail through a real SMTP server (aiosmtpd), as admins and owners get it."""

from __future__ import annotations

import asyncio
import email
from email.message import Message

import pytest
from aiosmtpd.controller import Controller

from libs.common.ids import EventId, JobId, UserName, VcName
from libs.common.messages import ExitSpec, JobState, JobStateChanged, JobSubmitted
from libs.common.natsserver import free_port
from libs.common.protocol.model import JobSpec
from services.monitor.alerts.compose import compose
from services.monitor.alerts.core import AlertCore, NodeReading, Notification
from services.monitor.alerts.mailer import Mailer, MailSettings
from services.monitor.alerts.rules import load_rules_text

T0 = 1_700_000_000.0


class Inbox:
    """What the SMTP server received: envelope recipients and parsed messages."""

    def __init__(self):
        self.mails: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.mails.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"


def body_of(message: Message, subtype: str) -> str:
    for part in message.walk():
        if part.get_content_type() == f"text/{subtype}":
            return part.get_payload(decode=True).decode()
    raise AssertionError(f"no text/{subtype} part")


@pytest.fixture
def smtp():
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller, inbox
    finally:
        controller.stop()


def settings(controller: Controller) -> MailSettings:
    return MailSettings(host=controller.hostname, port=controller.port, sender="pai@cluster.example",
                        admins=("ops@example.com",), portal_url="https://pai.example")


async def test_a_failed_jobs_owner_gets_mail_naming_job_cause_solution_and_link(smtp):
    controller, inbox = smtp
    core = AlertCore(load_rules_text("rules: [{name: JobFailed, when: job_failed, window: 1h}]"))
    spec = JobSpec(name="resnet", user="alice", virtualCluster="vc1", notifyOnStateChange=True)
    core.handle(JobSubmitted(id=EventId("s"), job=JobId("alice~resnet"), at=T0, spec=spec))
    exit_spec = ExitSpec(code=137, phrase="ContainerOOMKilled", reason="the task ran out of memory",
                         solution=["raise memoryMB of the task role"])
    [notification] = core.handle(JobStateChanged(
        id=EventId("f"), job=JobId("alice~resnet"), at=T0 + 5, vc=VcName("vc1"), user=UserName("alice"), attempt=1,
        state=JobState.FAILED, exitCode=137, exitSpec=exit_spec))
    mailer = Mailer(settings(controller))
    sent = await mailer.send(compose(notification, sender="pai@cluster.example", to=["alice@example.com"],
                                     portal_url="https://pai.example"))
    assert sent
    [(recipients, message)] = inbox.mails
    assert recipients == ["alice@example.com"]
    assert message["Subject"] == "[PAI] job alice~resnet failed: ContainerOOMKilled"
    text = body_of(message, "plain")
    for words in ("alice~resnet", "the task ran out of memory", "raise memoryMB of the task role",
                  "https://pai.example/api/v2/jobs/alice~resnet", "exit code: 137"):
        assert words in text
    assert '<a href="https://pai.example/api/v2/jobs/alice~resnet">' in body_of(message, "html")


async def test_admins_get_an_alert_then_nothing_before_the_repeat_interval_then_a_resolve_notice(smtp):
    controller, inbox = smtp
    core = AlertCore(load_rules_text(
        "rules: [{name: NodeFilesystemUsage, when: node_disk_usage, threshold: 90, repeatInterval: 1h,"
        " actions: [email-admin], summary: 'disk of {node} is {value}% full'}]"))
    mailer = Mailer(settings(controller))

    async def round_at(t: float, disk: float) -> None:
        core.node_sampled(NodeReading(node="gpu-07", at=t, diskPercent=disk))
        for out in core.evaluate(t):
            if isinstance(out, Notification):
                assert await mailer.send(compose(out, sender="pai@cluster.example", to=["ops@example.com"],
                                                 portal_url="https://pai.example"))

    await round_at(T0, 97.0)
    await round_at(T0 + 600, 97.0)
    await round_at(T0 + 1800, 97.0)
    assert len(inbox.mails) == 1, "mailed again before the repeat interval"
    recipients, firing = inbox.mails[0]
    assert recipients == ["ops@example.com"]
    assert firing["Subject"] == "[PAI] [FIRING:1] NodeFilesystemUsage (warning) gpu-07"
    assert "disk of gpu-07 is 97.0% full" in body_of(firing, "plain")
    await round_at(T0 + 3600, 97.0)
    assert inbox.mails[-1][1]["Subject"].endswith("(reminder)")
    await round_at(T0 + 3700, 40.0)
    assert len(inbox.mails) == 3
    resolved = inbox.mails[-1][1]
    assert resolved["Subject"] == "[PAI] [RESOLVED] NodeFilesystemUsage (warning) gpu-07"
    assert "Resolved:" in body_of(resolved, "plain")


async def test_a_mail_server_that_is_away_is_retried_and_never_raises():
    port = free_port()
    inbox = Inbox()
    mailer = Mailer(MailSettings(host="127.0.0.1", port=port), first_pause=0.2)
    core = AlertCore(load_rules_text("rules: [{name: Mem, when: node_memory_usage, threshold: 90, actions: [email-admin]}]"))
    core.node_sampled(NodeReading(node="n1", at=T0, memoryPercent=99))
    [notification] = [o for o in core.evaluate(T0) if isinstance(o, Notification)]
    message = compose(notification, sender="pai@localhost", to=["ops@example.com"], portal_url="http://pai")

    sending = asyncio.create_task(mailer.send(message))
    await asyncio.sleep(0.5)  # the first attempts find no server
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        assert await asyncio.wait_for(sending, timeout=30)
    finally:
        controller.stop()
    assert len(inbox.mails) == 1

    gone = Mailer(MailSettings(host="127.0.0.1", port=free_port()), first_pause=0.01)
    assert await gone.send(message) is False
    assert gone.failed == 1


async def test_the_mailer_logs_in_with_the_password_from_the_secret_file(tmp_path):
    from aiosmtpd.smtp import AuthResult, LoginPassword

    from libs.common.config import load_config

    logins: list[tuple[str, str]] = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        if isinstance(auth_data, LoginPassword):
            login, password = (x.decode() if isinstance(x, bytes) else x for x in (auth_data.login, auth_data.password))
            logins.append((login, password))
            return AuthResult(success=password == "s3cret-from-secret", handled=False)
        return AuthResult(success=False, handled=False)

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), authenticator=authenticator,
                            auth_required=True, auth_require_tls=False)
    controller.start()
    try:
        secret = tmp_path / "smtp-password"
        secret.write_text("s3cret-from-secret\n")
        config = load_config(env={}, smtp_host="127.0.0.1", smtp_port=controller.port, smtp_user="pai-mailer",
                             smtp_password_file=str(secret), admin_emails="a@example.com, b@example.com")
        settings = MailSettings.from_config(config)
        assert settings.admins == ("a@example.com", "b@example.com")
        core = AlertCore(load_rules_text("rules: [{name: Mem, when: node_memory_usage, threshold: 90, actions: [email-admin]}]"))
        core.node_sampled(NodeReading(node="n1", at=T0, memoryPercent=99))
        [notification] = [o for o in core.evaluate(T0) if isinstance(o, Notification)]
        message = compose(notification, sender="pai@localhost", to=list(settings.admins), portal_url="http://pai")
        assert await Mailer(settings, first_pause=0.01).send(message)
        assert logins == [("pai-mailer", "s3cret-from-secret")]
        assert inbox.mails[0][0] == ["a@example.com", "b@example.com"]

        secret.write_text("wrong")
        refused = Mailer(MailSettings.from_config(config), first_pause=0.01)  # reads the file again
        assert await refused.send(message) is False, "a refused login is given up, not raised"
        wrong = [login for login in logins if login[1] == "wrong"]
        # One attempt tries each mechanism the server offers (PLAIN, then LOGIN); five would be ten.
        assert 1 <= len(wrong) <= 2, f"a refused login is not retried: {len(wrong)} logins"
    finally:
        controller.stop()


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, as files (the certificate is its own CA)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pai-test-smtp")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "smtp.crt", tmp_path / "smtp.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


async def test_starttls_upgrades_the_connection_and_checks_the_servers_certificate(tmp_path):
    import ssl

    cert_file, key_file = self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert_file, key_file)
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), tls_context=server_tls, require_starttls=True)
    controller.start()
    try:
        core = AlertCore(load_rules_text("rules: [{name: Mem, when: node_memory_usage, threshold: 90, actions: [email-admin]}]"))
        core.node_sampled(NodeReading(node="n1", at=T0, memoryPercent=99))
        [notification] = [o for o in core.evaluate(T0) if isinstance(o, Notification)]
        message = compose(notification, sender="pai@localhost", to=["ops@example.com"], portal_url="http://pai")

        plain = Mailer(MailSettings(host="127.0.0.1", port=controller.port), first_pause=0.01)
        assert await plain.send(message) is False, "the server requires STARTTLS"
        untrusted = Mailer(MailSettings(host="127.0.0.1", port=controller.port, starttls=True), first_pause=0.01)
        assert await untrusted.send(message) is False, "a certificate no configured CA signed is refused"
        assert not inbox.mails
        trusted = Mailer(MailSettings(host="127.0.0.1", port=controller.port, starttls=True, ca_file=cert_file))
        assert await trusted.send(message)
        assert [rcpt for rcpt, _ in inbox.mails] == [["ops@example.com"]]
    finally:
        controller.stop()
