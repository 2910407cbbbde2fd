"""Reading CSV rows with line numbers, and parsing fields into clear, row-level errors."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path


class RowError(ValueError):
    """One field of one row is unusable: `kind` groups it in reports, the message says what and why."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def read_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) for every line after the header, blank lines included (as []).

    Lines starting with '#' are comments and are not returned. The header is line 1
    (or the first line that is not a comment).
    """
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        for cells in reader:
            if cells and cells[0].lstrip().startswith("#"):
                continue
            yield reader.line_num, [cell.strip() for cell in cells]


def read_header(path: Path) -> list[str]:
    """The column names of a CSV file (lower case), or [] when it has none."""
    for _, cells in read_rows(path):
        if any(cells):
            return [cell.lower() for cell in cells]
    return []


def column_index(header: list[str], names: list[str], file: Path) -> dict[str, int]:
    missing = [name for name in names if name not in header]
    if missing:
        raise ValueError(f"{file.name}: missing column(s) {', '.join(missing)} (header: {','.join(header)})")
    return {name: header.index(name) for name in names}


def cell(cells: list[str], index: int | None, name: str) -> str:
    if index is None or index >= len(cells):
        if index is None:
            return ""
        raise RowError("short-row", f"the row has {len(cells)} fields; column {name} is missing")
    return cells[index]


def whole_number(text: str, name: str, *, minimum: int) -> int:
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"bad-{name}", f"{name} {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise RowError(f"bad-{name}", f"{name} {text!r} is not a whole number")
    if value < minimum:
        raise RowError(f"bad-{name}", f"{name} {text!r} is below {minimum}")
    return int(value)


def seconds(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"bad-{name}", f"{name} {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise RowError(f"bad-{name}", f"{name} {text!r} must be a number of seconds >= 0")
    return value


def timestamp(text: str, name: str) -> float:
    """Seconds since the epoch for an ISO date-time; a time without a zone is read as UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise RowError(f"bad-{name}", f"{name} {text!r} is not a date-time like 2017-10-01 08:00:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
