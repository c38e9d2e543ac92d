"""core/keyed_hash.py: hmac.digest's result, bit for bit, for every key length and value."""

from __future__ import annotations

import hmac

from hypothesis import given
from hypothesis import strategies as st

from core.keyed_hash import KeyedHash


@given(key=st.binary(max_size=200), values=st.lists(st.binary(max_size=300), max_size=5))
def test_it_is_hmac_sha256_for_any_key_and_value(key: bytes, values: list[bytes]) -> None:
    keyed = KeyedHash(key)
    for value in values:  # one key, many values: its states are copied, never used up
        assert keyed.hexdigest(value) == hmac.digest(key, value, "sha256").hex()


def test_keys_around_the_block_size_are_padded_or_hashed_as_hmac_does() -> None:
    for length in (0, 1, 63, 64, 65, 128):
        key = bytes(range(length))
        assert KeyedHash(key).hexdigest(b"row 7") == hmac.digest(key, b"row 7", "sha256").hex()
