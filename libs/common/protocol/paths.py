"""Where in a job document something is: a path of mapping keys and list indices.

Paths are kept as tuples while checking and only turned into text for people and
for the 400 body: `taskRoles.worker.instances`, `prerequisites[0].uri`, `$` for
the whole document.
"""

from __future__ import annotations

from typing import Any

DocPath = tuple[str | int, ...]

# A mapping as a YAML or JSON body has it: nothing about its keys or values is
# known until validation has looked at them.
RawMapping = dict[Any, Any]

ROOT: DocPath = ()


def format_path(path: DocPath) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "$"
