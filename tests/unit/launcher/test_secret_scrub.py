"""The launcher never shows the beginning of a secret a log read cut in two."""

from __future__ import annotations

import pytest

from services.launcher.service import _without_secret_start


@pytest.mark.parametrize(
    ("data", "values", "shown"),
    [
        (b"token: s3cr", ["s3cret"], b"token: "),
        (b"token: s", ["s3cret", "x"], b"token: "),
        (b"token: ******\n", ["s3cret"], b"token: ******\n"),
        (b"done\n", ["s3cret"], b"done\n"),
        (b"", ["s3cret"], b""),
    ],
    ids=["half-a-secret", "first-char", "masked-whole", "unrelated-end", "empty"],
)
def test_a_trailing_beginning_of_a_secret_is_held_back(data, values, shown):
    assert _without_secret_start(data, values) == shown
