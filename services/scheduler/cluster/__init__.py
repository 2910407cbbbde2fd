"""The cluster layout: HiveD-format config model, loading and validation (pure, no I/O but reading the file).

The loader (and YAML with it) is imported on first use of `load_cluster_config` or
`local_cluster_config`, so the scheduler core can use the model without it.
"""

from services.scheduler.cluster.model import (
    CellType,
    ClusterConfig,
    ClusterConfigError,
    PhysicalCell,
    SkuType,
    VirtualCell,
    VirtualCluster,
)

_LOADER_NAMES = ("load_cluster_config", "local_cluster_config")


def __getattr__(name: str):
    if name in _LOADER_NAMES:
        from services.scheduler.cluster import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CellType",
    "ClusterConfig",
    "ClusterConfigError",
    "PhysicalCell",
    "SkuType",
    "VirtualCell",
    "VirtualCluster",
    "load_cluster_config",
    "local_cluster_config",
]
