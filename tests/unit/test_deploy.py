"""What PAI ships for deployment: the Helm chart, the service images and docker-compose.yml.

The chart is rendered by a real `helm` and created with a real `kubectl` against a
Kubernetes API emulator (kmock, with the API's real resource discovery), and every
rendered object is checked field by field against the Kubernetes API models of
kubernetes-asyncio. No cluster and no Docker engine exist where PAI is developed, so
the images and the compose file are checked by reading them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import re
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import sqlalchemy
import yaml
from kubernetes_asyncio.client import models as k8s_models
from prometheus_client.metrics import MetricWrapperBase

from libs.common.config import Config, load_config
from libs.common.natsserver import binary as nats_server_binary
from tests.conftest import shared_path
from tests.tools_helm import KubeTools, ToolsUnavailable, kube_tools

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "pai"
RELEASE, NAMESPACE = "pai", "pai"
JOBS_NAMESPACE = f"{NAMESPACE}-jobs"
SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")
DEFAULT_PORTS = {name: Config().port_of(name) for name in SERVICES}
CONFIG_FIELDS = {field.name for field in msgspec.structs.fields(Config)}


# --- rendering -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools() -> KubeTools:
    try:
        return kube_tools()
    except ToolsUnavailable as exc:
        pytest.skip(f"helm/kubectl not available: {exc}")


def run_helm(tools: KubeTools, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools.helm), *args], capture_output=True, text=True, timeout=60)


def render(tools: KubeTools, *args: str) -> list[dict]:
    """`helm template` of the chart with extra arguments; the objects it renders."""
    done = run_helm(tools, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_fails(tools: KubeTools, *args: str) -> str:
    done = run_helm(tools, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode != 0, f"helm rendered the chart with {args}"
    return done.stderr


@pytest.fixture(scope="module")
def manifests(tools: KubeTools) -> list[dict]:
    return render(tools)


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def deployment(docs: list[dict], service: str) -> dict:
    return one(docs, "Deployment", f"{RELEASE}-{service}")


def container(doc: dict, name: str | None = None) -> dict:
    """The pod template's one container, or the one called `name`."""
    containers = doc["spec"]["template"]["spec"]["containers"]
    if name is not None:
        (found,) = [c for c in containers if c["name"] == name]
        return found
    (only,) = containers
    return only


def explicit_env(doc: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(doc).get("env", []) if "value" in e}


def effective_env(docs: list[dict], doc: dict) -> dict[str, str]:
    """The environment the container starts with: envFrom ConfigMaps, then env on top."""
    env: dict[str, str] = {}
    for source in container(doc).get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update(explicit_env(doc))
    return env


def set_args(**values: object) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def is_hook(doc: dict) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def release_secrets(docs: list[dict]) -> dict[str, dict[str, str]]:
    """Every Secret of the release as it is once installed: those rendered, and those
    the release-secrets hook makes (its Job's own specs run through its own code,
    libs/common/release_secrets.py), by name, their values decoded. Random values
    are drawn from a generator seeded by the Secret's name: the same at every call."""
    import random
    import string

    from libs.common.release_secrets import RANDOM_LENGTH, by_secret, missing_values, parse_spec

    out = {d["metadata"]["name"]: {**{k: base64.b64decode(v).decode() for k, v in d.get("data", {}).items()},
                                   **d.get("stringData", {})} for d in find(docs, "Secret")}
    for job in find(docs, "Job"):
        command = container(job)["command"]
        if command[:3] == ["python", "-m", "libs.common.release_secrets"]:
            assert command[3] == NAMESPACE
            for name, wants in by_secret([parse_spec(spec) for spec in command[4:]]).items():
                rng = random.Random(name)

                def draw(rng: random.Random = rng) -> str:
                    return "".join(rng.choices(string.ascii_letters + string.digits, k=RANDOM_LENGTH))

                out[name] = {**out.get(name, {}), **missing_values(out.get(name, {}), wants, make_random=draw)}
    return out


