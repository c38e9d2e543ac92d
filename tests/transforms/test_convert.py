"""Conversion: column texts to values through each table's loaders; what cannot be held stays text."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
from decimal import Decimal

import psycopg
import pytest

from core.events import UNCHANGED_TOAST, Change, Loader, Table
from tests.transforms.samples import TS, raw_change
from transforms.convert import convert, convert_row


def _too_far(text: bytes) -> dt.date:
    if text == b"infinity":
        raise psycopg.DataError("date too large (after year 10K): 'infinity'")
    return dt.date.fromisoformat(text.decode())


LOADERS: dict[str, Loader] = {"id": int, "amount": lambda text: Decimal(text.decode()), "day": _too_far}


def test_values_are_loaded_by_their_columns_loaders() -> None:
    change = convert(raw_change(new={"id": b"7", "amount": b"12.50", "day": b"2024-02-29", "note": b"x"},
                                loaders=LOADERS, idx=3))
    assert change == Change("insert", "public", "orders", ("id",),
                            {"id": 7, "amount": Decimal("12.50"), "day": dt.date(2024, 2, 29), "note": "x"}, None,
                            22150152, 3, TS, 4711, pks=("7",))


def test_what_python_cannot_hold_stays_its_exact_text() -> None:
    change = convert(raw_change(new={"id": b"1", "day": b"infinity"}, loaders=LOADERS))
    assert change.new == {"id": 1, "day": "infinity"}


def test_null_and_unchanged_toast_pass_as_they_are() -> None:
    change = convert(raw_change("update", new={"id": b"1", "note": None, "body": UNCHANGED_TOAST}, loaders=LOADERS))
    assert change.new == {"id": 1, "note": None, "body": UNCHANGED_TOAST}


def test_a_key_only_old_row_of_a_delete_has_every_column_the_others_null() -> None:
    """Sequin's record of a delete under REPLICA IDENTITY DEFAULT."""
    change = convert(raw_change("delete", columns=("note",), old={"id": b"7"}, old_is_key=True, loaders=LOADERS))
    assert change.old == {"note": None, "id": 7} and change.new is None
    full = convert(raw_change("delete", old={"id": b"7", "note": None}, loaders=LOADERS))
    assert full.old == {"id": 7, "note": None}  # a full old row: NULL is NULL


def test_a_key_only_old_row_of_an_update_reports_the_identity_columns_only() -> None:
    """The other columns' old values are unknown, not NULL: changes must not claim they were."""
    change = convert(raw_change("update", columns=("note",), new={"id": b"8", "note": b"x"}, old={"id": b"7"},
                                old_is_key=True, loaders=LOADERS))
    assert change.old == {"id": 7}


def test_pks_are_the_key_texts_in_column_order_from_the_new_row_or_a_deletes_old_row() -> None:
    """Sequin's record_pks: the primary key's values as Postgres prints them, ordered by column."""
    change = convert(raw_change(key=("b", "a"), columns=("a", "x", "b"), new={"a": b"1", "b": b"2020-01-01"}))
    assert change.pks == ("1", "2020-01-01")
    moved = convert(raw_change("update", new={"id": b"8"}, old={"id": b"7"}, old_is_key=True))
    assert moved.pks == ("8",)
    deleted = convert(raw_change("delete", old={"id": b"7"}, old_is_key=True))
    assert deleted.pks == ("7",)
    toasted = convert(raw_change("update", new={"id": UNCHANGED_TOAST}, old={"id": b"long"}))
    assert toasted.pks == ("long",)
    assert convert(raw_change(key=(), new={"note": b"x"})).pks == ()
    assert convert(raw_change(key=("id", "k"), new={"id": b"1", "k": None})).pks == ("1", "")  # to_string(nil)


def test_a_converted_change_is_a_whole_change_field_for_field() -> None:
    """convert builds a Change without calling the class (tuple.__new__): every field, in order."""
    raw = raw_change("update", new={"id": b"8"}, old={"id": b"7"})._replace(annotations=b"{}")
    change = convert(raw)
    assert type(change) is Change and len(change) == len(Change._fields)
    assert change == Change(raw.action, raw.table.schema, raw.table.name, raw.table.key_columns, {"id": "8"}, {"id": "7"},
                            raw.commit_lsn, raw.commit_idx, raw.commit_ts, raw.xid, raw.read, b"{}", ("8",))
    assert change.pks == ("8",) and change.annotations == b"{}"


def test_annotations_pass_through() -> None:
    raw = raw_change()._replace(annotations=b'{"a": 1}')
    assert convert(raw).annotations == b'{"a": 1}'


def test_a_loader_failing_unforeseen_falls_back_to_the_text_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A value is anyone's to write: whatever a loader raises, the exact text is published."""
    def broken(_: bytes) -> object:
        raise KeyError("secret value")

    table = Table("public", "t", ("id", "v"), ("id",), ("id",), (bytes.decode, broken))
    with caplog.at_level("WARNING"):
        assert convert_row(table, (b"1", b"abc")) == {"id": "1", "v": "abc"}
        assert convert_row(table, (b"2", b"def")) == {"id": "2", "v": "def"}
    warnings = [r.getMessage() for r in caplog.records if "could not be converted" in r.getMessage()]
    assert warnings == ["public.t.v: a value could not be converted (KeyError): published as its Postgres text"]


def _failing(exc: BaseException) -> Loader:
    def load(text: bytes) -> object:
        raise exc

    return load


@pytest.mark.parametrize("exc", [psycopg.DataError("date out of range: 'SECRET-1'"), ValueError("SECRET-1"),
                                 OverflowError("SECRET-1"), decimal.InvalidOperation("SECRET-1"),
                                 RecursionError("SECRET-1"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "SECRET-1"),
                                 TypeError("SECRET-1")])
def test_any_value_its_loader_cannot_convert_is_its_text_with_one_warning_per_column_and_process(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """Foreseen or not (an infinity date's DataError, a parser's RecursionError): the text, and one
    line per column however many rows, naming the exception's type, never the value."""
    loaders: dict[str, Loader] = {"id": int, "v": _failing(exc), "w": _failing(exc)}
    with caplog.at_level(logging.WARNING, "walflow.transforms.convert"):
        rows = [convert(raw_change(new={"id": str(i).encode(), "v": b"SECRET-1", "w": b"x\xc3\xa9"}, loaders=loaders)).new
                for i in range(3)]
        convert(raw_change("read", new={"id": b"9", "v": b"SECRET-1", "w": b"x"}, loaders=loaders))  # a backfill's read
    assert rows == [{"id": i, "v": "SECRET-1", "w": "x\u00e9"} for i in range(3)]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"public.orders.{column}: a value could not be converted ({type(exc).__name__}): published as "
                     "its Postgres text" for column in ("v", "w")]
    assert not any("SECRET" in line for line in lines)  # a loader's message quotes the value


@pytest.mark.parametrize("exc", [MemoryError(), KeyboardInterrupt()])
def test_what_is_not_the_values_fault_is_not_swallowed(exc: BaseException) -> None:
    """Out of memory (a restart loses nothing: the slot is not confirmed past it), an interrupt:
    neither becomes text."""
    with pytest.raises(type(exc)):
        convert(raw_change(new={"id": b"1", "v": b"x"}, loaders={"id": int, "v": _failing(exc)}))
