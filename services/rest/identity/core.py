"""Identity decisions, pure: who a caller is, what they may do, which passwords,
names and token lifetimes are acceptable. No I/O; the clock is passed in.

OpenPAI's model: a user belongs to groups; a group's `extension.acls` says whether
its members are admins and which virtual clusters they may submit to. The built-in
`default` group grants the `default` VC, the built-in `admin` group admin rights.

Priority classes (PAI's addition, `extension.acls.priorityClasses`): everyone may use
the open classes (`test`, the default, and `oppo`, which only borrows idle cells and is
preempted first); `prod` and `crit` preempt other jobs of their VC, so only members of a
group that lists them (and admins) may submit with them.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from libs.common.errors import BadInput, Forbidden, ForbiddenKey
from libs.common.ids import NAME_PATTERN
from libs.common.protocol.limits import MAX_EMAIL_LENGTH, MAX_USERNAME_LENGTH
from libs.common.protocol.model import PRIORITY_CLASSES
from services.rest import notify_default
from services.rest.records import Group, GroupAcls, GroupExtension, TokenKind, TokenRecord, User

ADMIN_GROUP = "admin"
DEFAULT_GROUP = "default"
DEFAULT_VC = "default"
BUILTIN_GROUPS: dict[str, Group] = {
    ADMIN_GROUP: Group(groupname=ADMIN_GROUP, description="PAI's administrators",
                       extension=GroupExtension(acls=GroupAcls(admin=True))),
    DEFAULT_GROUP: Group(groupname=DEFAULT_GROUP, description="every user: the default virtual cluster",
                         extension=GroupExtension(acls=GroupAcls(virtualClusters=[DEFAULT_VC]))),
}
# Path words that cannot be names: `/api/v2/users/me` is the caller.
RESERVED_NAMES = frozenset({"me"})
MAX_GROUP_NAME_LENGTH = 64
MAX_GROUPS_PER_USER = 64
MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 256  # argon2 hashes anything, but a megabyte password is an attack
# Classes no group needs to grant: they preempt nobody's guaranteed work (see the module's docstring).
OPEN_PRIORITY_CLASSES = ("test", "oppo")


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """The caller of one request, resolved from their token, user record and groups."""

    username: str
    admin: bool
    virtualClusters: tuple[str, ...]  # every VC their groups grant (admins: all, listed or not)
    grouplist: tuple[str, ...]
    email: str = ""
    tokenKey: str = ""  # the KV key of the token used (logout revokes it)
    hasPassword: bool = False
    # The priority classes they may submit with (admins: all); a default for principals cached before.
    priorityClasses: tuple[str, ...] = OPEN_PRIORITY_CLASSES
    # Their default for job status mail (services/rest/notify_default.py); () for none.
    notifyStates: tuple[str, ...] = ()


def resolve(user: User, groups: dict[str, Group], *, token_key: str = "") -> Principal:
    """`user` with what their groups grant; a group that no longer exists grants nothing.
    A built-in group not (yet) stored grants what it is made with."""
    known = {**BUILTIN_GROUPS, **groups}
    mine = [known[name] for name in user.grouplist if name in known]
    admin = user.admin or any(group.extension.acls.admin for group in mine)
    vcs = sorted({vc for group in mine for vc in group.extension.acls.virtualClusters})
    granted = {*OPEN_PRIORITY_CLASSES, *(c for group in mine for c in group.extension.acls.priorityClasses)}
    classes = tuple(c for c in PRIORITY_CLASSES if admin or c in granted)  # highest first
    return Principal(username=user.username, admin=admin, virtualClusters=tuple(vcs),
                     grouplist=tuple(user.grouplist), email=user.email, tokenKey=token_key,
                     hasPassword=bool(user.passwordHash), priorityClasses=classes,
                     notifyStates=notify_default.wanted_states(user.extension))


def may_submit_to(caller: Principal, vc: str) -> bool:
    return caller.admin or vc in caller.virtualClusters


def may_use_priority_class(caller: Principal, priority_class: str) -> bool:
    return caller.admin or priority_class in caller.priorityClasses


def priority_class_refused(caller: Principal, priority_class: str, groups: list[Group]) -> Forbidden:
    """The refusal of a submission with a class the caller was not granted: which groups grant it, what to do."""
    granting = sorted(g.groupname for g in groups if priority_class in g.extension.acls.priorityClasses)
    where = (f"groups that grant it: {', '.join(granting)}; ask an admin to add you to one of them"
             if granting else f"no group grants it yet; an admin grants it with "
                              f"`pai groups set <group> --priority-classes {priority_class}`")
    path = "extras.hivedScheduler.jobPriorityClass"
    message = (f"user {caller.username} may not use priority class {priority_class!r} ({path}): their groups "
               f"({', '.join(caller.grouplist) or 'none'}) grant {', '.join(caller.priorityClasses)}; {where}, "
               f"or submit with one of {', '.join(caller.priorityClasses)}")
    return Forbidden(message, details={"errors": [{"path": path, "rule": "priority_class_not_granted",
                                                   "message": message, "grantedBy": granting}]})


def check_group_acls(acls: GroupAcls, path: str = "extension.acls") -> None:
    for i, name in enumerate(acls.priorityClasses):
        if name not in PRIORITY_CLASSES:
            raise bad_field(f"{path}.priorityClasses[{i}]", "enum",
                            f"{name[:32]!r} is not a priority class; one of {', '.join(PRIORITY_CLASSES)}")


# --- who may do what ----------------------------------------------------------------------


class Action(StrEnum):
    """What a caller asks to do; `may` decides it for one target user (or job owner)."""

    LIST_JOBS = "list jobs"
    READ_JOB = "read the status of"
    READ_JOB_OUTPUT = "read the config, attempts or logs of"  # may show what its secrets printed
    CHANGE_JOB = "stop or tag"
    WATCH_EVENTS = "watch the events of"
    READ_USER = "read the user"
    CHANGE_OWN_PROFILE = "change the email or password of"
    MANAGE_USERS = "create, change or delete users"
    READ_GROUPS = "read groups"
    MANAGE_GROUPS = "create, change or delete groups"
    MANAGE_OWN_TOKENS = "list, create or revoke the tokens of"
    MANAGE_STORAGES = "declare, change or delete storages"


# Who may, besides admins (who may do everything): everyone signed in, or the target alone.
_EVERYONE = frozenset({Action.LIST_JOBS, Action.READ_JOB, Action.READ_GROUPS})
_SELF = frozenset({Action.READ_JOB_OUTPUT, Action.CHANGE_JOB, Action.WATCH_EVENTS, Action.READ_USER,
                   Action.CHANGE_OWN_PROFILE, Action.MANAGE_OWN_TOKENS})


def may(caller: Principal, action: Action, owner: str | None = None) -> bool:
    if caller.admin or action in _EVERYONE:
        return True
    return action in _SELF and owner == caller.username


def require(caller: Principal, action: Action, owner: str | None = None, *, what: str = "") -> None:
    if not may(caller, action, owner):
        target = what or owner or ""
        who = f"only {owner} or an admin" if action in _SELF and owner else "only an admin"
        raise Forbidden(f"{who} may {action.value}{' ' + target if target else ''}; "
                        f"{caller.username} is not allowed")


# --- names, emails, passwords ---------------------------------------------------------------


def bad_field(path: str, rule: str, message: str) -> BadInput:
    return BadInput(f"{path}: {message}", details={"errors": [{"path": path, "rule": rule, "message": message}]})


def check_username(name: str, path: str = "username") -> None:
    # The name becomes a KV key and part of every job id: bounded before NATS sees it.
    if len(name) > MAX_USERNAME_LENGTH:
        raise bad_field(path, "maxLength", f"a username is at most {MAX_USERNAME_LENGTH} characters, got {len(name)}")
    if not NAME_PATTERN.match(name):
        raise bad_field(path, "pattern", "a username must match ^[a-zA-Z0-9_-]+$ (letters, digits, _ and -)")
    if name in RESERVED_NAMES:
        raise bad_field(path, "reserved", f"{name!r} is a reserved word in the API's paths")


def check_groupname(name: str, path: str = "groupname") -> None:
    if len(name) > MAX_GROUP_NAME_LENGTH:
        raise bad_field(path, "maxLength", f"a group name is at most {MAX_GROUP_NAME_LENGTH} characters, got {len(name)}")
    if not NAME_PATTERN.match(name):
        raise bad_field(path, "pattern", "a group name must match ^[a-zA-Z0-9_-]+$ (letters, digits, _ and -)")


def check_grouplist(names: list[str], path: str = "grouplist") -> None:
    if len(names) > MAX_GROUPS_PER_USER:
        raise bad_field(path, "maxItems", f"a user is in at most {MAX_GROUPS_PER_USER} groups, got {len(names)}")
    for i, name in enumerate(names):
        check_groupname(name, f"{path}[{i}]")


def check_email(email: str, path: str = "email") -> None:
    if len(email) > MAX_EMAIL_LENGTH:
        raise bad_field(path, "maxLength", f"an email address is at most {MAX_EMAIL_LENGTH} characters")
    if email and ("@" not in email or any(c.isspace() for c in email)):
        raise bad_field(path, "format", "an email address looks like name@example.com")


def password_problem(password: str, username: str) -> str | None:
    """Why `password` is not acceptable for `username`, or None."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"a password has at least {MIN_PASSWORD_LENGTH} characters, got {len(password)}"
    if len(password) > MAX_PASSWORD_LENGTH:
        return f"a password has at most {MAX_PASSWORD_LENGTH} characters, got {len(password)}"
    if password.lower() == username.lower():
        return "a password must not be the username"
    if len(set(password)) < 3:
        return "a password needs at least 3 different characters"
    return None


