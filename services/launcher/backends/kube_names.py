"""Names PAI gives to Kubernetes objects: Pod names, label keys and values.

Kubernetes restricts both:
- a Pod name here is a DNS label: lowercase `[a-z0-9-]`, at most 63 characters,
  starting and ending with a letter or digit;
- a label value is at most 63 characters of `[A-Za-z0-9._-]`, starting and
  ending with a letter or digit (or empty).

PAI's names are looser (user and job names may hold `_`, upper case, start
with `-`, and a task slug is longer than 63 characters for long job names), so
a name is made safe by replacing and cutting, and a short hash of the original
keeps two different originals from becoming the same safe name.

Labels are for people and selectors (`kubectl get pods -l pai/job=alice.mnist`);
the exact key of a task is recovered from the Pod's annotation, never from
these cut-down forms.
"""

from __future__ import annotations

import hashlib
import re

from services.launcher.core.tasks import TaskKey

DNS_LABEL_MAX = 63
LABEL_VALUE_MAX = 63
HASH_CHARS = 8

# Every Pod PAI creates carries this label; watches and lists select on it.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "pai-launcher"
POD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"

JOB_LABEL = "pai/job"
USER_LABEL = "pai/user"
VC_LABEL = "pai/vc"
ROLE_LABEL = "pai/role"
INDEX_LABEL = "pai/index"
ATTEMPT_LABEL = "pai/attempt"
TASK_ATTEMPT_LABEL = "pai/task-attempt"

_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def dns_label(text: str, *, fallback: str = "pai") -> str:
    """`text` as a DNS label; the same text always gives the same label.

    A text that is already a valid label is kept as it is; any other gets a
    hash suffix, so `Alice` and `alice` stay apart.
    """
    if len(text) <= DNS_LABEL_MAX and _DNS_LABEL.match(text):
        return text
    return _with_hash(_NOT_DNS.sub("-", text.lower()), text, fallback)


def pod_name(key: TaskKey) -> str:
    """The Pod of one task attempt: the slug made DNS-safe, plus a hash of the slug.

    The hash is always there (not only when the slug had to change), so two
    keys whose slugs only differ in case or punctuation never share a Pod.
    """
    return _with_hash(_NOT_DNS.sub("-", key.slug.lower()), key.slug, "pai")


def label_value(text: str) -> str:
    """`text` as a label value: kept when valid, else made valid with a hash suffix."""
    if len(text) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(text):
        return text
    safe = _NOT_LABEL.sub("-", text)
    room = LABEL_VALUE_MAX - HASH_CHARS - 1
    trimmed = safe[:room].strip("-_.")
    return f"{trimmed}-{short_hash(text)}" if trimmed else short_hash(text)


def job_label(job: str) -> str:
    """The job id `user~name` as `user.name`: `~` is not allowed in a label value,
    and neither part may hold a dot, so the form stays readable and unambiguous."""
    user, _, name = job.partition("~")
    return label_value(f"{user}.{name}")


def task_labels(key: TaskKey, *, user: str, vc: str) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        JOB_LABEL: job_label(key.job),
        USER_LABEL: label_value(user),
        VC_LABEL: label_value(vc),
        ROLE_LABEL: label_value(key.role),
        INDEX_LABEL: str(key.index),
        ATTEMPT_LABEL: str(key.attempt),
        TASK_ATTEMPT_LABEL: str(key.taskAttempt),
    }


def is_dns_label(text: str) -> bool:
    return len(text) <= DNS_LABEL_MAX and bool(_DNS_LABEL.match(text))


def is_label_value(text: str) -> bool:
    return len(text) <= LABEL_VALUE_MAX and bool(_LABEL_VALUE.match(text))


def _with_hash(safe: str, original: str, fallback: str) -> str:
    room = DNS_LABEL_MAX - HASH_CHARS - 1
    trimmed = re.sub(r"-{2,}", "-", safe)[:room].strip("-") or fallback
    return f"{trimmed}-{short_hash(original)}"
