"""Heartbeats as written and read back: only this writer's count, and decoding is total."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connectors.postgres.heartbeat import decode, encode, new_token


def test_a_heartbeat_reads_back_only_for_its_slot_and_writer() -> None:
    token = new_token()
    beat = encode("s1", token).encode()
    sent = decode(beat, "s1", token)
    assert isinstance(sent, float) and sent > 1.7e9
    assert decode(beat, "s2", token) is None  # another deployment's slot
    assert decode(beat, "s1", new_token()) is None  # an earlier run's, or a forged copy of the slot's name


def test_anything_else_under_the_prefix_is_malformed() -> None:
    for content in (b"[]", b"", b"{", b'{"slot": "s1", "sent_us": 1}', b'{"slot": "s1", "token": "t", "sent_us": "x"}',
                    b'{"slot": "s1", "token": "t", "sent_us": -5}', b"[" * 500 + b"]" * 500, b"\xff\xfe"):
        assert decode(content, "s1", "t") == "malformed", content


@given(st.binary(max_size=200))
def test_decode_is_total(content: bytes) -> None:
    assert decode(content, "s1", "t") in ("malformed", None) or isinstance(decode(content, "s1", "t"), float)