def check_password(password: str, username: str, path: str = "password") -> None:
    problem = password_problem(password, username)
    if problem is not None:
        raise bad_field(path, "passwordPolicy", problem)


# --- changes an admin may not make -------------------------------------------------------------


def check_user_change(caller: Principal, target: str, *, new_admin: bool | None, deleting: bool = False) -> None:
    """An admin cannot lock themselves out: not delete themselves, not drop their own admin rights."""
    if caller.username != target:
        return
    if deleting:
        raise ForbiddenKey(f"{target} cannot delete themselves; another admin can")
    if new_admin is False:
        raise ForbiddenKey(f"{target} cannot take away their own admin rights; another admin can")


def grouplist_with_admin(grouplist: list[str], admin: bool) -> list[str]:
    """OpenPAI's `admin` flag of a user is membership of the admin group."""
    others = [g for g in grouplist if g != ADMIN_GROUP]
    return [*others, ADMIN_GROUP] if admin else others


def check_group_change(name: str, *, deleting: bool = False, acls: GroupAcls | None = None) -> None:
    if name not in BUILTIN_GROUPS:
        return
    if deleting:
        raise ForbiddenKey(f"the group {name} is built in and cannot be deleted")
    if name == ADMIN_GROUP and acls is not None and not acls.admin:
        raise ForbiddenKey("the admin group keeps extension.acls.admin: true")


