"""The id scheme in both forms: walflow's (names database and sink) and Sequin's (a position only)."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError, to_json

from core.events import Position
from core.ids import IdScheme, row_key

WALFLOW = IdScheme("app", "orders-to-nats")
SEQUIN = IdScheme("app", "orders-to-nats", msg_id="sequin")

lsns = st.integers(min_value=0, max_value=2**64 - 1)
idxs = st.integers(min_value=0, max_value=2**32)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_sequin_form_is_exactly_sequins_idempotency_key() -> None:
    assert SEQUIN.encode(22150152, 0) == _b64("22150152:0").encode()
    assert SEQUIN.encode(22150152, 17).decode() == "MjIxNTAxNTI6MTc="
    assert SEQUIN.prefix == ""
    assert SEQUIN.msg_id == "sequin"


def test_walflow_form_is_unchanged_and_the_default() -> None:
    assert WALFLOW.msg_id == "walflow"
    assert WALFLOW.encode(22150152, 3) == _b64("app/orders-to-nats/22150152:3").encode()
    assert IdScheme("my db", "s/1").encode(1, 2) == _b64("my%20db/s%2F1/1:2").encode()


@given(lsns, idxs)
def test_both_forms_round_trip(lsn: int, idx: int) -> None:
    for ids in (WALFLOW, SEQUIN):
        msg_id = ids.encode(lsn, idx).decode("ascii")
        assert ids.decode(msg_id) == Position(lsn, idx)
        assert not ids.is_read(msg_id)


def test_reads_keep_walflows_read_id_in_both_forms() -> None:
    read = _b64('app/orders-to-nats/read/bf-1/["7"]')
    assert WALFLOW.encode_read("bf-1", '["7"]').decode() == read
    assert SEQUIN.encode_read("bf-1", '["7"]').decode() == read
    for ids in (WALFLOW, SEQUIN):
        assert ids.is_read(read)
        assert ids.decode(read) is None  # a read names no position
    # a row key holding ':' and digits is still no position
    tricky = SEQUIN.encode_read("bf-1", '["1:2"]').decode()
    assert SEQUIN.decode(tricky) is None and SEQUIN.is_read(tricky)


def test_foreign_ids_decode_to_none() -> None:
    foreign = [
        "", "not-base64!", "é", _b64(""), _b64("12"), _b64("12:"), _b64(":3"), _b64("12:3x"), _b64("-1:2"),
        _b64("a:1"), _b64("12:3:4"),
        _b64("9" * 5000 + ":1"), _b64("1:" + "9" * 5000),  # more digits than Python's int() takes: not a ValueError
    ]
    for ids in (WALFLOW, SEQUIN):
        for msg_id in foreign:
            assert ids.decode(msg_id) is None, msg_id
            assert not ids.is_read(msg_id), msg_id


def test_each_form_ignores_the_others_change_ids() -> None:
    # walflow's id of this very sink is not a Sequin-form id, and the reverse
    assert SEQUIN.decode(WALFLOW.encode(10, 1).decode()) is None
    assert WALFLOW.decode(SEQUIN.encode(10, 1).decode()) is None
    # another sink's or database's walflow ids are not this sink's, in either form
    for other in (IdScheme("app", "other"), IdScheme("crm", "orders-to-nats")):
        msg_id = other.encode(10, 1).decode()
        assert WALFLOW.decode(msg_id) is None and SEQUIN.decode(msg_id) is None
        read = other.encode_read("bf", "[1]").decode()
        assert not WALFLOW.is_read(read) and not SEQUIN.is_read(read)


def test_in_sequin_form_any_sinks_position_id_decodes() -> None:
    """Sequin's ids name no sink: whose they are, only the subject they were read from says
    (the replay scan reads this sink's subjects only)."""
    assert SEQUIN.decode(IdScheme("crm", "x", msg_id="sequin").encode(5, 6).decode()) == Position(5, 6)


@given(st.lists(st.one_of(st.binary(max_size=12), st.from_regex(rb"\A[0-9]{1,20}\Z"), st.none()), min_size=1, max_size=3))
def test_a_row_key_is_the_json_array_of_its_texts_whatever_path_makes_it(texts: list[bytes | None]) -> None:
    """An integer key takes a short path (its text quoted); every key is still the JSON the
    general path writes, byte for byte: ids and partitions must not change with the path."""
    try:
        expected = to_json(texts).decode()
    except PydanticSerializationError:  # not UTF-8: base64 (the general path, tested by the sizes' markers too)
        return
    assert row_key(texts) == expected


def test_an_integer_keys_short_path() -> None:
    assert row_key([b"42"]) == '["42"]' and row_key([b""]) == '[""]' and row_key([b"-1"]) == '["-1"]'
