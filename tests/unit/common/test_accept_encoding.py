"""Which content codings a client's Accept-Encoding takes (libs/common/tensorboard_relay.py),
as the TensorBoard relay decides whether to pass an encoded answer on or decode it."""

from __future__ import annotations

import pytest

from libs.common.tensorboard_relay import accepts


@pytest.mark.parametrize(("header", "coding", "taken"), [
    ("", "gzip", False),  # no header: the plain body
    ("identity", "gzip", False),
    ("gzip, deflate, br", "gzip", True),
    ("GZIP", "gzip", True),
    ("x-gzip", "gzip", True),
    ("gzip", "x-gzip", True),
    ("gzip;q=0", "gzip", False),
    ("gzip; q=0.5", "gzip", True),
    ("*", "gzip", True),
    ("*;q=0", "gzip", False),
    ("gzip;q=0, *", "gzip", False),  # named itself, refused: * does not bring it back
    ("br, *;q=0", "gzip", False),
    ("deflate", "gzip", False),
    ("gzip;q=nonsense", "gzip", False),
])
def test_accepts(header: str, coding: str, taken: bool):
    assert accepts(header, coding) is taken
