"""Mutable cluster state: VC quotas and bound cells, and every change to a leaf.

All changes to who holds a leaf go through `ClusterState`, which keeps the
counters, the per-unit `held` counts and the VC bindings consistent: a VC cell
(unit) is bound lazily when the VC's guaranteed work first needs it and given
back to the buddy free lists as soon as none of that work holds it any more.
"""

from __future__ import annotations

from services.scheduler.cluster.loader import shortfall
from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core.cells import FREE, INSIDE, TAKEN, Cell, CellTree, Chain, refresh_leaf
from services.scheduler.core.jobs import JobRecord


class Quota:
    """`total` cells of one type in one chain promised to a VC; `bound` are the physical cells taken so far."""

    __slots__ = ("chain", "type", "total", "bound", "leaf_count")

    def __init__(self, chain: Chain, type_name: str, total: int, leaf_count: int):
        self.chain = chain
        self.type = type_name
        self.total = total
        self.bound: dict[Cell, None] = {}
        self.leaf_count = leaf_count

    @property
    def unbound(self) -> int:
        return self.total - len(self.bound)


class VcRecord:
    __slots__ = ("name", "quotas", "pinned", "sku_quotas", "sku_guaranteed", "units")

    def __init__(self, name: str):
        self.name = name
        self.quotas: dict[tuple[str, str], Quota] = {}
        self.pinned: dict[str, Cell] = {}
        self.sku_quotas: dict[str, list[Quota]] = {}  # smallest cells first
        self.sku_guaranteed: dict[str, int] = {}  # leaf cells promised per sku
        self.units: dict[str, dict[Cell, None]] = {}  # sku -> bound (not pinned) cells

    @property
    def skus(self) -> list[str]:
        return list(self.sku_guaranteed)


def _holds(leaf: Cell) -> bool:
    """Whether a leaf keeps its unit bound: guaranteed work of the unit's VC runs or is reserved there."""
    unit = leaf.unit
    if unit is None:
        return False
    job = leaf.job
    if job is not None and not job.opportunistic and job.vc == unit.vc:
        return True
    job = leaf.reserved_for
    return job is not None and not job.opportunistic and job.vc == unit.vc


class ClusterState:
    def __init__(self, config: ClusterConfig):
        self.config = config
        self.tree = CellTree(config)
        self.vcs: dict[str, VcRecord] = {}
        for vc_spec in config.virtualClusters.values():
            vc = self.vcs[vc_spec.name] = VcRecord(vc_spec.name)
            for virtual in vc_spec.virtualCells:
                if virtual.cellNumber == 0:
                    continue
                key = (virtual.chain, virtual.cellType)
                quota = vc.quotas.get(key)
                if quota is None:
                    cell_type = config.cellTypes[virtual.cellType]
                    quota = vc.quotas[key] = Quota(self.tree.chains[virtual.chain], virtual.cellType, 0,
                                                   cell_type.leafCellNumber)
                quota.total += virtual.cellNumber
            for quota in sorted(vc.quotas.values(), key=lambda q: (q.leaf_count, q.chain.name)):
                sku = quota.chain.sku
                vc.sku_quotas.setdefault(sku, []).append(quota)
                vc.sku_guaranteed[sku] = vc.sku_guaranteed.get(sku, 0) + quota.total * quota.leaf_count
                vc.units.setdefault(sku, {})
            for pin in vc_spec.pinnedCells:
                cell = self.tree.pinned[pin]
                vc.pinned[pin] = cell
                self.tree.chains[cell.chain].take(cell)
                self._mark_bound(cell, vc.name, None)
                vc.sku_guaranteed[cell.sku] = vc.sku_guaranteed.get(cell.sku, 0) + cell.leaf_count
        self.affected_skus: set[str] = set()  # skus whose cells changed since the last scheduling pass

    # --- binding ------------------------------------------------------------------------

    def _mark_bound(self, cell: Cell, vc: str, quota_key: tuple[str, str] | None) -> None:
        cell.vc = vc
        cell.quota_key = quota_key
        cell.held = 0
        for leaf in cell.leaves:
            leaf.unit = cell
            if _holds(leaf):
                cell.held += 1

    def bind(self, vc: VcRecord, quota: Quota, cell: Cell, *, taken: bool = False) -> None:
        """Bind a free (or already taken by a tentative plan) cell to the VC's quota."""
        assert quota.unbound > 0, f"VC {vc.name} has no unbound {quota.type} cell left"
        if not taken:
            quota.chain.take(cell)
        quota.bound[cell] = None
        vc.units[quota.chain.sku][cell] = None
        self._mark_bound(cell, vc.name, (quota.chain.name, quota.type))

    def unbind_if_idle(self, unit: Cell | None) -> None:
        if unit is None or unit.held > 0 or unit.quota_key is None or unit.buddy != TAKEN:
            return
        vc = self.vcs[unit.vc]
        quota = vc.quotas[unit.quota_key]
        del quota.bound[unit]
        del vc.units[unit.sku][unit]
        for leaf in unit.leaves:
            leaf.unit = None
        unit.vc = None
        unit.quota_key = None
        quota.chain.give_back(unit)
        self.affected_skus.add(unit.sku)

    def bindable_cell_for(self, cell: Cell) -> bool:
        """Whether buddy allocation could take exactly this cell now."""
        current: Cell | None = cell
        while current is not None:
            if current.buddy == FREE:
                return True
            if current.buddy != INSIDE:
                return False
            current = current.parent
        return False

    def chain_is_safe(self, chain: Chain) -> bool:
        """Whether every VC's unbound quota in the chain can still be carved out of its free cells."""
        free = {t: len(cells) for t, cells in chain.free.items()}
        demand: dict[str, int] = {}
        for vc in self.vcs.values():
            for (chain_name, type_name), quota in vc.quotas.items():
                if chain_name == chain.name:
                    demand[type_name] = demand.get(type_name, 0) + quota.unbound
        from collections import Counter

        return shortfall(chain.name, self.config.cellTypes, Counter(free), Counter(demand)) is None

    # --- leaves ---------------------------------------------------------------------------

    def set_leaf(self, leaf: Cell, *, job: JobRecord | None, reserved_for: JobRecord | None) -> None:
        unit = leaf.unit
        before = _holds(leaf)
        leaf.job = job
        leaf.reserved_for = reserved_for
        if unit is not None:
            unit.held += _holds(leaf) - before
        refresh_leaf(leaf)
        self.affected_skus.add(leaf.sku)

    def refresh_job_leaves(self, job: JobRecord, change) -> None:
        """Apply `change()` (a change to the job's standing) and fix the counters of its leaves."""
        leaves = job.leaves() + [leaf for _, _, plan in job.reserved for leaves in plan for leaf in leaves]
        before = [_holds(leaf) for leaf in leaves]
        change()
        units = []
        for leaf, held in zip(leaves, before):
            if leaf.unit is not None:
                leaf.unit.held += _holds(leaf) - held
                units.append(leaf.unit)
            refresh_leaf(leaf)
            self.affected_skus.add(leaf.sku)
        for unit in dict.fromkeys(units):
            self.unbind_if_idle(unit)
