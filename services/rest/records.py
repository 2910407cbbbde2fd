"""What rest owns in KV: submitted jobs (pai_jobs) and identities (pai_users).

pai_users keys:
- `user.<name>` -> `User`
- `group.<name>` -> `Group`
- `token.<user>.<sha256 of the token>` -> `TokenRecord` (the token itself is never stored)
- `token.<sha256>` -> a user name: tokens made before tokens named their user (read, never written)
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from libs.common.protocol.model import JobSpec


class SubmittedJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job as accepted at intake (bucket pai_jobs, key user.name)."""

    job: str
    user: str
    name: str
    vc: str
    spec: JobSpec
    config: dict  # the submitted document, secrets masked
    warnings: list[str] = []
    submittedAt: float
    # True only in records written before intake stopped marking them (they were
    # marked once JobSubmitted was on the bus). Whether a record's event is out is
    # now known without a write (services/rest/intake.py); new records keep False.
    published: bool = False
    # Labels the owner or an admin put on the job (PUT/DELETE /api/v2/jobs/{job}/tag).
    tags: list[str] = []


class User(msgspec.Struct, frozen=True, kw_only=True):
    """A person (or a robot) who signs in. What they may do comes from their groups
    (OpenPAI's model): admin if one of them is an admin group, and the virtual
    clusters their groups list."""

    username: str
    email: str = ""
    grouplist: list[str] = msgspec.field(default_factory=lambda: ["default"])
    # argon2id hash (argon2-cffi's encoded form); empty: no password, tokens only.
    passwordHash: str = ""
    extension: dict = {}
    createdAt: float = 0.0
    # Kept from records written before groups: admin then was a flag on the user.
    admin: bool = False
    # The identity provider's `sub` of the directory account this user signs in as
    # (OIDC, services/rest/identity/oidc.py); empty: not a directory account.
    directorySubject: str = ""


class GroupAcls(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    admin: bool = False
    virtualClusters: list[str] = []
    storageConfigs: list[str] = []  # OpenPAI's; kept, not used
    # PAI's: the job priority classes (crit, prod, ...) its members may use beyond the open ones
    # (services/rest/identity/core.py: OPEN_PRIORITY_CLASSES).
    priorityClasses: list[str] = []


class GroupExtension(msgspec.Struct, frozen=True, kw_only=True):
    acls: GroupAcls = GroupAcls()


class Group(msgspec.Struct, frozen=True, kw_only=True):
    """OpenPAI's group: membership is kept on the users (`grouplist`)."""

    groupname: str
    description: str = ""
    externalName: str = ""
    extension: GroupExtension = GroupExtension()


class TokenKind(StrEnum):
    LOGIN = "login"  # from POST /api/v2/authn/basic/login; ends at logout or expiry
    APPLICATION = "application"  # from POST /api/v2/tokens or user creation, for scripts
    PLATFORM = "platform"  # the admin token `pai up` writes at first start; no expiry


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    user: str
    kind: TokenKind
    createdAt: float
    expiresAt: float | None = None  # None: until revoked
    description: str = ""


class NewUser(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /api/v2/users, read strictly: `"admin": "false"` is refused, not an admin."""

    username: str
    admin: bool = False
    email: str = ""
    password: str | None = None
    grouplist: list[str] | None = None  # default: the default group (and admin's, for an admin)
    extension: dict = {}


class UserChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of PUT /api/v2/users/{user} (admin): only the fields given change."""

    email: str | None = None
    admin: bool | None = None
    password: str | None = None
    grouplist: list[str] | None = None
    extension: dict | None = None


class SelfChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of PUT /api/v2/users/me: a user's own email and password."""

    email: str | None = None
    password: str | None = None
    oldPassword: str | None = None


class NewGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    groupname: str
    description: str = ""
    externalName: str = ""
    extension: GroupExtension = GroupExtension()


class GroupChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    description: str | None = None
    externalName: str | None = None
    extension: GroupExtension | None = None


class Login(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    username: str
    password: str
    # Seconds the token lives; default and cap from the configuration.
    expiration: int | None = None


class NewToken(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    expiration: int | None = None  # seconds; default from the configuration
    description: str = ""
