"""Ports per node: which are taken, and the deterministic choice of free ones.

A task keeps its ports for as long as its attempt is not over (also across a
retry of the task alone, so its peers' PAI_PORT_LIST stays true). The book is
derived from job records, so it is rebuilt exactly after a restart.

Ports in use by something the book does not know of (a task that bound a port
it was not given, any other program of the node) are found by the shell, which
tries each port of a launch before it starts the task (the local backend's
`ports_in_use`) and, when one is taken, holds back the attempt's starts and
reports it (events.PortsBusy): the book then skips that port for
BUSY_PORT_SECONDS and the core gives those tasks other ports. Pure: the shell
looks, the core picks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from libs.common.records import JobRecord

NodePorts = dict[str, set[int]]
# How long a port found in use is skipped (its user may have let it go since;
# if not, the shell finds it busy again).
BUSY_PORT_SECONDS = 600.0
# Ports found in use remembered per node, at most (the oldest forgotten first).
MAX_BUSY_PORTS_PER_NODE = 4096


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
        # node -> port found in use by something else -> until when it is skipped
        self._busy: dict[str, dict[int, float]] = {}

    def mark_busy(self, node: str, ports: Iterable[int], *, until: float) -> None:
        """Skip `ports` on `node` until `until`: the shell found them in use."""
        busy = self._busy.setdefault(node, {})
        for port in ports:
            busy.pop(port, None)  # (re-inserted: the newest last)
            busy[port] = until
        while len(busy) > MAX_BUSY_PORTS_PER_NODE:
            del busy[next(iter(busy))]

    def busy(self, node: str, *, now: float) -> set[int]:
        """Ports of `node` found in use and still skipped at `now`."""
        busy = self._busy.get(node)
        if not busy:
            return set()
        for port in [port for port, until in busy.items() if until <= now]:
            del busy[port]
        return set(busy)

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
        self, node: str, wanted: Mapping[str, int], also_taken: Iterable[int] = (), *, now: float = 0.0
    ) -> dict[str, list[int]] | None:
        """The lowest free ports on `node` for each label (in `wanted`'s order),
        past those found in use (`mark_busy`, still skipped at `now`); None if the range is full."""
        taken = set(self._by_node.get(node, {})) | set(also_taken)
        if self._busy:
            taken |= self.busy(node, now=now)
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
