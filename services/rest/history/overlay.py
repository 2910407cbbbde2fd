"""The job list from the history database with rest's newer rows laid over it (pure).

The database lags the bus by the projection's delay; rest's live index does not
(a job this replica just accepted is in it at once). So a list page is the
database's rows of every job but those the index holds newer ("unsettled":
changed since last found equal in the database, or deleted), merged with the
index's own rows of those, in the list's order. `window` says which database
rows to read so that the merged page is exact; `page` merges them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def window(offset: int, limit: int, overlaid: int) -> tuple[int, int]:
    """(offset, limit) of the database rows (those not overlaid) that the merged page
    [offset, offset + limit) can hold, with `overlaid` matching rows from the index.

    A database row at index j lands at j plus the overlaid rows before it, so no
    row below offset - overlaid and none past offset + limit can be on the page."""
    start = max(0, offset - overlaid)
    return start, offset + limit - start


def page(db_rows: Sequence[Any], db_start: int, overlaid: list[Any], offset: int, limit: int,
         order: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """The merged page [offset, offset + limit): `db_rows` are the database's rows from
    index `db_start` (as `window` asked), `overlaid` the index's matching rows, `order`
    sorts a list as the list's order does.

    The first database row's place is db_start plus the overlaid rows ordered before
    it, so merged[k] sits at db_start + k whenever k is at or past it; the page starts
    at k = offset - db_start, which is never before it (db_start is offset - overlaid
    or 0). With no database rows in the window, merged is the overlaid rows alone:
    exact when db_start is 0, and past the end otherwise (every row before offset)."""
    merged = order([*db_rows, *overlaid])
    at = offset - db_start
    return merged[at:at + limit]


def on_page(window: Sequence[Any], db_start: int, overlaid: list[Any], offset: int, limit: int,
            order: Callable[[list[Any]], list[Any]]) -> tuple[int, int]:
    """[p, q): which of the window's database rows (from index `db_start`, in the list's
    order; only what `order` reads of them is needed) land on the merged page [offset,
    offset + limit), so that only those are read in full. Every overlaid row is in the
    merge, so each row sits at db_start plus its place in it. `page` gives the same
    page from window[p:q] read from index db_start + p: the rows left out before p are
    all before the page, and so are the overlaid rows ordered before them."""
    merged = order([*window, *overlaid])
    window_ids = {id(row) for row in window}
    p = q = 0
    for at, row in enumerate(merged):
        if id(row) in window_ids:
            if db_start + at < offset:
                p += 1
            if db_start + at < offset + limit:
                q += 1
    return p, q
