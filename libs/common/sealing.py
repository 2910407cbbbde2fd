"""Job secrets, sealed for the launcher alone.

rest seals a job's secrets with the launcher's public key and stores the result
once, in the `pai_secrets` bucket under the job's key; only the launcher, which
holds the private key, can open them. The construction is an ECIES-style sealed
box from well-known parts (the `cryptography` package):

    blob = VERSION | ephemeral X25519 public key (32) | nonce (12) | AES-256-GCM(plaintext)
    key  = HKDF-SHA256(X25519(ephemeral, recipient), salt = ephemeral pub | recipient pub, info = INFO)

The associated data is the job key, so a sealed value moved to another job's
key does not open. Keys are stored as PEM (PKCS#8 / SubjectPublicKeyInfo), so
`openssl pkey` can read them; `pai up` writes them with `write_key_pair`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = b"\x01"
INFO = b"pai job secrets v1"
_KEY_BYTES = 32
_NONCE_BYTES = 12


class SealError(Exception):
    """A sealed value that cannot be opened: wrong key, wrong job, or damaged."""


def generate_private_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def seal(public_key: X25519PublicKey, plaintext: bytes, *, aad: bytes) -> bytes:
    ephemeral = X25519PrivateKey.generate()
    ephemeral_pub = _raw(ephemeral.public_key())
    key = _derive(ephemeral.exchange(public_key), ephemeral_pub, _raw(public_key))
    nonce = os.urandom(_NONCE_BYTES)
    return VERSION + ephemeral_pub + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(private_key: X25519PrivateKey, blob: bytes, *, aad: bytes) -> bytes:
    header = len(VERSION) + _KEY_BYTES + _NONCE_BYTES
    if len(blob) < header + 16 or blob[:1] != VERSION:
        raise SealError("not a sealed value of a version PAI knows")
    ephemeral_pub = blob[1 : 1 + _KEY_BYTES]
    nonce = blob[1 + _KEY_BYTES : header]
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(ephemeral_pub))
        key = _derive(shared, ephemeral_pub, _raw(private_key.public_key()))
        return AESGCM(key).decrypt(nonce, blob[header:], aad)
    except (InvalidTag, ValueError) as exc:
        raise SealError("the sealed value does not open with this key for this job") from exc


def _derive(shared: bytes, ephemeral_pub: bytes, recipient_pub: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=ephemeral_pub + recipient_pub, info=INFO).derive(shared)


def _raw(public_key: X25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# -- key files ---------------------------------------------------------------


def load_public_key(path: str | Path) -> X25519PublicKey:
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, X25519PublicKey):
        raise ValueError(f"{path}: not an X25519 public key")
    return key


def load_private_key(path: str | Path) -> X25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, X25519PrivateKey):
        raise ValueError(f"{path}: not an X25519 private key")
    return key


def write_key_pair(private_path: Path, public_path: Path) -> bool:
    """Create the key pair unless the private key exists; True if created.

    The private key is created 0600 (O_EXCL: never replaced, never readable by
    others even for a moment); the public key is derived from it, so a lost
    public key file is simply written again.
    """
    created = False
    if not private_path.exists():
        private = generate_private_key()
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        created = True
    os.chmod(private_path, 0o600)
    if created or not public_path.exists():
        public = load_private_key(private_path).public_key()
        public_path.write_bytes(public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    os.chmod(public_path, 0o600)
    return created
