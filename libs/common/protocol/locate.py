"""Where a field path is in a submitted document, for refusals decided after parsing.

Validation errors carry their line already (document.py keeps each path's line while
parsing). A refusal decided later, against the cluster (an unknown virtual cluster, a
job that can never fit), names only a field path; `errors_located` adds the line of
that path in the user's own text, so every 400 of a submission can point at a line.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from libs.common.errors import PaiError
from libs.common.protocol.document import load_document
from libs.common.protocol.model import ProtocolError
from libs.common.protocol.paths import DocPath

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_path(text: str) -> DocPath:
    """`taskRoles.worker.instances` -> ("taskRoles", "worker", "instances"); `a[0].b` ->
    ("a", 0, "b"); `$` -> () (the inverse of paths.format_path)."""
    if text in ("", "$"):
        return ()
    return tuple(int(index) if index else key for key, index in _PART.findall(text))


def line_of_path(body: bytes | str, content_type: str | None, path: str) -> int | None:
    """The line of `path` (or of its nearest ancestor present) in the document; None when
    the body does not parse or has no such field."""
    try:
        document = load_document(body, content_type)
    except ProtocolError:
        return None
    return document.line_of(parse_path(path))


@contextlib.contextmanager
def errors_located(body: bytes | str, content_type: str | None) -> Iterator[None]:
    """A PaiError raised inside, whose `details.errors` name field paths without a line,
    leaves with the line of each path in `body` added."""
    try:
        yield
    except PaiError as exc:
        details = exc.details
        items = details.get("errors") if isinstance(details, dict) else None
        if isinstance(details, dict) and isinstance(items, list) and any(
                isinstance(i, dict) and i.get("line") is None and i.get("path") for i in items):
            exc.details = {**details, "errors": [
                {**item, "line": line_of_path(body, content_type, str(item["path"]))}
                if isinstance(item, dict) and item.get("line") is None and item.get("path") else item
                for item in items]}
        raise
