"""The metrics every PAI service's shell exports (libs/common/service.py), beside
the service's own metrics.py: which build runs, and which replica leads.

- `pai_build_info{service,version,commit} 1`: the package version, and the commit
  from `PAI_BUILD_COMMIT` (the images' build argument) or, run from a checkout,
  the checkout's HEAD; "unknown" when neither says.
- `pai_leader{service}`: 1 while this replica of a single-active service
  (scheduler, launcher) holds the leader lease, 0 while it stands by; `sum by
  (service) (pai_leader)` is 1 in a healthy install, and which pod has the 1 is who
  leads.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from prometheus_client import Gauge

REPO = Path(__file__).resolve().parents[2]
UNKNOWN = "unknown"

build_info = Gauge("pai_build_info", "1, labelled with the PAI version and commit this process runs.",
                   ["service", "version", "commit"])
leader = Gauge("pai_leader", "1 while this replica of a single-active service holds the leader lease, 0 while it "
                             "stands by.", ["service"])


def version() -> str:
    try:
        return importlib.metadata.version("pai")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def commit(repo: Path = REPO) -> str:
    return os.environ.get("PAI_BUILD_COMMIT", "").strip() or checkout_commit(repo) or UNKNOWN


def checkout_commit(repo: Path) -> str:
    """HEAD of the git checkout at `repo`, read from its files (no git needed); "" if none."""
    git = repo / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: <path>"
            git = (repo / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(":", 1)[1].strip()
        for root in (git, _common_dir(git)):
            if (root / ref).is_file():
                return (root / ref).read_text().strip()
            packed = root / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split(" ", 1)[0]
    except (OSError, IndexError):
        pass
    return ""


def _common_dir(git: Path) -> Path:
    common = git / "commondir"
    return (git / common.read_text().strip()).resolve() if common.is_file() else git


def record_build(service: str) -> None:
    build_info.labels(service, version(), commit()).set(1)
