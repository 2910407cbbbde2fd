"""Kubernetes-style memory quantities ("8192Mi", "16Gi", "500M") as whole MiB."""

from __future__ import annotations

import re

_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?|[kmgtp])?\s*$")
_BYTES_PER_UNIT = {
    "K": 1000, "k": 1000, "Ki": 1024,
    "M": 1000**2, "m": 1000**2, "Mi": 1024**2,
    "G": 1000**3, "g": 1000**3, "Gi": 1024**3,
    "T": 1000**4, "t": 1000**4, "Ti": 1024**4,
    "P": 1000**5, "p": 1000**5, "Pi": 1024**5,
}
_MIB = 1024**2


def parse_memory_mb(value: object) -> int:
    """MiB in a memory quantity; raises ValueError with a hint for a person.

    A bare number would be bytes in Kubernetes, which is almost never what a
    cluster admin means in a sku, so it is refused unless it is 0.
    """
    if isinstance(value, bool):
        raise ValueError(f"memory {value!r} is not a quantity like 8192Mi or 16Gi")
    if isinstance(value, (int, float)):
        if value == 0:
            return 0
        raise ValueError(f"memory {value!r} needs a unit, e.g. {value}Mi")
    if not isinstance(value, str):
        raise ValueError(f"memory {value!r} is not a quantity like 8192Mi or 16Gi")
    match = _QUANTITY.match(value)
    if not match:
        raise ValueError(f"memory {value!r} is not a quantity like 8192Mi or 16Gi")
    number, unit = match.groups()
    if unit is None:
        if float(number) == 0:
            return 0
        raise ValueError(f"memory {value!r} needs a unit, e.g. {number}Mi")
    return int(float(number) * _BYTES_PER_UNIT[unit] // _MIB)
