"""The validated cluster layout the scheduler works on (HiveD's config, inferred).

Everything here is already checked and completed by `load_cluster_config`: leaf
cell types appear in `cellTypes` too (level 1), every physical cell lists all of
its children, every cell has an address, node-level cells name their node.
"""

from __future__ import annotations

import msgspec


class ClusterConfigError(ValueError):
    """A cluster config that cannot be used; each entry names the path and the problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("invalid cluster config:\n" + "\n".join(f"  - {e}" for e in self.errors))


class SkuType(msgspec.Struct, frozen=True, kw_only=True):
    """What one leaf cell of this sku offers. 0 in a dimension means "not accounted"."""

    name: str
    gpu: int = 1
    cpu: int = 0
    memoryMB: int = 0


class CellType(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    # None for a leaf cell type (a sku): one device.
    childCellType: str | None = None
    childCellNumber: int = 0
    isNodeLevel: bool = False
    level: int = 1  # leaf = 1, its parent = 2, ...
    leafCellNumber: int = 1
    skuType: str = ""

    @property
    def is_leaf(self) -> bool:
        return self.childCellType is None


class PhysicalCell(msgspec.Struct, frozen=True, kw_only=True):
    cellType: str
    # Unique in the cluster. Leaves: "<node>/<gpu index>", node-level cells: the
    # node name (plus "[<sku>]" when one node holds several skus), others a path.
    address: str
    node: str | None = None  # set for node-level cells and below
    index: int | None = None  # leaf cells: the device index on the node
    pinnedCellId: str | None = None
    children: list[PhysicalCell] = []


class VirtualCell(msgspec.Struct, frozen=True, kw_only=True):
    """`cellNumber` cells of type `cellType` taken from the chain whose top is `chain`."""

    chain: str
    cellType: str
    cellNumber: int


class VirtualCluster(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    virtualCells: list[VirtualCell] = []
    pinnedCells: list[str] = []


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True):
    skuTypes: dict[str, SkuType]
    cellTypes: dict[str, CellType]
    physicalCells: list[PhysicalCell]
    virtualClusters: dict[str, VirtualCluster]

    def node_names(self) -> list[str]:
        """Every node, in config order, once."""
        seen: dict[str, None] = {}

        def visit(cell: PhysicalCell) -> None:
            if cell.node is not None:
                seen.setdefault(cell.node, None)
                return
            for child in cell.children:
                visit(child)

        for top in self.physicalCells:
            visit(top)
        return list(seen)
