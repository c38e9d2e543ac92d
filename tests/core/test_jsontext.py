"""The check of a JSON text no Postgres output function printed (is_json), against ``json.loads`` as
Sequin's Jason reads JSON (no NaN, no Infinity, UTF-8), at any depth."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.jsontext import is_json


def _refuse(name: str) -> None:
    raise ValueError(name)


def strict_loads(data: bytes) -> bool:
    """Whether ``data`` is JSON as Jason reads it: ``json.loads`` of its UTF-8, without NaN and the infinities."""
    try:
        json.loads(data.decode("utf-8"), parse_constant=_refuse)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(("text", "valid"), [
    (b"{}", True), (b"[]", True), (b"1", True), (b'"a"', True), (b" \t\n\r[1,2]\n", True), (b'{"a":{"b":[{}]}}', True),
    (b'"\\u00e9\\ud83d\\ude00\\n\\"\\\\\\/"', True), (b"-0.5e-3", True), (b"true", True), (b"null", True),
    (b'"\\ud800"', True),  # the grammar's: an escape of four hex digits
    (b"[" * 5000 + b"]" * 5000, True), (b'{"k":' * 3000 + b"1" + b"}" * 3000, True),
    (b"", False), (b"  ", False), (b"[1,]", False), (b"[,1]", False), (b'{"a" 1}', False), (b"{1:2}", False),
    (b'{"a":1,}', False), (b'{"a":1}{}', False), (b"[1 2]", False), (b"NaN", False), (b"Infinity", False),
    (b"[01]", False), (b"1.", False), (b"1e", False), (b"-", False), (b".5", False), (b"tr ue", False),
    (b'fal"x"e', False), (b'"\x01"', False), (b"[\x01]", False), (b'"\\x"', False), (b'"\\u12"', False),
    (b'"abc', False), (b'"\xff"', False), (b"\xef\xbb\xbf{}", False), (b"// c\n1", False), (b"{'a': 1}", False),
    (b"[" * 5000 + b"]" * 4999, False), (b"[" * 5000 + b"}" + b"]" * 4999, False), (b'{"k":' * 3000 + b"}" * 3000, False),
])
def test_is_json_at_any_depth(text: bytes, valid: bool) -> None:
    assert is_json(text) is valid
    if len(text) < 500:
        assert strict_loads(text) is valid  # json.loads agrees (where it can recurse that deep)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(json_values, st.sampled_from([None, 0, 2]))
def test_is_json_accepts_every_document(value: object, indent: int | None) -> None:
    assert is_json(json.dumps(value, indent=indent).encode())
    assert is_json(json.dumps(value, ensure_ascii=False).encode())


@given(json_values, st.lists(st.tuples(st.integers(0, 200), st.sampled_from(b'{}[]",:0123456789.eE+-\\ nulaNI\xc3\x01')),
                             min_size=1, max_size=3))
def test_is_json_agrees_with_json_loads_on_mutated_documents(value: object, edits: list[tuple[int, int]]) -> None:
    data = bytearray(json.dumps(value).encode())
    for at, byte in edits:
        data[min(at, len(data)):min(at, len(data))] = bytes([byte])
    assert is_json(bytes(data)) is strict_loads(bytes(data)), bytes(data)
