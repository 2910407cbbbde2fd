"""Ports per node: which are taken, and the deterministic choice of free ones.

A task keeps its ports for as long as its attempt is not over (also across a
retry of the task alone, so its peers' PAI_PORT_LIST stays true). The book is
derived from job records, so it is rebuilt exactly after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from libs.common.records import JobRecord

NodePorts = dict[str, set[int]]


def ports_held(record: JobRecord) -> NodePorts:
    """node -> ports that the job's current attempt holds."""
    held: NodePorts = {}
    if not record.attempts:
        return held
    attempt = record.current
    # Most jobs ask for no port: that is answered first (this runs at every change of a record).
    if not any(task.ports for task in attempt.tasks) or record.state.is_final or attempt.ended:
        return held
    for task in attempt.tasks:
        if task.node is None:
            continue
        for ports in task.ports.values():
            held.setdefault(task.node, set()).update(ports)
    return held


class PortBook:
    def __init__(self, port_range: tuple[int, int]):
        low, high = port_range
        if not 0 < low < high <= 65536:
            raise ValueError(f"port range {port_range} must satisfy 0 < low < high <= 65536")
        self.low, self.high = low, high
        self._by_job: dict[str, NodePorts] = {}
        # node -> port -> job holding it
        self._by_node: dict[str, dict[int, str]] = {}

    def update(self, record: JobRecord) -> None:
        """Take the job's current holdings into account (replaces its previous ones)."""
        new = ports_held(record)
        if new == self._by_job.get(record.job, {}):
            return
        self.remove(record.job)
        for node, ports in new.items():
            taken = self._by_node.setdefault(node, {})
            for port in ports:
                taken.setdefault(port, record.job)
        if new:
            self._by_job[record.job] = new

    def remove(self, job: str) -> None:
        for node, ports in self._by_job.pop(job, {}).items():
            taken = self._by_node.get(node, {})
            for port in ports:
                if taken.get(port) == job:
                    del taken[port]

    def allocate(
        self, node: str, wanted: Mapping[str, int], also_taken: Iterable[int] = ()
    ) -> dict[str, list[int]] | None:
        """The lowest free ports on `node` for each label (in `wanted`'s order); None if the range is full."""
        taken = set(self._by_node.get(node, {})) | set(also_taken)
        result: dict[str, list[int]] = {}
        port = self.low
        for label, count in wanted.items():
            chosen: list[int] = []
            while len(chosen) < count:
                if port >= self.high:
                    return None
                if port not in taken:
                    chosen.append(port)
                port += 1
            result[label] = chosen
        return result
