"""HMAC-SHA256 keyed once, applied to many values: a hash mask's, per row.

``hmac.digest(key, data, "sha256")`` sets up its key on every call (OpenSSL fetches the
digest, allocates two contexts and hashes the padded key twice): for a short value that
is most of its cost, about three times what the hash of the value itself costs. HMAC
(RFC 2104) is ``H((K ^ opad) || H((K ^ ipad) || data))``: the two padded-key blocks are
the same for every value, so their hash states are computed here once and copied per
value. The result is ``hmac.digest``'s, bit for bit (``tests/core/test_keyed_hash.py``).
"""

from __future__ import annotations

import hashlib
from typing import Final

#: SHA-256's block: a key is padded to it (hashed first when longer).
_BLOCK: Final = 64
_INNER: Final = bytes.maketrans(bytes(range(256)), bytes(b ^ 0x36 for b in range(256)))
_OUTER: Final = bytes.maketrans(bytes(range(256)), bytes(b ^ 0x5C for b in range(256)))


class KeyedHash:
    """HMAC-SHA256 under one key: :meth:`hexdigest` of a value is ``hmac.digest(key, value, "sha256").hex()``."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        padded = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(padded.translate(_INNER))
        self._outer = hashlib.sha256(padded.translate(_OUTER))

    def hexdigest(self, data: bytes) -> str:
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()
