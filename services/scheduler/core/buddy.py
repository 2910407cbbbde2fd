"""Buddy arithmetic on cell counts, shared by the core and the config loader (which imports it from here)."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter

from services.scheduler.cluster.model import CellType


def shortfall(chain: str, cell_types: dict[str, CellType], free: Counter[str], demand: Counter[str]) -> tuple[int, str] | None:
    """(missing cells, of type) when the demand cannot be carved out of the free cells.

    Buddy allocation takes a free cell of the asked type first and splits the
    smallest bigger one only when there is none, so demand at each level is met
    by free cells of that level, then by splitting cells one level up.
    """
    levels = []
    current: str | None = chain
    while current is not None:
        levels.append(current)
        current = cell_types[current].childCellType
    carry = 0
    for position in range(len(levels) - 1, -1, -1):
        type_name = levels[position]
        missing = max(0, demand[type_name] + carry - free[type_name])
        if position == 0:
            return (missing, type_name) if missing else None
        carry = math.ceil(missing / cell_types[levels[position - 1]].childCellNumber)
    return None


def host_ip(node: str) -> str:
    """The address tasks use to reach a node: the node name when it is an IP, else loopback."""
    try:
        ipaddress.ip_address(node)
    except ValueError:
        return "127.0.0.1"
    return node
