"""Will the chart install and upgrade to the end, and is every manifest one Kubernetes takes?

- `helm install --wait` walked over the rendered objects with Helm's order: the
  pre-install hooks by weight, each Job waited for; then every resource at once;
  then `--wait` until each workload is ready; then the post-install hooks. What
  each object needs before it can run or be ready is read from the objects
  (Secrets, ConfigMaps, service accounts it names; NATS, the store and the
  database for a PAI service) and what each provides once it is (a hook Job's
  Secrets, NATS, the store). A readiness that needs something only a later phase
  provides never comes: the walk says which. Argo CD and Flux run Helm's hooks as
  the same phases (PreSync, Sync, PostSync).
- Every rendered object against Kubernetes' own published schemas
  (kubernetes-validate, strict: an unknown field is an error).
- `helm template` renders the same twice (no random value, no lookup): Argo CD and
  Flux see no drift at every render.
- The values schema rejects a key it does not know, at every level.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.tools_helm import KubeTools, ToolsUnavailable, kube_tools
from tests.unit.test_deploy import CHART, NAMESPACE, RELEASE, render, run_helm, set_args

K8S_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def kube() -> KubeTools:
    try:
        return kube_tools()
    except ToolsUnavailable as exc:
        pytest.skip(f"helm not available: {exc}")


_RENDERED: dict[tuple[str, ...], list[dict]] = {}


def rendered(kube: KubeTools, *args: str) -> list[dict]:
    """`helm template` with these arguments, once per module run (a copy: tests change them)."""
    if args not in _RENDERED:
        _RENDERED[args] = render(kube, *args)
    return copy.deepcopy(_RENDERED[args])
PRODUCTION = ("-f", str(CHART / "values-production.yaml"))
TLS = (*set_args(**{"nats.tls.enabled": True, "nats.tls.secretName": "pai-nats-tls"}),)
VALUE_SETS = {
    "defaults": (),
    "production": PRODUCTION,
    "tls-metrics": (*TLS, *set_args(**{"metrics.serviceMonitor.enabled": True,
                                       "networkPolicy.metricsFrom": [{"namespaceSelector": {}}]})),
    "own-secrets": set_args(**{"nats.existingSecret": "bus", "jobSecrets.existingSecret": "keys",
                               "admin.existingSecret": "admin", "postgresql.existingSecret": "pg"}),
    "external-nats-one-server": set_args(**{"nats.enabled": False, "nats.externalUrl": "nats://nats.example:4222",
                                            "history.dsn": "postgresql+asyncpg://u:p@db:5432/pai",
                                            "postgresql.enabled": False}),
}


# --- helm install --wait, walked ------------------------------------------------------------


HOOK_PHASES = {"install": ("pre-install", "post-install"), "upgrade": ("pre-upgrade", "post-upgrade")}
# Helm's order of kinds (its InstallOrder), which breaks ties between hooks of one weight.
KIND_ORDER = ["Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodDisruptionBudget", "ServiceAccount",
              "Secret", "ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
              "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
              "DaemonSet", "Pod", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob"]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")


def hooks_of(doc: dict) -> set[str]:
    value = (doc["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
    return {h.strip() for h in value.split(",") if h.strip()}


def weight(doc: dict) -> int:
    return int((doc["metadata"].get("annotations") or {}).get("helm.sh/hook-weight", "0"))


def pod_spec(doc: dict) -> dict | None:
    if doc["kind"] in (*WORKLOADS, "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


@dataclass
class Node:
    """One object as the walk sees it: what it needs to run or be ready, what it gives."""

    doc: dict
    needs: set[str] = field(default_factory=set)
    provides: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{self.doc['kind']}/{self.doc['metadata']['name']}"


def node_of(doc: dict, docs: list[dict]) -> Node:
    node = Node(doc)
    kind, name = doc["kind"], doc["metadata"]["name"]
    node.provides.add(f"{kind}/{name}")  # an object exists once created
    spec = pod_spec(doc)
    if spec is None:
        return node
    # A pod starts only once what it mounts or reads exists (none is optional here).
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            node.needs.add(f"Secret/{volume['secret']['secretName']}")
        if "configMap" in volume:
            node.needs.add(f"ConfigMap/{volume['configMap']['name']}")
    account = spec.get("serviceAccountName")
    if account:
        node.needs.add(f"ServiceAccount/{account}")
    for c in containers(spec):
        for source in c.get("envFrom", []):
            if "configMapRef" in source:
                node.needs.add(f"ConfigMap/{source['configMapRef']['name']}")
            if "secretRef" in source:
                node.needs.add(f"Secret/{source['secretRef']['name']}")
        for entry in c.get("env", []):
            ref = entry.get("valueFrom", {})
            if "secretKeyRef" in ref:
                node.needs.add(f"Secret/{ref['secretKeyRef']['name']}")
            if "configMapKeyRef" in ref:
                node.needs.add(f"ConfigMap/{ref['configMapKeyRef']['name']}")
        command = c.get("command") or []
        env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
        bundled_nats = any(d["kind"] == "StatefulSet" and d["metadata"]["name"] == f"{RELEASE}-nats" for d in docs)
        if "PAI_NATS_URL" in env and bundled_nats:
            node.needs.add("nats")  # it connects to NATS before anything else
        if command[:3] == ["python", "-m", "libs.common.busauth"] and command[3:4] == ["bootstrap"]:
            node.provides.add("store")  # the event stream and the buckets
        elif command[:3] == ["python", "-m", "libs.common.release_secrets"]:
            node.provides |= {f"Secret/{spec_.split('/')[0]}" for spec_ in command[4:]}
        elif command[:2] == ["python", "-m"] and command[2].startswith("services."):
            node.needs.add("store")  # a service waits for the store at start (Bus.bootstrap), not ready before
            if "PAI_HISTORY_DSN" in {e["name"] for e in c.get("env", [])} and any(
                    d["kind"] == "StatefulSet" and d["metadata"]["name"] == f"{RELEASE}-postgresql" for d in docs):
                node.needs.add("postgresql")  # rest migrates the history database before it serves
    if kind == "StatefulSet" and name == f"{RELEASE}-nats":
        node.provides.add("nats")
    if kind == "StatefulSet" and name == f"{RELEASE}-postgresql":
        node.provides.add("postgresql")
    return node


def walk_install(docs: list[dict], *, action: str = "install", existing: frozenset[str] = frozenset()) -> list[str]:
    """Helm's `install --wait` (or `upgrade --wait`) over the rendered objects, in its order.
    Returns the phases as they went; raises AssertionError naming what never becomes ready."""
    pre, post = HOOK_PHASES[action]
    have: set[str] = set(existing)
    log: list[str] = []
    nodes = [node_of(d, docs) for d in docs]

    def run_hooks(phase: str) -> None:
        hooks = sorted((n for n in nodes if phase in hooks_of(n.doc)),
                       key=lambda n: (weight(n.doc), KIND_ORDER.index(n.doc["kind"]), n.doc["metadata"]["name"]))
        for hook in hooks:
            missing = hook.needs - have
            if hook.doc["kind"] == "Job" and missing:
                raise AssertionError(f"{phase} hook {hook.name} waits for {sorted(missing)}, which no earlier step makes")
            have.update(hook.provides)  # created; a Job waited for until it completed
            log.append(f"{phase}: {hook.name}")

    run_hooks(pre)
    resources = [n for n in nodes if not hooks_of(n.doc)]
    for n in resources:  # every resource is created at once
        have.add(n.name)
    log.append(f"created {len(resources)} resources")
    # --wait: whatever can become ready does, until nothing changes; Jobs run meanwhile.
    pending = [n for n in resources if n.doc["kind"] in (*WORKLOADS, "Job")]
    progress = True
    while progress:
        progress = False
        for n in list(pending):
            if n.needs <= have:
                have.update(n.provides)
                pending.remove(n)
                progress = True
    waited = [n for n in pending if n.doc["kind"] in WORKLOADS]
    if waited:
        raise AssertionError("--wait never ends: " + "; ".join(
            f"{n.name} waits for {sorted(n.needs - have)}" for n in waited))
    log.append("--wait: every workload ready")
    run_hooks(post)
    return log


@pytest.mark.parametrize("values", list(VALUE_SETS), ids=list(VALUE_SETS))
@pytest.mark.parametrize("action", ["install", "upgrade"])
def test_helm_install_and_upgrade_with_wait_reach_the_end(kube: KubeTools, values: str, action: str) -> None:
    docs = rendered(kube, *VALUE_SETS[values])
    # What the operator made beforehand: the Secrets the values name as existing.
    given = {"Secret/bus", "Secret/keys", "Secret/admin", "Secret/pg", "Secret/pai-nats-tls", "Secret/pai-history"}
    log = walk_install(docs, action=action, existing=frozenset(given))
    assert log[-1] == "--wait: every workload ready" or log[-1].startswith(HOOK_PHASES[action][1])


def test_the_walk_fails_a_readiness_that_waits_on_a_later_hook(kube: KubeTools) -> None:
    # The chart before: the store made by a post-install hook, which Helm runs only
    # once every workload is ready, while the services wait for the store.
    docs = rendered(kube)
    (bootstrap,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].startswith(f"{RELEASE}-bootstrap")]
    bootstrap["metadata"]["annotations"] = {"helm.sh/hook": "post-install,post-upgrade"}
    with pytest.raises(AssertionError, match=r"--wait never ends: .*Deployment/pai-rest waits for \['store'\]"):
        walk_install(docs)


def test_the_walk_fails_a_hook_that_needs_a_resource_installed_after_it(kube: KubeTools) -> None:
    # A pre-install hook that needs NATS, which is an ordinary resource created after the hooks.
    docs = rendered(kube)
    (bootstrap,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].startswith(f"{RELEASE}-bootstrap")]
    bootstrap["metadata"]["annotations"] = {"helm.sh/hook": "pre-install"}
    with pytest.raises(AssertionError, match=r"pre-install hook Job/pai-bootstrap-\w+ waits for \[.*'nats'\]"):
        walk_install(docs)


def test_the_release_secrets_hook_runs_first_and_needs_nothing_of_the_release(kube: KubeTools) -> None:
    log = walk_install(rendered(kube))
    assert log[:4] == ["pre-install: ServiceAccount/pai-release-secrets", "pre-install: Role/pai-release-secrets",
                       "pre-install: RoleBinding/pai-release-secrets", "pre-install: Job/pai-release-secrets"]


def test_without_the_hook_the_secrets_would_be_missing(kube: KubeTools) -> None:
    docs = [d for d in rendered(kube) if not hooks_of(d)]
    with pytest.raises(AssertionError, match="Secret/pai-bus-credentials"):
        walk_install(docs)


def test_a_changed_store_setting_makes_a_new_bootstrap_job_and_an_unchanged_one_keeps_it(kube: KubeTools) -> None:
    # A Job's pod template cannot be changed: an upgrade must not patch the old one.
    def bootstrap_name(*args: str) -> str:
        (job,) = [d for d in rendered(kube, *args) if d["kind"] == "Job" and "bootstrap" in d["metadata"]["name"]]
        return job["metadata"]["name"]

    assert bootstrap_name() == bootstrap_name()
    assert bootstrap_name() != bootstrap_name(*set_args(**{"config.nats_events_max_bytes": 1 << 30}))
    assert bootstrap_name() == bootstrap_name(*set_args(**{"services.rest.replicas": 5}))


# --- Kubernetes' schemas --------------------------------------------------------------------


CRDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


# Every template and every optional block: TLS, metrics, the policies; no NATS and no database.
@pytest.mark.parametrize("values", ["defaults", "tls-metrics", "external-nats-one-server"])
def test_every_rendered_object_is_valid_against_kubernetes_schemas(kube: KubeTools, values: str) -> None:
    errors = []
    for doc in rendered(kube, *VALUE_SETS[values]):
        if doc["kind"] in CRDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert errors == []


def test_pods_of_the_chart_run_least_privileged(kube: KubeTools) -> None:
    docs = rendered(kube)
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert not spec.get("hostNetwork"), where
        for c in containers(spec):
            context = c["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, (where, c["name"])
            assert context["capabilities"] == {"drop": ["ALL"]}, (where, c["name"])
    # The node agent sees the host's pids (NVML's) but reads no environment and holds no capability.
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    env = {e["name"]: e.get("value") for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PAI_MONITOR_READ_TASK_ENVIRON"] == "false"


def test_every_image_is_pinned(kube: KubeTools) -> None:
    for doc in rendered(kube, *TLS):
        spec = pod_spec(doc)
        for c in containers(spec) if spec else []:
            repository, _, tag = c["image"].rpartition(":")
            assert repository and tag and tag not in ("latest", "alpine") and any(ch.isdigit() for ch in tag), c["image"]
            assert tag.count(".") >= 2 or tag.split("-")[0].count(".") >= 1, f"{c['image']}: a moving tag"
            if "nats" in repository:
                assert tag.split("-")[0].count(".") == 2, f"{c['image']}: NATS pinned by its full version"


# --- the same render every time -----------------------------------------------------------


@pytest.mark.parametrize("values", ["defaults", "production", "tls-metrics"])
def test_helm_template_renders_the_same_twice(kube: KubeTools, values: str) -> None:
    args = ("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *VALUE_SETS[values])
    first, second = run_helm(kube, *args), run_helm(kube, *args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert "randAlphaNum" not in "".join(p.read_text() for p in (CHART / "templates").glob("*"))
    assert "lookup" not in "".join(p.read_text() for p in CHART.glob("**/templates/*"))


# --- the values schema ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "key", "where"),
    [("lint", "replica", "/services/rest"), ("template", "tlss", "/nats"), ("lint", "namespaces", "/jobs"),
     ("template", "serviceMonitr", "/metrics"), ("template", "enabeld", "")],
    ids=["service-lint", "nats-template", "jobs-lint", "metrics-template", "top-template"],
)
def test_helm_refuses_a_misspelt_value_naming_where(kube: KubeTools, key: str, where: str, command: str) -> None:
    path = ".".join(p for p in [*where.strip("/").split("/"), key] if p)
    args = ["lint", str(CHART)] if command == "lint" else ["template", RELEASE, str(CHART)]
    done = run_helm(kube, *args, "--set", f"{path}=1")
    assert done.returncode != 0
    assert f"additional properties '{key}' not allowed" in done.stdout + done.stderr
    assert f"at '{where}'" in done.stdout + done.stderr


def closed_paths(values: dict, schema: dict) -> list[tuple[str, ...]]:
    """Every mapping of values.yaml the schema knows field by field (not a free-form map)."""
    resolver_root = schema

    def resolve(node: dict) -> dict:
        ref = node.get("$ref")
        return resolve(resolver_root["definitions"][ref.rsplit("/", 1)[-1]]) if ref else node

    out: list[tuple[str, ...]] = []

    def visit(value: object, node: dict, path: tuple[str, ...]) -> None:
        node = resolve(node)
        if isinstance(value, dict) and "properties" in node:
            out.append(path)
            for key, item in value.items():
                visit(item, node["properties"].get(key, {}), (*path, key))

    visit(values, schema, ())
    return out


def test_the_schema_refuses_an_unknown_key_at_every_level_of_the_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    validator.validate(values)  # closed everywhere: every key values.yaml sets is described
    paths = closed_paths(values, schema)
    assert len(paths) > 25  # every block, the services' and NATS's nested ones
    for path in paths:
        changed = copy.deepcopy(values)
        target = changed
        for key in path:
            target = target[key]
        target["typoKey"] = 1
        errors = list(validator.iter_errors(changed))
        assert [e.message for e in errors] == ["Additional properties are not allowed ('typoKey' was unexpected)"], path


def test_every_chart_version_has_an_upgrade_note() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    notes = (CHART / "UPGRADING.md").read_text()
    assert f"\n## {chart['version']} " in notes or f"\n## {chart['version']}\n" in notes
