"""json/jsonb values load through orjson exactly as ``json.loads`` would load them, or as their
text (a JsonText) where Python's values cannot carry them exactly."""

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

from connectors.postgres.types import MAX_JSON_DEPTH, json_loads
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


def depth(value: object) -> int:
    """How deeply ``value``'s arrays and objects nest (a scalar: 0), without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            pending.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def inexact(value: object) -> bool:
    """Whether a value ``json.loads`` read is one Python cannot carry exactly: too deep for the
    encoders, an infinity or NaN, a str with a lone surrogate."""
    if depth(value) > MAX_JSON_DEPTH:
        return True
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            return True
        if isinstance(item, dict):
            pending.extend(item)  # its keys too
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def assert_like_json_loads(data: bytes) -> None:
    """json_loads gives what json.loads gives, or a JsonText of the very text where json.loads
    fails or reads it inexactly; it never raises."""
    expected, got = outcome(json.loads, data), outcome(json_loads, data)
    assert got[0] == "value", (data, got)
    if type(got[1]) is JsonText:
        assert got[1].text == data
        # (json.loads skips a BOM, which orjson refuses and Postgres never prints)
        assert expected[0] == "error" or inexact(expected[1]) or data.startswith(b"\xef\xbb\xbf"), (data, expected)
    else:
        assert expected[0] == "value" and same(expected[1], got[1]), (data, expected, got)


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


def nested(levels: int, inner: bytes = b"1") -> bytes:
    return b"[" * levels + inner + b"]" * levels


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 254, 255, 256, 300, 1024, 1025, 1500])
def test_a_document_is_objects_up_to_max_depth_and_its_text_beyond(levels: int) -> None:
    for data in (nested(levels), nested(levels - 2, b'{"a": [12345678901234567890123]}'),
                 b'{"k": ' + nested(levels - 1) + b"}"):
        got = json_loads(data)
        if levels <= MAX_JSON_DEPTH:
            assert depth(got) == levels and same(got, json.loads(data))
        else:
            assert type(got) is JsonText and got.text == data


@pytest.mark.parametrize("first_id", [0, 12345678901234567890])  # and through json.loads: integers beyond 64 bits
def test_a_wide_document_with_many_brackets_stays_objects(first_id: int) -> None:
    data = json.dumps([{"id": first_id + i, "tags": ["a", {"b": [i]}]} for i in range(2000)]).encode()
    assert len(data) > 2 * MAX_JSON_DEPTH and data.count(b"[") > MAX_JSON_DEPTH
    assert same(json_loads(data), json.loads(data))


@pytest.mark.parametrize("data", [
    b'{"a": 1e400}', b"-1e400", b'"\\ud800"', b'["\\udc00", 12345678901234567890]', b'{"n": 1e400, "m": 1234567890123456789}',
])
def test_what_python_would_read_inexactly_is_its_text(data: bytes) -> None:
    got = json_loads(data)
    assert type(got) is JsonText and got.text == data


def test_a_surrogate_pair_and_a_nul_escape_stay_objects() -> None:
    for data in (b'"\\ud83d\\ude00"', b'{"n": 12345678901234567890, "e": "\\ud83d\\ude00"}', b'"\\u0000"'):
        assert same(json_loads(data), json.loads(data))