# --- tokens ---------------------------------------------------------------------------------------


class TokenPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Token lifetimes, in seconds (from the configuration)."""

    login_seconds: float = 7 * 86400.0
    application_seconds: float = 90 * 86400.0
    max_seconds: float = 366 * 86400.0


def token_expiry(kind: TokenKind, now: float, policy: TokenPolicy, requested: int | None = None) -> float | None:
    """When a new token of `kind` stops working: the request (bounded), else the default."""
    if kind == TokenKind.PLATFORM:
        return None
    if requested is not None:
        if requested <= 0:
            raise bad_field("expiration", "minimum", f"expiration is a number of seconds > 0, got {requested}")
        if requested > policy.max_seconds:
            raise bad_field("expiration", "maximum",
                            f"a token lives at most {policy.max_seconds:.0f} seconds, asked {requested}")
        return now + requested
    return now + (policy.login_seconds if kind == TokenKind.LOGIN else policy.application_seconds)


def is_live(token: TokenRecord, now: float) -> bool:
    return token.expiresAt is None or now < token.expiresAt


# --- failed sign-ins -----------------------------------------------------------------------------


class LoginThrottle:
    """Failed sign-ins per user name, to slow password guessing: after `max_failures`
    within `window` seconds, the name is refused until the window has passed, before
    any password is checked (so a flood costs no argon2 work either). Per rest
    process, like the request rate limit; times are passed in (`now`)."""

    def __init__(self, *, max_failures: int = 10, window: float = 300.0, max_names: int = 10_000):
        self.max_failures = max_failures
        self.window = window
        self.max_names = max_names
        self._failures: dict[str, list[float]] = {}

    def _recent(self, name: str, now: float) -> list[float]:
        recent = [t for t in self._failures.get(name, []) if now - t < self.window]
        if recent:
            self._failures[name] = recent
        else:
            self._failures.pop(name, None)
        return recent

    def retry_after(self, name: str, now: float) -> float:
        """0 when `name` may try now, else the seconds until it may."""
        recent = self._recent(name, now)
        if len(recent) < self.max_failures:
            return 0.0
        return recent[-self.max_failures] + self.window - now

    def failed(self, name: str, now: float) -> None:
        if name not in self._failures and len(self._failures) >= self.max_names:
            oldest = min(self._failures, key=lambda n: self._failures[n][-1])
            del self._failures[oldest]
        self._failures.setdefault(name, []).append(now)

    def succeeded(self, name: str) -> None:
        self._failures.pop(name, None)

