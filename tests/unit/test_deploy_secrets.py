"""The chart gives the key that opens job secrets to the launcher alone, and
the key that seals them to rest."""

from __future__ import annotations

from tests.unit.test_deploy import RELEASE, container, deployment, explicit_env, manifests, render, set_args, tools  # noqa: F401 - fixtures


def key_volume(doc: dict) -> dict | None:
    volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
    return volumes.get("job-secrets-key")


def test_rest_mounts_the_public_key_and_the_launcher_the_private_key(manifests: list[dict]) -> None:
    expected = {"rest": ("secrets.pub", "PAI_SECRETS_PUBLIC_KEY_FILE"),
                "launcher": ("secrets.key", "PAI_SECRETS_PRIVATE_KEY_FILE")}
    for service, (item, variable) in expected.items():
        doc = deployment(manifests, service)
        volume = key_volume(doc)
        assert volume is not None
        assert volume["secret"]["secretName"] == f"{RELEASE}-job-secrets-key"
        assert volume["secret"]["items"] == [{"key": item, "path": item}]  # only its own half
        assert volume["secret"]["defaultMode"] == 0o400
        mounts = {m["name"]: m for m in container(doc)["volumeMounts"]}
        assert mounts["job-secrets-key"]["readOnly"] is True
        assert explicit_env(doc)[variable] == f"{mounts['job-secrets-key']['mountPath']}/{item}"
    for service in ("scheduler", "runtime", "monitor"):
        doc = deployment(manifests, service)
        assert key_volume(doc) is None
        assert not {"PAI_SECRETS_PUBLIC_KEY_FILE", "PAI_SECRETS_PRIVATE_KEY_FILE"} & set(explicit_env(doc))


def test_the_key_secret_can_be_named(tools) -> None:
    docs = render(tools, *set_args(**{"jobSecrets.existingSecret": "my-keys"}))
    assert key_volume(deployment(docs, "launcher"))["secret"]["secretName"] == "my-keys"
