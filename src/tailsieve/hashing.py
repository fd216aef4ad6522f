"""Process-independent hashing (seeds and fingerprints must be the same in every process, unlike `hash()`)."""

from __future__ import annotations

import hashlib


def stable_hash(text: str) -> int:
    """A 64-bit hash of a prompt id that is the same in every process (unlike `hash()`)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def batch_digest(data: bytes) -> str:
    """The BLAKE2b digest (128 bits, hex) a step line records for its batch file, checked by `rollout --resume`."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()