# --- helm lint -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"nats.enabled": False, "nats.externalUrl": "nats://nats.example:4222"},
        {"metrics.serviceMonitor.enabled": True, "dashboards.enabled": False, "serviceAccount.create": False},
        {"history.existingSecret": "pai-history", "postgresql.enabled": False},
    ],
    ids=["defaults", "external-nats", "servicemonitor-no-dashboards-own-account", "own-history-database"],
)
def test_helm_lint_passes_strictly(tools: KubeTools, values: dict) -> None:
    done = run_helm(tools, "lint", "--strict", str(CHART), *set_args(**values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("args", "warns"),
    [([], True), (["--set-json", 'cluster={"physicalCluster": {}, "virtualClusters": {}}'], False)],
    ids=["example-layout-warns", "own-layout-quiet"],
)
def test_client_side_dry_run_install_tells_how_to_reach_pai(tools: KubeTools, args: list[str], warns: bool) -> None:
    done = run_helm(tools, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"port-forward svc/{RELEASE}-rest 9186" in notes
    assert f"get secret {RELEASE}-admin-token" in notes  # the admin token is in a Secret, not a pod's folder
    assert ("uses the chart's example" in notes) is warns


# --- the five services -----------------------------------------------------------------


def test_one_deployment_per_service(manifests: list[dict]) -> None:
    names = sorted(d["metadata"]["name"] for d in find(manifests, "Deployment"))
    assert names == sorted(f"{RELEASE}-{s}" for s in SERVICES)


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_service_runs_its_module_and_probes_health_on_its_port(manifests: list[dict], service: str) -> None:
    doc = deployment(manifests, service)
    c = container(doc)
    assert c["command"] == ["python", "-m", f"services.{service}"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == DEFAULT_PORTS[service]
    # The service must listen where the probes knock: on every interface, on that port.
    config = load_config(env=effective_env(manifests, doc))
    assert config.host == "0.0.0.0"
    assert config.port_of(service) == DEFAULT_PORTS[service]
    svc = one(manifests, "Service", f"{RELEASE}-{service}")
    assert svc["spec"]["selector"] == doc["spec"]["selector"]["matchLabels"]
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(DEFAULT_PORTS[service], "http")]


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_every_pai_variable_set_is_a_config_setting_pai_accepts(manifests: list[dict], service: str) -> None:
    doc = deployment(manifests, service)
    env = effective_env(manifests, doc)
    unknown = sorted(k for k in env if k.startswith("PAI_") and k[4:].lower() not in CONFIG_FIELDS)
    assert unknown == []
    config = load_config(env=env)  # raises BadInput on a value of the wrong type
    # Every pod of the three-server NATS cluster, by its stable name.
    assert config.nats_url == ",".join(
        f"nats://{RELEASE}-nats-{i}.{RELEASE}-nats-headless.{NAMESPACE}.svc:4222" for i in range(3))


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_pods_are_scraped_by_prometheus_on_their_metrics_port(manifests: list[dict], service: str) -> None:
    annotations = deployment(manifests, service)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(DEFAULT_PORTS[service])
    assert annotations["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize(
    ("service", "strategy"),
    [("rest", "RollingUpdate"), ("runtime", "RollingUpdate"), ("scheduler", "Recreate"), ("launcher", "Recreate")],
    ids=["rest-rolls", "runtime-rolls", "scheduler-recreated", "launcher-recreated"],
)
def test_single_active_services_are_recreated_not_rolled(manifests: list[dict], service: str, strategy: str) -> None:
    # A rolled single-active pod would wait forever for a successor that cannot become
    # ready while the old pod holds the leader lease.
    assert deployment(manifests, service)["spec"]["strategy"]["type"] == strategy


# --- launcher: Kubernetes backend and RBAC ---------------------------------------------


def test_launcher_uses_kubernetes_backend_with_its_own_service_account(manifests: list[dict]) -> None:
    doc = deployment(manifests, "launcher")
    env = explicit_env(doc)
    config = load_config(env=effective_env(manifests, doc))
    assert config.backend == "kubernetes"
    # Job Pods in their own namespace, on the Pod network, as a non-root user.
    assert config.kube_namespace == JOBS_NAMESPACE and env["PAI_KUBE_NAMESPACE"] == JOBS_NAMESPACE
    assert config.kube_host_network is False and (config.kube_task_uid, config.kube_task_gid) == (1000, 1000)
    # The ssh plugin's init container makes the task's sshd bundle from the launcher's own image.
    (launcher_container,) = doc["spec"]["template"]["spec"]["containers"]
    assert config.kube_ssh_image == launcher_container["image"]
    (namespace,) = find(manifests, "Namespace")
    assert namespace["metadata"]["name"] == JOBS_NAMESPACE
    pod = doc["spec"]["template"]["spec"]
    account = one([d for d in manifests if not is_hook(d)], "ServiceAccount", pod["serviceAccountName"])
    assert account["metadata"]["name"] == f"{RELEASE}-launcher"
    assert pod["automountServiceAccountToken"] is True


def test_an_admin_may_put_every_job_on_the_node_network(tools: KubeTools) -> None:
    docs = render(tools, *set_args(**{"jobs.hostNetwork": True, "jobs.runAsUser": 2000}))
    config = load_config(env=effective_env(docs, deployment(docs, "launcher")))
    assert config.kube_host_network is True and config.kube_task_uid == 2000


@pytest.mark.parametrize("service", [s for s in SERVICES if s != "launcher"], ids=lambda s: s)
def test_other_services_get_no_api_token(manifests: list[dict], service: str) -> None:
    pod = deployment(manifests, service)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod


def api_calls_in(*modules: str) -> set[tuple[str, str]]:
    """(verb, resource) of every Kubernetes API call the modules' code makes, read from
    its source: `api.<verb>_namespaced_<kind>[_<subresource>](...)` of kubernetes-asyncio's
    CoreV1Api, a `watch=True` list being a watch; `connect_get_namespaced_pod_exec` (a
    WebSocket) needs get and, on Kubernetes 1.30 and later, create of `pods/exec`."""
    import ast

    verbs = {"create": "create", "read": "get", "list": "list", "patch": "patch", "delete": "delete",
             "replace": "update"}
    plural = {"pod": "pods", "secret": "secrets", "pod_log": "pods/log", "config_map": "configmaps"}
    calls: set[tuple[str, str]] = set()
    for module in modules:
        tree = ast.parse((REPO / module).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if connect := re.fullmatch(r"connect_(?:get|post)_namespaced_pod_(\w+)", node.func.attr):
                calls |= {("get", f"pods/{connect[1]}"), ("create", f"pods/{connect[1]}")}
                continue
            match = re.fullmatch(r"(create|read|list|patch|delete|replace)_namespaced_(\w+)", node.func.attr)
            if match is None:
                continue
            watch = any(k.arg == "watch" for k in node.keywords)
            calls.add(("watch" if watch else verbs[match[1]], plural[match[2]]))
    return calls


def role_grants(role: dict) -> set[tuple[str, str]]:
    return {(verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}


# Every backend module: the Kubernetes backend's kube*.py, and its terminals (exec).
LAUNCHER_MODULES = [str(p.relative_to(REPO)) for p in sorted((REPO / "services/launcher/backends").glob("*.py"))]


def test_launcher_role_grants_exactly_what_the_kubernetes_backend_calls(manifests: list[dict]) -> None:
    (role,) = [d for d in find(manifests, "Role") if not is_hook(d)]
    calls = api_calls_in(*LAUNCHER_MODULES)
    # The backend's own calls, as read from it (the reading is not vacuous).
    assert {("create", "pods"), ("watch", "pods"), ("get", "pods/log"), ("list", "secrets")} <= calls
    assert role_grants(role) == calls
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    (binding,) = [d for d in find(manifests, "RoleBinding") if not is_hook(d)]
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["roleRef"] == role_ref
    launcher_account = deployment(manifests, "launcher")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": launcher_account, "namespace": NAMESPACE}]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == JOBS_NAMESPACE


def test_release_secrets_hook_role_grants_exactly_what_its_code_calls(manifests: list[dict]) -> None:
    (role,) = [d for d in find(manifests, "Role") if is_hook(d)]
    assert role_grants(role) == api_calls_in("libs/common/release_secrets.py") == {
        ("get", "secrets"), ("create", "secrets"), ("patch", "secrets")}
    # Reading and changing only the release's own Secrets (create cannot be limited by name).
    (named,) = [rule for rule in role["rules"] if "resourceNames" in rule]
    made = {spec.split("/")[0] for spec in container(one(manifests, "Job", f"{RELEASE}-release-secrets"))["command"][4:]}
    assert set(named["resourceNames"]) == made and set(named["verbs"]) == {"get", "patch"}


def test_job_pods_namespace_can_be_chosen_or_shared(tools: KubeTools) -> None:
    docs = render(tools, *set_args(**{"jobs.namespace": "gpu-jobs", "jobs.createNamespace": False}))
    assert explicit_env(deployment(docs, "launcher"))["PAI_KUBE_NAMESPACE"] == "gpu-jobs"
    role, binding = [d for d in find(docs, "Role") if not is_hook(d)], [d for d in find(docs, "RoleBinding") if not is_hook(d)]
    assert role[0]["metadata"]["namespace"] == binding[0]["metadata"]["namespace"] == "gpu-jobs"
    assert binding[0]["subjects"][0]["namespace"] == NAMESPACE
    assert find(docs, "Namespace") == []


def test_an_existing_service_account_can_be_used(tools: KubeTools) -> None:
    docs = render(tools, *set_args(**{"serviceAccount.create": False, "serviceAccount.name": "gpu-launcher"}))
    assert [d for d in find(docs, "ServiceAccount") if not is_hook(d)] == []
    assert deployment(docs, "launcher")["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-launcher"
    assert [d for d in find(docs, "RoleBinding") if not is_hook(d)][0]["subjects"][0]["name"] == "gpu-launcher"


# --- scheduler: the cluster config ------------------------------------------------------


def cluster_file_of(docs: list[dict]) -> tuple[str, str]:
    """(the path PAI_CLUSTER_FILE names, the text the scheduler finds there)."""
    doc = deployment(docs, "scheduler")
    path = Path(explicit_env(doc)["PAI_CLUSTER_FILE"])
    c, pod = container(doc), doc["spec"]["template"]["spec"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    return str(path), config_map["data"][path.name]


def test_scheduler_reads_the_cluster_configmap_as_its_cluster_file(manifests: list[dict]) -> None:
    path, text = cluster_file_of(manifests)
    assert path == "/etc/pai/cluster/cluster.yaml"
    assert set(yaml.safe_load(text)) == {"physicalCluster", "virtualClusters"}


def test_default_cluster_is_a_valid_hived_config(manifests: list[dict]) -> None:
    from services.scheduler.cluster import load_cluster_config

    cluster = load_cluster_config(cluster_file_of(manifests)[1])
    assert set(cluster.virtualClusters) == {"default", "research"}


def test_cluster_values_reach_the_scheduler_and_restart_it(tools: KubeTools, manifests: list[dict]) -> None:
    small = {
        "physicalCluster": {
            "cellTypes": {"T4-NODE": {"childCellType": "T4", "childCellNumber": 4, "isNodeLevel": True}},
            "physicalCells": [{"cellType": "T4-NODE", "cellAddress": "worker-7"}],
        },
        "virtualClusters": {"default": {"virtualCells": [{"cellType": "T4-NODE", "cellNumber": 1}]}},
    }
    docs = render(tools, *set_args(cluster=small))
    assert yaml.safe_load(cluster_file_of(docs)[1]) == small

    def checksum(d: list[dict]) -> str:
        return deployment(d, "scheduler")["spec"]["template"]["metadata"]["annotations"]["checksum/cluster"]

    assert checksum(docs) != checksum(manifests)


def test_an_existing_hived_config_file_is_passed_through_unchanged(tools: KubeTools, tmp_path: Path) -> None:
    text = (
        "# two K80 nodes, one VC\n"
        "physicalCluster:\n"
        "  cellTypes:\n"
        "    K80-NODE: {childCellType: K80, childCellNumber: 4, isNodeLevel: true}\n"
        "    K80-PAIR: {childCellType: K80-NODE, childCellNumber: 2}\n"
        "  physicalCells:\n"
        "  - cellType: K80-PAIR\n"
        "    cellChildren: [{cellAddress: node-a}, {cellAddress: node-b}]\n"
        "virtualClusters:\n"
        "  default: {virtualCells: [{cellType: K80-PAIR.K80-NODE, cellNumber: 2}]}\n"
    )
    (tmp_path / "hived.yaml").write_text(text)
    assert cluster_file_of(render(tools, "--set-file", f"cluster={tmp_path / 'hived.yaml'}"))[1] == text


def test_a_reference_hived_config_is_passed_through_unchanged(tools: KubeTools) -> None:
    path = shared_path("reference", "hived", "hived-config-2.yaml")
    rendered = cluster_file_of(render(tools, "--set-file", f"cluster={path}"))[1]
    assert yaml.safe_load(rendered) == yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    "cluster",
    [{"virtualClusters": {}}, "physicalCluster: [unclosed"],
    ids=["no-physical-cluster", "not-yaml"],
)
def test_a_cluster_layout_without_its_parts_is_refused(tools: KubeTools, cluster: object) -> None:
    assert "HiveD-format layout" in render_fails(tools, *set_args(cluster=cluster))


# --- NATS -------------------------------------------------------------------------------


def nats_conf_as_the_pod_makes_it(manifests: list[dict], root: Path) -> str:
    """nats.conf as the NATS pod has it: the `auth` init container's own command, run
    here on the rendered Secrets (mounted where the pod mounts them, under `root`)."""
    import sys

    sts = one(manifests, "StatefulSet", f"{RELEASE}-nats")
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    secrets = release_secrets(manifests)
    for mount in init["volumeMounts"]:
        folder = root / mount["mountPath"].lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        files: dict[str, str] = {}
        if "secret" in volume:
            files = secrets[volume["secret"]["secretName"]]
        elif "configMap" in volume:
            files = one(manifests, "ConfigMap", volume["configMap"]["name"])["data"]
        for name, content in files.items():
            (folder / name).write_text(content)
    python, *args = init["command"]
    assert python == "python"
    args = [str(root / a.lstrip("/")) if a.startswith("/etc/") else a for a in args]
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    mounts = {m["mountPath"]: m["name"] for m in container(sts, "nats")["volumeMounts"]}
    conf = "/etc/nats/nats.conf"
    assert container(sts, "nats")["args"] == ["--config", conf]
    assert mounts["/etc/nats"] == "config" and "emptyDir" in volumes["config"]  # the init container's output
    return (root / conf.lstrip("/")).read_text()


def test_nats_keeps_jetstream_files_on_a_persistent_volume(manifests: list[dict]) -> None:
    sts = one(manifests, "StatefulSet", f"{RELEASE}-nats")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "nats")["volumeMounts"]}
    conf = one(manifests, "ConfigMap", f"{RELEASE}-nats")["data"]["nats-base.conf"]
    store_dir = re.search(r"store_dir:\s*(\S+)", conf).group(1)
    assert store_dir.startswith(mounts[claim["metadata"]["name"]] + "/")
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    service = one(manifests, "Service", f"{RELEASE}-nats")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["client"] == 4222


def test_nats_collects_harder_before_its_memory_limit(manifests: list[dict], tools: KubeTools) -> None:
    """Go lets nats-server's heap grow to twice what is live: GOMEMLIMIT under the
    container's limit makes it collect near the limit instead of being OOM-killed."""
    env = {e["name"]: e.get("value") for e in container(one(manifests, "StatefulSet", f"{RELEASE}-nats"), "nats")["env"]}
    assert env["GOMEMLIMIT"] == "920MiB"  # ~90% of the default 1Gi limit
    docs = render(tools, *set_args(**{"nats.goMemLimit": ""}))
    names = [e["name"] for e in container(one(docs, "StatefulSet", f"{RELEASE}-nats"), "nats")["env"]]
    assert "GOMEMLIMIT" not in names
    assert "/nats/goMemLimit" in render_fails(tools, *set_args(**{"nats.goMemLimit": "a lot"}))


def test_rendered_nats_config_is_accepted_by_nats_server(manifests: list[dict], tmp_path: Path) -> None:
    conf = tmp_path / "nats.conf"
    conf.write_text(nats_conf_as_the_pod_makes_it(manifests, tmp_path / "pod"))
    done = subprocess.run(
        [nats_server_binary(), "--config", str(conf), "-t"],
        capture_output=True, text=True, timeout=30, env={"POD_NAME": f"{RELEASE}-nats-0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_service_logs_in_to_nats_as_itself_from_a_secret(manifests: list[dict], tmp_path: Path) -> None:
    """The bus is authenticated (libs/common/busauth.py): no anonymous user, each
    service's nkey from its own key of the credentials Secret, and nats.conf lists
    that key's public half with the service's permissions, no password."""
    from libs.common import busauth

    assert not find(manifests, "Secret")  # no secret value is rendered: the hook makes them
    credentials = release_secrets(manifests)[f"{RELEASE}-bus-credentials"]
    assert set(credentials) == {*busauth.ACCESS, busauth.ROUTE_PASSWORD_FILE}
    for service in SERVICES:
        env = {e["name"]: e for e in container(deployment(manifests, service))["env"]}
        assert env["PAI_NATS_USER"]["value"] == service
        assert env["PAI_NATS_NKEY_SEED"]["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-bus-credentials", "key": service}
        assert "PAI_NATS_PASSWORD" not in env
    conf = nats_conf_as_the_pod_makes_it(manifests, tmp_path)
    users = json.loads(conf.split("\nauthorization: ", 1)[1])["users"]
    expected = {busauth.public_key(credentials[u]): busauth.permissions_block(u) for u in busauth.ACCESS}
    assert {u["nkey"]: u["permissions"] for u in users} == expected
    assert "password" not in json.dumps(users) and "no_auth_user" not in conf


def test_external_nats_replaces_the_bundled_one(tools: KubeTools) -> None:
    url = "nats://nats.shared.svc:4222"
    docs = render(tools, *set_args(**{"nats.enabled": False, "nats.externalUrl": url}))
    assert [d["metadata"]["name"] for d in find(docs, "StatefulSet")] == [f"{RELEASE}-postgresql"]  # the history's
    assert not [d for d in docs if d["metadata"]["name"].startswith(f"{RELEASE}-nats")]
    for service in SERVICES:
        assert explicit_env(deployment(docs, service))["PAI_NATS_URL"] == url


def test_disabling_nats_without_an_external_url_is_refused(tools: KubeTools) -> None:
    assert "nats.externalUrl is required" in render_fails(tools, *set_args(**{"nats.enabled": False}))


# --- the job history database (history, postgresql) -------------------------------------

EXTERNAL_DSN = "postgresql+asyncpg://pai:s3cret@db.example:5432/pai"


def container_env(docs: list[dict], doc: dict) -> dict[str, str]:
    """The container's explicit environment as Kubernetes makes it: secretKeyRef values
    read from the release's Secrets, `$(NAME)` replaced by a variable set before it."""
    secrets = release_secrets(docs)
    env: dict[str, str] = {}
    for entry in container(doc).get("env", []):
        if "value" in entry:
            env[entry["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), entry["value"])
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            if ref["name"] in secrets:
                env[entry["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def history_dsn_ref(doc: dict) -> dict:
    (entry,) = [e for e in container(doc)["env"] if e["name"] == "PAI_HISTORY_DSN"]
    return entry


def test_rest_keeps_the_history_in_the_bundled_postgresql_by_default(manifests: list[dict]) -> None:
    sts = one(manifests, "StatefulSet", f"{RELEASE}-postgresql")
    pod = sts["spec"]["template"]["spec"]
    (pg,) = pod["containers"]
    assert pg["image"].startswith("postgres:") and sts["spec"]["replicas"] == 1
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    data_mount = next(m for m in pg["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    pg_env = {e["name"]: e for e in pg["env"]}
    assert pg_env["PGDATA"]["value"].startswith(data_mount["mountPath"] + "/")  # on the volume, below lost+found
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-postgresql", "key": "password"}
    assert pod["securityContext"]["runAsNonRoot"] and pg["securityContext"]["readOnlyRootFilesystem"]
    assert {"/var/run/postgresql", "/tmp"} <= {m["mountPath"] for m in pg["volumeMounts"]}  # writable where it writes
    service = one(manifests, "Service", f"{RELEASE}-postgresql")
    assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    # The password Secret is the release-secrets hook's (not part of the release: it
    # outlives it, like the volume), never rendered.
    assert not find(manifests, "Secret", f"{RELEASE}-postgresql")
    password = release_secrets(manifests)[f"{RELEASE}-postgresql"]["password"]
    assert len(password) >= 24 and password.isalnum()

    rest = deployment(manifests, "rest")
    dsn = load_config(env={**effective_env(manifests, rest), **container_env(manifests, rest)}).history_dsn
    url = sqlalchemy.engine.make_url(dsn)
    assert (url.drivername, url.host, url.port, url.database, url.username, url.password) == (
        "postgresql+asyncpg", f"{RELEASE}-postgresql.{NAMESPACE}.svc", service["spec"]["ports"][0]["port"],
        pg_env["POSTGRES_DB"]["value"], pg_env["POSTGRES_USER"]["value"], password)
    assert password not in json.dumps(rest)  # the password comes from the Secret, not the Deployment
    for service_name in SERVICES[1:]:  # nobody else gets the database
        env = {e["name"] for e in container(deployment(manifests, service_name))["env"]}
        assert not {"PAI_HISTORY_DSN", "HISTORY_DB_PASSWORD"} & env


@pytest.mark.parametrize(
    ("values", "secret", "key"),
    [
        ({"history.dsn": EXTERNAL_DSN}, f"{RELEASE}-history", "dsn"),
        ({"history.existingSecret": "pai-db", "history.existingSecretKey": "url"}, "pai-db", "url"),
    ],
    ids=["dsn-in-values", "existing-secret"],
)
def test_a_postgresql_of_your_own_replaces_the_bundled_one(tools: KubeTools, values: dict, secret: str, key: str) -> None:
    docs = render(tools, *set_args(**values, **{"postgresql.enabled": False}))
    assert not [d for d in docs if "postgresql" in d["metadata"]["name"]]
    rest = deployment(docs, "rest")
    assert history_dsn_ref(rest)["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
    assert EXTERNAL_DSN not in json.dumps([d for d in docs if d["kind"] != "Secret"])  # only in a Secret
    if "history.dsn" in values:
        assert load_config(env=container_env(docs, rest)).history_dsn == EXTERNAL_DSN
    else:
        assert find(docs, "Secret", f"{RELEASE}-history") == []  # yours, not the chart's


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"postgresql.enabled": False}, "rest needs a PostgreSQL for the job history"),
        ({"history.dsn": EXTERNAL_DSN}, "set postgresql.enabled=false"),
        ({"history.dsn": EXTERNAL_DSN, "history.existingSecret": "db", "postgresql.enabled": False}, "not both"),
        ({"config.history_dsn": EXTERNAL_DSN}, "config.history_dsn: set history.dsn"),
        ({"history.dsn": "mysql://db/pai", "postgresql.enabled": False}, "/history/dsn"),
        ({"postgresql.username": "pai@x"}, "/postgresql/username"),
    ],
    ids=["no-database", "dsn-and-bundled", "dsn-and-secret", "dsn-in-shared-config", "not-postgresql", "user-not-a-name"],
)
def test_history_database_mistakes_are_refused(tools: KubeTools, values: dict, complaint: str) -> None:
    assert complaint in render_fails(tools, *set_args(**values))


# --- values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "service", "check"),
    [
        ({"services.rest.replicas": 3}, "rest", lambda d: d["spec"]["replicas"] == 3),
        ({"services.runtime.replicas": 4}, "runtime", lambda d: d["spec"]["replicas"] == 4),
        ({"services.scheduler.replicas": 2}, "scheduler", lambda d: d["spec"]["replicas"] == 2
         and d["spec"]["strategy"]["type"] == "Recreate"),
        ({"image.registry": "registry.example.com/", "image.tag": "1.2.3"}, "monitor",
         lambda d: container(d)["image"] == "registry.example.com/pai-monitor:1.2.3"),
        ({"services.rest.image": {"repository": "mirror/pai-api", "tag": "7"}}, "rest",
         lambda d: container(d)["image"] == "mirror/pai-api:7"),
        ({"services.launcher.env": {"PAI_GRACE_SECONDS": "30"}}, "launcher",
         lambda d: explicit_env(d)["PAI_GRACE_SECONDS"] == "30"),
        ({"services.launcher.env": {"PAI_KUBE_NAMESPACE": "gpu-jobs"}}, "launcher",
         lambda d: explicit_env(d)["PAI_KUBE_NAMESPACE"] == "gpu-jobs"),
        ({"services.monitor.nodeSelector": {"pai/monitor": "true"}}, "monitor",
         lambda d: d["spec"]["template"]["spec"]["nodeSelector"] == {"pai/monitor": "true"}),
        ({"services.monitor.runtimeClassName": "nvidia", "services.monitor.env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
         "monitor", lambda d: d["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
         and explicit_env(d)["NVIDIA_VISIBLE_DEVICES"] == "all"),
        ({"metrics.podAnnotations": False}, "rest",
         lambda d: "prometheus.io/scrape" not in d["spec"]["template"]["metadata"]["annotations"]),
    ],
    ids=[
        "rest-replicas-3", "runtime-replicas-4", "scheduler-standby-still-recreated", "global-registry-and-tag",
        "per-service-image", "per-service-env-added", "per-service-env-overrides-chart", "node-selector",
        "monitor-sees-gpus", "pod-annotations-off",
    ],
)  # fmt: skip
def test_values_overrides_are_honoured(tools: KubeTools, values: dict, service: str, check) -> None:
    assert check(deployment(render(tools, *set_args(**values)), service))


def test_shared_config_values_become_pai_settings_of_every_service(tools: KubeTools) -> None:
    docs = render(tools, *set_args(**{"config.smtp_host": "mail.example", "config.node_sample_seconds": 5}))
    for service in SERVICES:
        config = load_config(env=effective_env(docs, deployment(docs, service)))
        assert (config.smtp_host, config.node_sample_seconds) == ("mail.example", 5.0)


def test_default_shared_config_names_only_real_settings(manifests: list[dict]) -> None:
    data = one(manifests, "ConfigMap", f"{RELEASE}-config")["data"]
    assert data and all(k.startswith("PAI_") and k[4:].lower() in CONFIG_FIELDS for k in data)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"services.rest.replicas": -1}, "minimum"),
        ({"services.rset": {"replicas": 2}}, "rset"),
        ({"services.rest.service": {"type": "Ingress"}}, "type"),
        ({"nats.enabled": False, "nats.externalUrl": "http://nats:4222"}, "externalUrl"),
        ({"services.launcher.env": {"BAD NAME": "x"}}, "BAD NAME"),
    ],
    ids=["negative-replicas", "misspelt-service", "unknown-service-type", "external-url-not-nats", "bad-env-name"],
)
def test_values_schema_refuses_mistakes(tools: KubeTools, values: dict, complaint: str) -> None:
    assert complaint in render_fails(tools, *set_args(**values))


# --- metrics: ServiceMonitor and the Grafana dashboard ----------------------------------


def test_service_monitor_is_optional_and_scrapes_every_service(tools: KubeTools, manifests: list[dict]) -> None:
    assert find(manifests, "ServiceMonitor") == []
    (monitor,) = find(render(tools, *set_args(**{"metrics.serviceMonitor.enabled": True})), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    (components,) = [e for e in monitor["spec"]["selector"]["matchExpressions"] if e["key"].endswith("component")]
    assert sorted(components["values"]) == sorted([*SERVICES, "nats"])  # NATS: its exporter


def dashboard(docs: list[dict]) -> dict:
    (config_map,) = [d for d in find(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    # One key per dashboard file; the overview is the one these tests read
    # (tests/unit/test_dashboards.py checks every dashboard's metric names).
    assert {"pai-overview.json", "pai-node.json", "pai-job.json"} <= set(config_map["data"])
    return json.loads(config_map["data"]["pai-overview.json"])


def dashboard_queries(dash: dict) -> list[str]:
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for variable in dash["templating"]["list"]:
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if variable["type"] == "query" and query:
            # Grafana's label_values(metric, label) names a metric, it is not PromQL.
            queries.append(re.sub(r"label_values\((\w+),\s*\w+\)", r"\1", query))
    return queries


_PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (enough PromQL for dashboards, not all of it)."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)\s*(\()?", expr):
        if not match.group(2) and match.group(1) not in _PROMQL_KEYWORDS:
            names.add(match.group(1))
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (vc, state) (pai_jobs{vc=~"$vc"})', {"pai_jobs"}),
        ("histogram_quantile(0.95, sum by (le) (rate(x_seconds_bucket[$__rate_interval])))", {"x_seconds_bucket"}),
        ("sum(rate(a_sum[5m])) / sum(rate(a_count[5m]))", {"a_sum", "a_count"}),
        ("avg(nvidiasmi_utilization_gpu) and on (instance) up == 1", {"nvidiasmi_utilization_gpu", "up"}),
    ],
    ids=["labels-and-by", "histogram-quantile", "ratio", "binary-on"],
)
def test_promql_metric_names_finds_what_a_query_reads(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


# What the dashboard was specified against, used only for a service whose metrics.py is
# not written yet.
AGREED_METRICS = {
    "pai_jobs", "pai_job_submit_to_running_seconds", "pai_node_cpu_percent", "pai_node_memory_used_bytes",
    "nvidiasmi_utilization_gpu",
}  # fmt: skip


def exported_metric_names() -> set[str]:
    """Every sample name the services' metrics.py modules export."""
    names: set[str] = set()
    missing = [s for s in SERVICES if not (REPO / "services" / s / "metrics.py").exists()]
    for service in set(SERVICES) - set(missing):
        module = importlib.import_module(f"services.{service}.metrics")
        for value in vars(module).values():
            for metric in value.values() if isinstance(value, dict) else [value]:
                if isinstance(metric, MetricWrapperBase):
                    for family in metric.describe():
                        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                                    "summary": ["_sum", "_count"]}.get(family.type, [""])  # fmt: skip
                        names.update(family.name + s for s in suffixes)
    if missing:
        names |= AGREED_METRICS | {f"pai_job_submit_to_running_seconds{s}" for s in ("_bucket", "_sum", "_count")}
    return names


def test_dashboard_is_a_grafana_configmap_of_the_agreed_views(manifests: list[dict]) -> None:
    dash = dashboard(manifests)
    assert dash["uid"] == "pai-overview"
    read = set().union(*(promql_metric_names(q) for q in dashboard_queries(dash)))
    assert {"pai_jobs", "pai_job_submit_to_running_seconds_bucket", "pai_node_cpu_percent",
            "pai_node_memory_used_bytes", "nvidiasmi_utilization_gpu"} <= read  # fmt: skip
    by_state_and_vc = [q for q in dashboard_queries(dash) if "pai_jobs" in q and "state" in q and "vc" in q]
    assert by_state_and_vc, "no panel shows jobs by state and VC"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_queries_only_metrics_pai_exports(manifests: list[dict]) -> None:
    exported = exported_metric_names()
    read = set().union(*(promql_metric_names(q) for q in dashboard_queries(dashboard(manifests))))
    assert sorted(read - exported) == []


def test_dashboards_can_be_left_out(tools: KubeTools) -> None:
    docs = render(tools, *set_args(**{"dashboards.enabled": False}))
    assert not [d for d in find(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]


# --- Kubernetes API conformance ---------------------------------------------------------

_PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
_INVALID = object()


def api_model_errors(value: object, type_name: str, path: str) -> list[str]:
    """Where an object departs from the Kubernetes API: unknown fields, wrong types,
    missing required fields, judged by kubernetes-asyncio's generated API models."""
    errors: list[str] = []
    _build_model(value, type_name, path, errors)
    return errors


def _build_model(value: object, type_name: str, path: str, errors: list[str]) -> object:
    if value is None:
        return None
    if match := re.fullmatch(r"list\[(.*)\]", type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {value!r}")
            return _INVALID
        return [_build_model(v, match.group(1), f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if match := re.fullmatch(r"dict\(str, (.*)\)", type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {value!r}")
            return _INVALID
        return {k: _build_model(v, match.group(1), f"{path}.{k}", errors) for k, v in value.items()}
    if type_name in _PRIMITIVES:
        if not isinstance(value, _PRIMITIVES[type_name]) or (type_name != "bool" and isinstance(value, bool)):
            errors.append(f"{path}: {value!r} is not a {type_name}")
        return value
    if type_name in ("object", "datetime", "date"):  # int-or-string, quantities, free-form
        return value
    model = getattr(k8s_models, type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} mapping, got {value!r}")
        return _INVALID
    attribute_of = {json_name: attr for attr, json_name in model.attribute_map.items()}
    kwargs = {}
    for key, item in value.items():
        if key not in attribute_of:
            errors.append(f"{path}.{key}: not a field of {type_name}")
            continue
        attr = attribute_of[key]
        kwargs[attr] = _build_model(item, model.openapi_types[attr], f"{path}.{key}", errors)
    try:
        return model(**kwargs)  # the generated models refuse a missing required field
    except ValueError as exc:
        errors.append(f"{path}: {exc}")
        return _INVALID


def model_name(doc: dict) -> str:
    return doc["apiVersion"].split("/")[-1].capitalize() + doc["kind"]


@pytest.mark.parametrize(
    "values",
    [{}, {"nats.enabled": False, "nats.externalUrl": "nats://n:4222", "serviceAccount.create": False,
          "history.dsn": EXTERNAL_DSN, "postgresql.enabled": False}],
    ids=["defaults", "external-nats-own-account-own-history-db"],
)
def test_every_rendered_object_matches_the_kubernetes_api(tools: KubeTools, values: dict) -> None:
    docs = [d for d in render(tools, *set_args(**values)) if d["kind"] != "ServiceMonitor"]  # a CRD, not in the models
    errors = [e for d in docs for e in api_model_errors(d, model_name(d), f"{d['kind']}/{d['metadata']['name']}")]
    assert errors == []


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        ({"readinesProbe": {"httpGet": {"path": "/readyz", "port": "http"}}}, "readinesProbe: not a field"),
        ({"env": [{"name": "PAI_REST_PORT", "value": 9186}]}, "9186 is not a str"),
        ({"ports": [{"name": "http"}]}, "container_port"),
    ],
    ids=["misspelt-field", "unquoted-env-value", "missing-required-field"],
)
def test_api_check_catches_what_the_api_server_would_refuse(mistake: dict, expected: str) -> None:
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"selector": {"matchLabels": {"a": "b"}},
                    "template": {"spec": {"containers": [{"name": "c", "image": "i", **mistake}]}}}}  # fmt: skip
    assert any(expected in e for e in api_model_errors(bad, "V1Deployment", "Deployment/x"))


@contextlib.contextmanager
def kubernetes_api_emulator() -> Iterator[tuple[str, object]]:
    """A kmock Kubernetes API emulator serving the real API's resource discovery, in a thread."""
    import kmock

    class Emulator(kmock.KubernetesEmulator):
        # kmock 0.8 answers /api/v1 with groupVersion "/v1"; kubectl then finds no
        # core kinds at all. The real API server says "v1".
        async def _serve_version(self, request):
            payload = await super()._serve_version(request)
            return {**payload, "groupVersion": payload["groupVersion"].lstrip("/")}

    started, stop, box = threading.Event(), threading.Event(), {}

    async def serve() -> None:
        async with Emulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources.load_bundled()
            box.update(url=str(server.url).rstrip("/"), emulator=emulator)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name="kube-api-emulator", daemon=True)
    thread.start()
    try:
        if not started.wait(20):
            raise TimeoutError("the Kubernetes API emulator did not start")
        yield box["url"], box["emulator"]
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
def test_kubectl_creates_every_rendered_object_through_the_api(tools: KubeTools, tmp_path: Path) -> None:
    rendered = run_helm(tools, "template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert rendered.returncode == 0, rendered.stderr
    # kmock 0.8 cannot store a cluster-scoped object (the jobs Namespace: its create
    # fails inside the emulator); the schema tests check that one.
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] != "Namespace"]
    (tmp_path / "pai.yaml").write_text(yaml.safe_dump_all(docs))
    with kubernetes_api_emulator() as (url, emulator):
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "u", "namespace": NAMESPACE}}],
            "users": [{"name": "u", "user": {}}],
        }))  # fmt: skip
        kubectl = [str(tools.kubectl), "--kubeconfig", str(tmp_path / "kubeconfig")]
        # Without the API's OpenAPI document kubectl cannot validate fields itself;
        # the API-model check above does that. Here kubectl maps every kind to a
        # resource the API serves, with the right scope, and creates it.
        done = subprocess.run([*kubectl, "create", "--validate=false", "-f", str(tmp_path / "pai.yaml")],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        created = {(resource.plural, namespace, name) for resource, namespace, name in emulator.objects.keys()}
    plural = {"Deployment": "deployments", "StatefulSet": "statefulsets", "Service": "services",
              "ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts", "Role": "roles",
              "RoleBinding": "rolebindings", "Secret": "secrets", "Job": "jobs",
              "PodDisruptionBudget": "poddisruptionbudgets", "DaemonSet": "daemonsets",
              "NetworkPolicy": "networkpolicies"}  # fmt: skip
    assert created == {(plural[d["kind"]], d["metadata"].get("namespace", NAMESPACE), d["metadata"]["name"]) for d in docs}


# --- images ----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def final_stage() -> list[tuple[str, str]]:
    steps = dockerfile_instructions()
    return steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]


