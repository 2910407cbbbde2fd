"""The chart for a real cluster: NATS as a three-server JetStream cluster (routes,
a volume per server, the route password from a Secret) or an external NATS; two
replicas of the single-active scheduler and launcher, each its own replica by pod
name; PodDisruptionBudgets; the bootstrap Job making three copies of the store;
and `values-production.yaml`, the example a cluster admin starts from.

Rendered by a real `helm` (tests/tools_helm.py); the NATS configuration, as the NATS
pod's `auth` init container makes it from the rendered Secrets, is checked by a real
nats-server (`-t`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from libs.common.config import load_config
from libs.common.natsserver import binary as nats_server_binary
from tests.tools_helm import KubeTools

# The chart's renderer and the helm fixture, shared with the other chart tests.
from tests.unit.test_deploy import (  # noqa: F401 - tools is a fixture
    CHART,
    NAMESPACE,
    RELEASE,
    REPO,
    nats_conf_as_the_pod_makes_it,
    release_secrets,
    render,
    run_helm as helm,
    tools,
)

PRODUCTION = CHART / "values-production.yaml"
SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")
EXTERNAL = "nats://nats-a.shared:4222,nats://nats-b.shared:4222,nats://nats-c.shared:4222"


def kinds(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def env_of(doc: dict) -> dict[str, dict]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container.get("env", [])}


def nats_conf(docs: list[dict], root: Path) -> str:
    """nats.conf as a NATS pod has it: the Secret's base config with the users appended
    by the pod's `auth` init container (its command run here, under `root`)."""
    return nats_conf_as_the_pod_makes_it(docs, root)


def bootstrap_job(docs: list[dict]) -> dict:
    (job,) = [d for name, d in kinds(docs, "Job").items() if name.startswith(f"{RELEASE}-bootstrap-")]
    return job


def pod_urls(replicas: int) -> str:
    return ",".join(f"nats://{RELEASE}-nats-{i}.{RELEASE}-nats-headless.{NAMESPACE}.svc:4222" for i in range(replicas))


VALUES = {"default": (), "production": ("-f", str(PRODUCTION))}


@pytest.fixture(scope="module", params=list(VALUES), ids=list(VALUES))
def rendered(request, tools: KubeTools) -> tuple[str, list[dict]]:
    return request.param, render(tools, *VALUES[request.param])


@pytest.mark.parametrize("values", list(VALUES), ids=list(VALUES))
def test_helm_lint_passes_strictly(tools: KubeTools, values: str) -> None:
    done = helm(tools, "lint", "--strict", str(CHART), *VALUES[values])
    assert done.returncode == 0, done.stdout + done.stderr


