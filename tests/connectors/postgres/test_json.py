"""json/jsonb values load through orjson exactly as ``json.loads`` would load them."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.postgres.types import _shallow, json_loads
from core.events import JsonText


def same(a: object, b: object) -> bool:
    """Equal, of the same types all the way down, floats bit for bit (NaN included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        return struct.pack("!d", a) == struct.pack("!d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, Decimal):
        assert isinstance(b, Decimal)
        return str(a) == str(b)
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def outcome(loads: Callable[[bytes], Any], data: bytes) -> tuple[str, Any]:
    try:
        return "value", loads(data)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


def assert_like_json_loads(data: bytes) -> None:
    """As ``json.loads``, but a document too deep for it (or for orjson to write back) is its
    text, carried as it is (``JsonText``), never a ``RecursionError``."""
    expected, got = outcome(json.loads, data), outcome(json_loads, data)
    if expected == ("error", RecursionError) or (expected[0] == "value" and not _shallow(expected[1])):
        assert got == ("value", JsonText(data)), (data, expected, got)
        return
    assert expected[0] == got[0] and same(expected[1], got[1]), (data, expected, got)


JSON_EDGES = [
    b"12345678901234567890", b"123456789012345678901234567890", b"-9223372036854775809", b"18446744073709551616",
    b"18446744073709551615", b"-0", b"-0.0", b'{"a":1,"a":2}', b"1E400", b"1e-400", b"0.1", b"1e2", b"1.0",
    b'"\\ud800"', b'"\\u0000"', b'"\\ud83d\\ude00"', b"[" * 2000 + b"]" * 2000, b"[" * 241 + b"]" * 241, b"[" * 240 + b"]" * 240, b' {"x" : [1, 2.5, null, true]} ',
    b"NaN", b"Infinity", b"-Infinity", b"1.7976931348623157e308", b"5e-324", b"9007199254740993", b"1" + b"0" * 400,
    b'"\xff"', b"\xef\xbb\xbf{}", b'{"a": 1}\n', b"[1,]", b"", b'{"n": 12345678901234567890}', b'"1234567890123456789"',
    b'{"big": -123456789012345678901234567890.5e3}', b"[1e23, 8.98846567431158e307, 2.2250738585072011e-308]",
]


@pytest.mark.parametrize("data", JSON_EDGES)
def test_json_loads_edges(data: bytes) -> None:
    assert_like_json_loads(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_json_loads_on_documents(value: object) -> None:
    assert_like_json_loads(json.dumps(value).encode())
    assert_like_json_loads(json.dumps(value, ensure_ascii=False).encode())


@given(json_values, st.lists(st.tuples(st.integers(0, 200), st.sampled_from(b'{}[]",:0123456789.eE+-\\ nul\xc3')),
                              max_size=3))
def test_json_loads_on_mutated_documents(value: object, edits: list[tuple[int, int]]) -> None:
    data = bytearray(json.dumps(value).encode())
    for at, byte in edits:
        data[min(at, len(data)):min(at, len(data))] = bytes([byte])
    assert_like_json_loads(bytes(data))
