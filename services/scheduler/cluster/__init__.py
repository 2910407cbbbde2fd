"""The cluster layout: HiveD-format config model, loading and validation (pure, no I/O but reading the file)."""

from services.scheduler.cluster.loader import load_cluster_config, local_cluster_config
from services.scheduler.cluster.model import (
    CellType,
    ClusterConfig,
    ClusterConfigError,
    PhysicalCell,
    SkuType,
    VirtualCell,
    VirtualCluster,
)

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
