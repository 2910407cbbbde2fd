"""The secrets a Helm release of PAI needs, made once by the chart's pre-install hook.

A chart that makes random values at template time (`randAlphaNum`, kept with
`lookup`) renders differently every time it is rendered without a cluster to look
in: `helm template`, Argo CD and Flux's drift detection see every password change
at every render. So the chart renders no secret value at all: its pre-install and
pre-upgrade hook Job runs `python -m libs.common.release_secrets NAMESPACE SPEC...`,
which makes each Secret a spec names when it is missing and adds the keys it lacks,
never changing a value that is there (an upgrade keeps every password, a user added
to the bus gets its key). A Secret the operator made (the chart's `existingSecret`
values) is simply not named.

A spec is `SECRET/KEY=KIND`:
- `random`: 40 letters and digits (NATS users' secrets, from which each derives its
  nkey, busauth.user_seed; the route and database passwords: letters and digits
  alone go into URLs unescaped);
- `token:USER`: a platform token of PAI's format for USER (`USER.<random>`), the
  admin's: rest registers it at start (services/rest/auth.ensure_admin);
- `x25519:PUBKEY`: an X25519 private key (PEM) under KEY and its public half under
  PUBKEY, the key pair job secrets are sealed with (rest has the public half, the
  launcher the private one).

The Secrets are not part of the Helm release: `helm uninstall` leaves them, like the
volumes whose data they unlock (NATS's store, the database).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import string
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

RANDOM_LENGTH = 40
_ALPHABET = string.ascii_letters + string.digits
LABELS = {"app.kubernetes.io/part-of": "pai", "app.kubernetes.io/component": "release-secrets"}
MERGE_PATCH = "application/merge-patch+json"


class SpecError(ValueError):
    """A spec on the command line that is not `SECRET/KEY=KIND`."""


@dataclass(frozen=True)
class Want:
    secret: str
    key: str
    kind: str  # "random", "token", "x25519"
    arg: str = ""  # token: the user; x25519: the public key's name


def parse_spec(spec: str) -> Want:
    target, eq, kind = spec.partition("=")
    secret, slash, key = target.partition("/")
    if not (eq and slash and secret and key and kind):
        raise SpecError(f"{spec!r}: expected SECRET/KEY=KIND")
    name, _, arg = kind.partition(":")
    if name == "random" and not arg:
        return Want(secret, key, "random")
    if name in ("token", "x25519") and arg:
        return Want(secret, key, name, arg)
    raise SpecError(f"{spec!r}: KIND must be random, token:USER or x25519:PUBLIC_KEY_NAME")


def random_value() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(RANDOM_LENGTH))


def x25519_pair() -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = X25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return private, _public_pem(private)


def _public_pem(private_pem: str) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def missing_values(existing: Mapping[str, str], wants: list[Want], *,
                   make_random: Callable[[], str] = random_value,
                   make_pair: Callable[[], tuple[str, str]] = x25519_pair) -> dict[str, str]:
    """The keys of one Secret to add (decoded values): those `wants` names that
    `existing` lacks. Nothing there is ever replaced."""
    added: dict[str, str] = {}
    have = {**existing}
    for want in wants:
        if want.kind == "x25519":
            if want.key not in have:
                private, public = make_pair()
                added[want.key] = have[want.key] = private
                added[want.arg] = have[want.arg] = public
            elif want.arg not in have:  # the public half alone went missing: derived again
                added[want.arg] = have[want.arg] = _public_pem(have[want.key])
        elif want.key not in have:
            value = make_random() if want.kind == "random" else f"{want.arg}.{secrets.token_urlsafe(32)}"
            added[want.key] = have[want.key] = value
    return added


def by_secret(wants: list[Want]) -> dict[str, list[Want]]:
    out: dict[str, list[Want]] = {}
    for want in wants:
        out.setdefault(want.secret, []).append(want)
    return out


def _encode(values: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


def _decode(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}


async def ensure(api, namespace: str, wants: list[Want]) -> dict[str, list[str]]:
    """Make or complete every Secret `wants` names in `namespace` (a CoreV1Api);
    the keys added to each. Safe to run again, and twice at once: a create that
    loses to another's is read back and completed."""
    from kubernetes_asyncio.client.exceptions import ApiException

    report: dict[str, list[str]] = {}
    for name, its_wants in sorted(by_secret(wants).items()):
        for _ in range(5):
            try:
                found = await api.read_namespaced_secret(name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                found = None
            existing = _decode(found.data if found is not None else None)
            added = missing_values(existing, its_wants)
            if not added:
                report[name] = []
                break
            try:
                if found is None:
                    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                            "metadata": {"name": name, "namespace": namespace, "labels": LABELS},
                            "data": _encode(added)}
                    await api.create_namespaced_secret(namespace, body)
                else:
                    # resourceVersion: a concurrent writer's change is not overwritten.
                    patch = {"metadata": {"resourceVersion": found.metadata.resource_version},
                             "data": _encode(added)}
                    await api.patch_namespaced_secret(name, namespace, patch, _content_type=MERGE_PATCH)
            except ApiException as exc:
                if exc.status == 409:  # made or changed by another run meanwhile: read again
                    continue
                raise
            report[name] = sorted(added)
            break
        else:
            raise RuntimeError(f"Secret {namespace}/{name} kept changing under this run")
    return report


async def _main(namespace: str, wants: list[Want]) -> None:  # pragma: no cover - the hook Job
    from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
    from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config

    configuration = Configuration()
    try:
        load_incluster_config(client_configuration=configuration)
    except ConfigException:
        await load_kube_config(client_configuration=configuration)
    async with ApiClient(configuration) as client:
        report = await ensure(CoreV1Api(client), namespace, wants)
    for name, keys in report.items():
        print(f"Secret {namespace}/{name}: " + (f"added {', '.join(keys)}" if keys else "complete"))


def main(argv: list[str]) -> None:  # pragma: no cover - command line
    if len(argv) < 2:
        sys.exit("usage: python -m libs.common.release_secrets NAMESPACE SECRET/KEY=KIND...")
    try:
        wants = [parse_spec(spec) for spec in argv[1:]]
    except SpecError as exc:
        sys.exit(f"release_secrets: {exc}")
    asyncio.run(_main(argv[0], wants))


if __name__ == "__main__":  # pragma: no cover - command line
    main(sys.argv[1:])
