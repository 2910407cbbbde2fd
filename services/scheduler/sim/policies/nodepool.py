"""Plain GPU counting on nodes, for the policy models that have no cells.

A task needs its GPUs on one node; a gang starts only when every task has a node.
Placement is best fit (the node with the fewest free GPUs that is still enough,
lowest node first on ties), which consolidates jobs the way simple cluster
schedulers do.
"""

from __future__ import annotations

from bisect import insort


class NodePool:
    def __init__(self, node_gpus: list[int]):
        self.capacity = list(node_gpus)
        self.free = list(node_gpus)
        self.free_total = sum(node_gpus)
        self.total = self.free_total
        self._largest = max(node_gpus, default=0)
        # free GPU count -> nodes with exactly that many free, in node order
        self._by_free: list[list[int]] = [[] for _ in range(self._largest + 1)]
        for node, gpus in enumerate(node_gpus):
            self._by_free[gpus].append(node)

    def could_ever_fit(self, tasks: int, per_task: int) -> bool:
        """Whether the empty pool could hold this gang."""
        if per_task == 0:
            return True
        return sum(capacity // per_task for capacity in self.capacity) >= tasks

    def place(self, tasks: int, per_task: int) -> list[int] | None:
        """A node per task (taken), or None with nothing taken."""
        if tasks * per_task > self.free_total or not self._has_node_with(per_task):
            return None
        chosen: list[int] = []
        for _ in range(tasks):
            node = self._best_fit(per_task)
            if node is None:
                self.release(chosen, per_task)
                return None
            self._move(node, -per_task)
            chosen.append(node)
        return chosen

    def release(self, nodes: list[int], per_task: int) -> None:
        for node in nodes:
            self._move(node, per_task)

    def _has_node_with(self, gpus: int) -> bool:
        by_free = self._by_free
        return any(by_free[amount] for amount in range(gpus, self._largest + 1))

    def _best_fit(self, gpus: int) -> int | None:
        by_free = self._by_free
        for amount in range(gpus, self._largest + 1):
            if by_free[amount]:
                return by_free[amount][0]
        return None

    def _move(self, node: int, delta: int) -> None:
        before = self.free[node]
        self._by_free[before].remove(node)
        self.free[node] = before + delta
        insort(self._by_free[before + delta], node)
        self.free_total += delta