def test_nats_is_a_three_server_jetstream_cluster_with_a_volume_each(rendered, tmp_path: Path) -> None:
    _, docs = rendered
    sts = kinds(docs, "StatefulSet")[f"{RELEASE}-nats"]
    assert sts["spec"]["replicas"] == 3
    assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    ports = {p["name"]: p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["cluster"] == 6222
    headless = kinds(docs, "Service")[f"{RELEASE}-nats-headless"]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    conf = nats_conf(docs, tmp_path)
    routes = re.findall(r'"nats://route:([A-Za-z0-9]+)@([^"]+)"', conf)
    assert [host for _, host in routes] == [f"{RELEASE}-nats-{i}.{RELEASE}-nats-headless.{NAMESPACE}.svc:6222" for i in range(3)]
    # The nodes log in to each other with the password kept in the credentials Secret
    # (made by the release-secrets hook; never in the rendered configuration).
    password = release_secrets(docs)[f"{RELEASE}-bus-credentials"]["route-password"]
    assert "__ROUTE_PASSWORD__" in kinds(docs, "ConfigMap")[f"{RELEASE}-nats"]["data"]["nats-base.conf"]
    assert {p for p, _ in routes} == {password} and len(password) >= 32
    assert re.search(r"cluster \{[^}]*authorization \{\s*user: route\s*password: \"" + password, conf)


def test_rendered_cluster_config_is_accepted_by_nats_server(rendered, tmp_path: Path) -> None:
    _, docs = rendered
    conf = tmp_path / "nats.conf"
    conf.write_text(nats_conf(docs, tmp_path / "pod"))
    done = subprocess.run([nats_server_binary(), "--config", str(conf), "-t"], capture_output=True, text=True,
                          timeout=30, env={"POD_NAME": f"{RELEASE}-nats-1"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_services_get_every_nats_server_and_the_bootstrap_makes_three_copies(rendered) -> None:
    _, docs = rendered
    deployments = kinds(docs, "Deployment")
    for service in SERVICES:
        assert env_of(deployments[f"{RELEASE}-{service}"])["PAI_NATS_URL"]["value"] == pod_urls(3)
    job = bootstrap_job(docs)
    env = {name: e["value"] for name, e in env_of(job).items() if "value" in e}
    config = load_config(env=env)
    assert config.nats_replicas == 3 and config.nats_url == pod_urls(3)


@pytest.mark.parametrize("service", ["scheduler", "launcher"])
def test_single_active_services_run_two_replicas_named_by_their_pod(rendered, service: str) -> None:
    _, docs = rendered
    deployment = kinds(docs, "Deployment")[f"{RELEASE}-{service}"]
    assert deployment["spec"]["replicas"] == 2
    assert env_of(deployment)["PAI_REPLICA"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_every_scaled_out_component_has_a_disruption_budget(rendered) -> None:
    values, docs = rendered
    budgets = kinds(docs, "PodDisruptionBudget")
    # Not the monitor (one pod). The single-active scheduler and launcher too: their
    # standby reports ready (healthy, waiting for the lease), so a budget lets a drain
    # evict the active pod while the standby stays to take over.
    expected = {"nats", "rest", "runtime", "scheduler", "launcher"}
    assert set(budgets) == {f"{RELEASE}-{name}" for name in expected}
    for name in expected:
        spec = budgets[f"{RELEASE}-{name}"]["spec"]
        assert spec["maxUnavailable"] == 1
        assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == name
    replicas = {name.removeprefix(f"{RELEASE}-"): d["spec"]["replicas"] for name, d in kinds(docs, "Deployment").items()}
    if values == "production":
        assert replicas == {"rest": 3, "scheduler": 2, "launcher": 2, "runtime": 3, "monitor": 1}


def test_external_nats_renders_no_nats_of_its_own(tools: KubeTools) -> None:
    docs = render(tools, "-f", str(PRODUCTION), "--set", "nats.enabled=false",
                  "--set-string", f"nats.externalUrl={EXTERNAL.replace(',', chr(92) + ',')}")
    assert kinds(docs, "StatefulSet") == {}
    assert f"{RELEASE}-nats" not in kinds(docs, "Secret") and f"{RELEASE}-nats" not in kinds(docs, "Service")
    assert f"{RELEASE}-nats" not in kinds(docs, "PodDisruptionBudget")
    for service in SERVICES:
        assert env_of(kinds(docs, "Deployment")[f"{RELEASE}-{service}"])["PAI_NATS_URL"]["value"] == EXTERNAL
    job_env = env_of(bootstrap_job(docs))
    assert job_env["PAI_NATS_URL"]["value"] == EXTERNAL and job_env["PAI_NATS_REPLICAS"]["value"] == "3"


def test_a_single_nats_server_has_no_cluster_block_and_no_budget(tools: KubeTools, tmp_path: Path) -> None:
    docs = render(tools, "--set", "nats.replicas=1")
    assert kinds(docs, "StatefulSet")[f"{RELEASE}-nats"]["spec"]["replicas"] == 1
    conf = nats_conf(docs, tmp_path)
    assert "cluster {" not in conf and "jetstream" in conf
    assert f"{RELEASE}-nats" not in kinds(docs, "PodDisruptionBudget")
    assert env_of(kinds(docs, "Deployment")[f"{RELEASE}-rest"])["PAI_NATS_URL"]["value"] == f"nats://{RELEASE}-nats:4222"
    assert env_of(bootstrap_job(docs))["PAI_NATS_REPLICAS"]["value"] == "1"


def test_an_even_number_of_nats_servers_is_refused(tools: KubeTools) -> None:
    done = helm(tools, "template", RELEASE, str(CHART), "--set", "nats.replicas=2")
    assert done.returncode != 0 and "replicas" in done.stderr


def test_budgets_can_be_turned_off(tools: KubeTools) -> None:
    assert kinds(render(tools, "--set", "podDisruptionBudget.enabled=false"), "PodDisruptionBudget") == {}


def test_production_example_sets_only_real_settings(tools: KubeTools) -> None:
    """Its `config` keys are PAI settings (load_config refuses a wrong type), its
    store limits fit the NATS servers' file store."""
    from libs.common.config import Config
    from libs.common.jetstream_limits import store_settings

    values = yaml.safe_load(PRODUCTION.read_text())
    config = load_config(env={}, **values["config"])
    assert isinstance(config, Config)
    max_file = values["nats"]["jetstream"]["maxFile"]
    assert max_file.endswith("Gi")
    assert store_settings(config).total_bytes() < int(max_file[:-2]) * 1024**3
