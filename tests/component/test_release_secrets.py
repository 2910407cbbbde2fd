"""The chart's release-secrets hook (libs/common/release_secrets.py) against a Kubernetes
API emulator over real HTTP: it makes the Secrets the chart names, completes one that
lacks keys, and never changes a value that is there (an upgrade keeps every password).

The specs come from the chart itself (`helm template`), so what is tested is what the
hook Job runs."""

from __future__ import annotations

import asyncio
import base64

import kmock
import pytest
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from libs.common import busauth
from libs.common.release_secrets import SpecError, Want, ensure, missing_values, parse_spec
from tests.component.kube_emulator import PodApiEmulator

pytestmark = pytest.mark.timeout(30)
NS = "pai"


@pytest.fixture
async def api():
    emulator = PodApiEmulator()
    async with emulator, kmock.Server(emulator) as server:
        configuration = Configuration()
        configuration.host = str(server.url).rstrip("/")
        async with ApiClient(configuration) as client:
            yield CoreV1Api(client), emulator


def stored(emulator: PodApiEmulator, name: str) -> dict[str, str]:
    for (resource, namespace, found), obj in emulator.objects.items():
        if resource.plural == "secrets" and namespace == NS and found == name and not obj.deleted:
            return {k: base64.b64decode(v).decode() for k, v in obj.raw.get("data", {}).items()}
    raise AssertionError(f"no Secret {name}")


def chart_specs() -> list[str]:
    """The specs of the chart's hook Job, as `helm template` renders them."""
    from tests.tools_helm import ToolsUnavailable, kube_tools
    from tests.unit.test_deploy import container, find, render

    try:
        tools = kube_tools()
    except ToolsUnavailable as exc:
        pytest.skip(f"helm not available: {exc}")
    (job,) = [j for j in find(render(tools), "Job") if j["metadata"]["name"] == "pai-release-secrets"]
    return container(job)["command"][4:]


async def test_the_hook_makes_every_secret_the_chart_needs_and_keeps_them_on_the_next_run(api) -> None:
    core, emulator = api
    specs = chart_specs()
    wants = [parse_spec(spec) for spec in specs]
    first = await ensure(core, NS, wants)
    assert set(first) == {"pai-bus-credentials", "pai-job-secrets-key", "pai-admin-token", "pai-postgresql"}
    credentials = stored(emulator, "pai-bus-credentials")
    assert set(credentials) == {*busauth.ACCESS, busauth.ROUTE_PASSWORD_FILE}
    assert all(len(v) == 40 and v.isalnum() for v in credentials.values())
    # The job-secrets pair: the public half is the private key's.
    pair = stored(emulator, "pai-job-secrets-key")
    private = serialization.load_pem_private_key(pair["secrets.key"].encode(), password=None)
    public = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert pair["secrets.pub"] == public.decode()
    assert stored(emulator, "pai-admin-token")["token"].startswith("admin.")
    before = {name: stored(emulator, name) for name in first}
    # An upgrade runs it again: nothing changes.
    assert await ensure(core, NS, wants) == {name: [] for name in first}
    assert {name: stored(emulator, name) for name in first} == before


async def test_a_secret_missing_keys_is_completed_and_its_values_kept(api) -> None:
    core, emulator = api
    await core.create_namespaced_secret(NS, {"metadata": {"name": "creds"},
                                             "data": {"rest": base64.b64encode(b"kept-value").decode()}})
    wants = [parse_spec("creds/rest=random"), parse_spec("creds/monitor=random")]
    assert await ensure(core, NS, wants) == {"creds": ["monitor"]}
    values = stored(emulator, "creds")
    assert values["rest"] == "kept-value" and len(values["monitor"]) == 40


async def test_two_runs_at_once_agree_on_one_value(api) -> None:
    core, emulator = api
    wants = [parse_spec("once/a=random"), parse_spec("once/b=token:admin")]
    await asyncio.gather(ensure(core, NS, wants), ensure(core, NS, wants))
    values = stored(emulator, "once")
    assert set(values) == {"a", "b"}
    assert await ensure(core, NS, wants) == {"once": []}


def test_missing_values_never_replace_and_rebuild_a_lost_public_key() -> None:
    wants = [Want("s", "a", "random"), Want("s", "k", "x25519", "k.pub")]
    made = missing_values({}, wants)
    assert set(made) == {"a", "k", "k.pub"}
    again = missing_values({"a": "x", "k": made["k"]}, wants)
    assert again == {"k.pub": made["k.pub"]}


@pytest.mark.parametrize("spec", ["s/k", "s=random", "/k=random", "s/k=guess", "s/k=token", "s/k=random:x"])
def test_a_malformed_spec_is_refused_naming_it(spec: str) -> None:
    with pytest.raises(SpecError, match="KIND|SECRET/KEY"):
        parse_spec(spec)
