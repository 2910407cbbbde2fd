"""Sending mail over SMTP (aiosmtplib): the I/O shell of notifications.

A failure is retried with a growing pause and logged; after the last attempt
the mail is given up (logged, counted), never raised: a mail server that is
away must not stop the monitor. A refusal that would repeat (wrong login,
refused sender or recipients) is given up at once.
"""

from __future__ import annotations

import asyncio
import logging
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib
import msgspec

from libs.common.config import Config

log = logging.getLogger("pai.monitor.mail")

ATTEMPTS = 5
FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 60.0
TIMEOUT_SECONDS = 30.0
# Refusals a retry would meet again: a wrong login, a refused sender or recipients.
PERMANENT = (aiosmtplib.SMTPAuthenticationError, aiosmtplib.SMTPSenderRefused, aiosmtplib.SMTPRecipientsRefused)


class MailSettings(msgspec.Struct, frozen=True, kw_only=True):
    host: str
    port: int = 25
    starttls: bool = False
    ca_file: str = ""
    user: str = ""
    password: str = ""
    sender: str = "pai@localhost"
    admins: tuple[str, ...] = ()
    portal_url: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.host)

    @classmethod
    def from_config(cls, config: Config) -> MailSettings:
        password = ""
        if config.smtp_password_file:
            try:
                password = Path(config.smtp_password_file).read_text().strip()
            except OSError as error:
                log.error("cannot read smtp_password_file %s: %s; sending without login",
                          config.smtp_password_file, error)
        return cls(
            host=config.smtp_host, port=config.smtp_port, starttls=config.smtp_starttls, ca_file=config.smtp_ca_file,
            user=config.smtp_user if password else "", password=password, sender=config.mail_from,
            admins=tuple(a.strip() for a in config.admin_emails.split(",") if a.strip()),
            portal_url=config.portal_url or f"http://{config.host}:{config.rest_port}",
        )


class Mailer:
    def __init__(self, settings: MailSettings, *, first_pause: float = FIRST_PAUSE_SECONDS):
        self.settings = settings
        self.first_pause = first_pause
        self.sent = 0
        self.failed = 0

    async def send(self, message: EmailMessage) -> bool:
        """True once the server accepted the mail; False when it was given up."""
        s = self.settings
        if not s.enabled:
            log.info("no smtp_host: not mailing %r", message["Subject"])
            return False
        pause = self.first_pause
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await aiosmtplib.send(
                    message, hostname=s.host, port=s.port, start_tls=s.starttls, cert_bundle=s.ca_file or None,
                    username=s.user or None, password=s.password or None, timeout=TIMEOUT_SECONDS,
                )
                self.sent += 1
                log.info("mailed %r to %s", message["Subject"], message["To"])
                return True
            except PERMANENT as error:  # the same mail would be refused the same way again
                self.failed += 1
                log.error("mail %r to %s refused: %r; not retried", message["Subject"], message["To"], error)
                return False
            except (TimeoutError, aiosmtplib.SMTPException, OSError) as error:
                if attempt == ATTEMPTS:
                    self.failed += 1
                    log.error("gave up mailing %r to %s after %d attempts: %r",
                              message["Subject"], message["To"], ATTEMPTS, error)
                    return False
                log.warning("mailing %r failed (attempt %d/%d): %r; retrying in %.0f s",
                            message["Subject"], attempt, ATTEMPTS, error, pause)
                await asyncio.sleep(pause)
                pause = min(MAX_PAUSE_SECONDS, pause * 2)
        return False