def test_one_dockerfile_serves_every_service() -> None:
    assert not list((REPO / "services").glob("*/Dockerfile"))
    stage = final_stage()
    assert stage[0][1].split()[0] == "python:3.11-slim"
    assert ("ARG", "SERVICE") in stage
    # An unknown SERVICE stops the build instead of making an image that cannot start.
    check = next(args for op, args in stage if op == "RUN" and "$SERVICE" in args)
    assert all(name in check for name in SERVICES)


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_dockerfile_runs_the_service_as_non_root_on_its_port(service: str) -> None:
    stage = dict(final_stage())
    env = dict(pair.split("=", 1) for pair in stage["ENV"].split())
    assert env["PAI_HOST"] == "0.0.0.0"
    assert env["PAI_SERVICE"] == "${SERVICE}"
    # The image runs `python -m services.<SERVICE>` ...
    command = json.loads(stage["CMD"])
    assert command[:2] == ["sh", "-c"]
    assert command[2].replace("$PAI_SERVICE", service) == f"exec python -m services.{service}"
    assert (REPO / "services" / service / "__main__.py").is_file()
    # ... and health-checks the port PAI's config gives that service.
    healthcheck = json.loads(stage["HEALTHCHECK"].split(" CMD ", 1)[1])
    probe = healthcheck[-1]
    assert "127.0.0.1:%d/healthz" in probe and "load_config().port_of(os.environ['PAI_SERVICE'])" in probe
    assert load_config(env={"PAI_SERVICE": service}).port_of(service) == DEFAULT_PORTS[service]
    user = stage["USER"].split(":")[0]
    assert user not in ("root", "0")


