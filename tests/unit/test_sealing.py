"""Sealed job secrets: only the matching private key opens them, and only for their job."""

from __future__ import annotations

import os
import stat

import pytest

from libs.common import sealing


def test_seal_then_open_gives_the_plaintext_back():
    private = sealing.generate_private_key()
    blob = sealing.seal(private.public_key(), b'{"token": "hunter2"}', aad=b"alice.job")
    assert b"hunter2" not in blob
    assert sealing.open_sealed(private, blob, aad=b"alice.job") == b'{"token": "hunter2"}'


def test_sealing_twice_gives_different_ciphertexts():
    public = sealing.generate_private_key().public_key()
    assert sealing.seal(public, b"x", aad=b"k") != sealing.seal(public, b"x", aad=b"k")


@pytest.mark.parametrize(
    "spoil",
    [
        lambda blob, key: (sealing.generate_private_key(), blob, b"alice.job"),
        lambda blob, key: (key, blob, b"bob.job"),
        lambda blob, key: (key, blob[:-1] + bytes([blob[-1] ^ 1]), b"alice.job"),
        lambda blob, key: (key, b"\x02" + blob[1:], b"alice.job"),
        lambda blob, key: (key, blob[:20], b"alice.job"),
    ],
    ids=["wrong-key", "other-job", "tampered", "unknown-version", "truncated"],
)
def test_what_does_not_match_does_not_open(spoil):
    key = sealing.generate_private_key()
    blob = sealing.seal(key.public_key(), b"secret", aad=b"alice.job")
    with pytest.raises(sealing.SealError):
        _open(*spoil(blob, key))


def _open(key, blob, aad):
    return sealing.open_sealed(key, blob, aad=aad)


def test_key_pair_files_are_private_and_never_replaced(tmp_path):
    private_path, public_path = tmp_path / "secrets.key", tmp_path / "secrets.pub"
    assert sealing.write_key_pair(private_path, public_path) is True
    assert stat.S_IMODE(os.stat(private_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(public_path).st_mode) == 0o600
    first = private_path.read_bytes()
    public_path.unlink()
    assert sealing.write_key_pair(private_path, public_path) is False
    assert private_path.read_bytes() == first
    blob = sealing.seal(sealing.load_public_key(public_path), b"v", aad=b"k")
    assert sealing.open_sealed(sealing.load_private_key(private_path), blob, aad=b"k") == b"v"
