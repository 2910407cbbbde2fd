"""Text that cannot be stored: strings with a lone surrogate.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`) and YAML's double-quoted
scalars too (`"\\ud800"`); both parsers hand it over as a Python string that no
UTF-8 encoder accepts. Such a string must be refused where the document is read,
as a 400 naming its field: found later, when the record is encoded for the
store, it fails the request, or worse a batch of other people's requests.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.protocol.paths import DocPath

RULE = "encoding"
MESSAGE = "is not valid Unicode text (a lone UTF-16 surrogate such as \\ud800): it cannot be stored"


def encodable(text: str) -> bool:
    if text.isascii():  # the common case, without an encode
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_probe = msgspec.json.Encoder()


def unencodable_paths(data: Any, *, most: int = 10) -> list[DocPath]:
    """The paths of strings (mapping keys included) in a decoded JSON/YAML document
    that UTF-8 cannot encode, in document order, at most `most`. A bad key is
    named by its own path. Iterative: a deep document is no recursion risk."""
    try:
        # The common case in one pass of C: msgspec encodes every string as UTF-8 and
        # refuses a surrogate. Only a document it refuses (a surrogate, or a key type
        # JSON has no spelling for, such as YAML's null) is walked to find the paths.
        _probe.encode(data)
        return []
    except (UnicodeEncodeError, TypeError, ValueError, msgspec.EncodeError):
        pass
    found: list[DocPath] = []
    stack: list[tuple[DocPath, Any]] = [((), data)]
    while stack and len(found) < most:
        path, value = stack.pop()
        if isinstance(value, str):
            if not encodable(value):
                found.append(path)
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                key_text = key if isinstance(key, str) else str(key)
                child = (*path, key_text if encodable(key_text) else key_text.encode("utf-8", "replace").decode())
                if not encodable(key_text):
                    found.append(child)
                    continue
                children.append((child, item))
            stack.extend(reversed(children))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed([((*path, i), item) for i, item in enumerate(value)]))
    return found[:most]