def test_dockerfile_copies_only_what_exists_and_installs_the_project() -> None:
    steps = dockerfile_instructions()
    for op, args in steps:
        if op == "COPY" and "--from" not in args:
            *sources, _ = shlex.split(args)
            assert all((REPO / s).exists() for s in sources), sources
    assert any(op == "RUN" and "pip install" in args and args.rstrip().endswith(".") for op, args in steps)


# --- docker compose --------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_names_nats_and_the_five_services(compose: dict) -> None:
    # init: the bus credentials and NATS's configuration; bootstrap: the store.
    assert set(compose["services"]) == {"init", "nats", "bootstrap", *SERVICES}


def test_compose_nats_runs_jetstream_on_a_volume(compose: dict, tmp_path: Path) -> None:
    from libs.common.natsserver import compose_init

    nats = compose["services"]["nats"]
    assert nats["command"] == ["-c", "/bus/nats-server.conf"]
    compose_init(tmp_path)  # what the init container writes into the bus volume
    conf = json.loads((tmp_path / "nats-server.conf").read_text())
    store = conf["jetstream"]["store_dir"]
    volumes = {v.split(":")[1]: v.split(":")[0] for v in nats["volumes"]}
    assert volumes[store] in compose["volumes"] and volumes["/bus"] in compose["volumes"]
    assert conf["authorization"]["users"], "NATS in compose must refuse anonymous clients"


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_compose_service_reaches_nats_and_publishes_its_port(compose: dict, service: str) -> None:
    spec = compose["services"][service]
    assert spec["build"] == {"context": ".", "args": {"SERVICE": service}}
    assert spec["depends_on"]["bootstrap"]["condition"] == "service_completed_successfully"
    # Logged in to NATS as itself, from the credentials init made.
    assert spec["command"] == ["python", "-m", "libs.common.natsserver", "run-as", service,
                               "/bus/nats-credentials.json", "--", "python", "-m", f"services.{service}"]  # fmt: skip
    config = load_config(env={k: str(v) for k, v in spec["environment"].items() if "${" not in str(v)})
    assert config.nats_url == "nats://nats:4222"
    assert config.host == "0.0.0.0"
    port = DEFAULT_PORTS[service]
    assert config.port_of(service) == port
    assert f"{port}:{port}" in spec["ports"]


# --- monitor: SMTP password and a single mailer -------------------------------------------


def test_the_monitor_mounts_the_smtp_password_secret_as_its_password_file(tools: KubeTools) -> None:
    docs = render(tools, *set_args(**{"smtp.existingSecret": "pai-smtp", "smtp.key": "pass", "config.smtp_user": "pai"}))
    monitor = deployment(docs, "monitor")
    spec = monitor["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "pai-smtp"]
    assert volume["secret"]["items"] == [{"key": "pass", "path": "password"}]
    [mount] = [m for m in container(monitor)["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    config = load_config(env=effective_env(docs, monitor))
    assert config.smtp_password_file == f"{mount['mountPath']}/password" and config.smtp_user == "pai"
    for service in ("rest", "scheduler", "launcher", "runtime"):  # the monitor alone mails
        other = deployment(docs, service)["spec"]["template"]["spec"]
        assert not any(v.get("secret", {}).get("secretName") == "pai-smtp" for v in other["volumes"]), service


def test_without_an_smtp_secret_the_monitor_mounts_none(manifests: list[dict]) -> None:
    monitor = deployment(manifests, "monitor")
    assert not [v for v in monitor["spec"]["template"]["spec"]["volumes"] if v["name"] == "smtp-password"]
    assert "PAI_SMTP_PASSWORD_FILE" not in explicit_env(monitor)


def test_the_cluster_monitor_is_one_replica_recreated_whatever_the_values_say(tools: KubeTools) -> None:
    # Two monitors at once would each evaluate the rules and mail every alert.
    monitor = deployment(render(tools, *set_args(**{"services.monitor.replicas": 3})), "monitor")
    assert monitor["spec"]["replicas"] == 1 and monitor["spec"]["strategy"]["type"] == "Recreate"


def test_the_agents_pod_monitor_keeps_the_node_label_the_agent_exports(tools: KubeTools) -> None:
    # The agent labels its series `node` itself (so `pai up` has it too); a Prometheus
    # that did not honour it would rename it exported_node beside its own `node`.
    [pod_monitor] = find(render(tools, *set_args(**{"metrics.serviceMonitor.enabled": True})), "PodMonitor")
    [endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]
