"""Row filters on hand-made rows: ``where`` conditions and Sequin's column filters, operator by operator; no servers."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from config.shaping import ColumnFilter, Condition, matches_pattern
from core.errors import FatalError
from core.events import UNCHANGED_TOAST, Row, Table
from transforms.conditions import RowFilter

COLUMNS = ("id", "status", "amount", "price", "at", "local_at", "day", "ref", "doc", "flag", "tags", "note")
PATH = "sinks[0].tables[2]"
REF = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
ROW: Row = {
    "id": 7,
    "status": "Paid",
    "amount": Decimal("100.50"),
    "price": 12.5,
    "at": dt.datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=dt.UTC),
    "local_at": dt.datetime(2026, 3, 1, 12, 0, 0),
    "day": dt.date(2026, 3, 1),
    "ref": REF,
    "doc": {"address": {"city": "Lyon", "zip": 69001}, "list": [1, 2], "Name": "Ann"},
    "flag": True,
    "tags": ["a", "b"],
    "note": None,
}
TABLE = Table("public", "orders", COLUMNS, ("id",), ("id",), tuple(bytes.decode for _ in COLUMNS), "app")


def where(*conditions: dict[str, Any]) -> RowFilter:
    return RowFilter([Condition.model_validate(c) for c in conditions], [], TABLE, PATH)


def sequin(*filters: dict[str, Any]) -> RowFilter:
    return RowFilter([], [ColumnFilter.model_validate(f) for f in filters], TABLE, PATH)


def insert(rows: RowFilter, row: Row = ROW) -> bool:
    return rows("insert", row, None, None)


def test_nothing_to_check_publishes_everything() -> None:
    assert RowFilter([], [], TABLE, PATH)("delete", {}, None, None) is True


# -- where: comparisons --------------------------------------------------------------------------


@pytest.mark.parametrize(("operator", "literal", "expected"), [
    ("eq", 7, True), ("eq", 8, False), ("eq", 7.0, True), ("eq", "7", True), ("eq", Decimal("7.00"), True),
    ("ne", 7, False), ("ne", 8, True),
    ("gt", 6, True), ("gt", 7, False), ("gte", 7, True), ("gte", 7.5, False),
    ("lt", 8, True), ("lt", 7, False), ("lte", 7, True), ("lte", "6.9", False),
    ("eq", True, False),  # a boolean is not a number
    ("eq", "seven", False), ("ne", "seven", False), ("gt", "seven", False),  # no number: no comparison, ne included
])
def test_integer_comparisons(operator: str, literal: Any, expected: bool) -> None:
    assert insert(where({"column": "id", operator: literal})) is expected


@pytest.mark.parametrize(("operator", "literal", "expected"), [
    ("gt", 100, True), ("lt", 100, False), ("eq", 100, False),
    ("eq", 100.5, True),  # through its text: Decimal("100.5"), not the binary fraction
    ("eq", "100.50", True), ("eq", "100.5", True), ("gte", "100.500", True), ("gt", 100.5, False),
    ("lt", 100.51, True), ("ne", 100.5, False),
])
def test_numeric_against_numbers(operator: str, literal: Any, expected: bool) -> None:
    assert insert(where({"column": "amount", operator: literal})) is expected


def test_decimal_and_float_compare_by_text_not_binary() -> None:
    row = {**ROW, "amount": Decimal("0.1"), "price": 0.1}
    assert insert(where({"column": "amount", "eq": 0.1}), row)
    assert insert(where({"column": "price", "eq": "0.1"}), row)  # a float value, a numeric literal
    assert insert(where({"column": "price", "gt": 12}))
    assert not insert(where({"column": "price", "gt": 12.5}))
    nan = {**ROW, "amount": Decimal("NaN")}
    assert not insert(where({"column": "amount", "gt": 1}), nan)  # Decimal raises ordering NaN: false
    assert insert(where({"column": "amount", "ne": 1}), nan)


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "at", "gt": "2026-03-01T12:00:00Z"}, True),
    ({"column": "at", "eq": "2026-03-01T12:00:00.25Z"}, True),
    ({"column": "at", "eq": "2026-03-01T14:00:00.25+02:00"}, True),
    ({"column": "at", "lt": "2026-03-01T12:00:00"}, False),  # a naive literal against a timestamptz: UTC
    ({"column": "at", "gte": "2026-03-01"}, True),
    ({"column": "at", "lt": dt.date(2026, 3, 2)}, True),  # YAML's unquoted date
    ({"column": "at", "eq": dt.datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=dt.UTC)}, True),  # and timestamp
    ({"column": "local_at", "eq": "2026-03-01T12:00:00"}, True),
    ({"column": "local_at", "eq": "2026-03-01T13:00:00+01:00"}, True),  # an aware literal against a naive: in UTC
    ({"column": "local_at", "gt": "2026-03-01T12:00:00Z"}, False),
    ({"column": "day", "eq": "2026-03-01"}, True),
    ({"column": "day", "gt": "2026-02-28"}, True),
    ({"column": "day", "lt": dt.date(2026, 3, 1)}, False),
    ({"column": "at", "gt": "yesterday"}, False),
])
def test_timestamps_and_dates_against_iso_texts(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


def test_times() -> None:
    row = {**ROW, "note": dt.time(10, 30)}
    assert insert(where({"column": "note", "gt": "10:00:00"}), row)
    assert insert(where({"column": "note", "eq": "10:30"}), row)
    aware = {**ROW, "note": dt.time(10, 30, tzinfo=dt.UTC)}
    assert insert(where({"column": "note", "eq": "10:30:00"}), aware)  # a naive literal against a timetz: UTC
    assert not insert(where({"column": "note", "gt": "10:00:00+00:00"}), row)  # aware against naive: no comparison


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "ref", "eq": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}, True),
    ({"column": "ref", "eq": "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"}, True),  # read as a uuid, as Postgres would
    ({"column": "ref", "ne": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12"}, True),
    ({"column": "ref", "gt": "a0eebc99-0000-0000-0000-000000000000"}, True),
    ({"column": "ref", "lt": "a0eebc99"}, False),  # not a uuid: by text
    ({"column": "ref", "matches": "^a0eebc99-"}, True),
])
def test_uuids(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "flag", "eq": True}, True), ({"column": "flag", "eq": "TRUE"}, True),
    ({"column": "flag", "ne": "false"}, True), ({"column": "flag", "eq": 1}, False),
    ({"column": "flag", "gt": False}, True),
    ({"column": "status", "eq": "Paid"}, True), ({"column": "status", "eq": "paid"}, False),
    ({"column": "status", "gt": "Open"}, True), ({"column": "status", "lte": "Paid"}, True),
    ({"column": "tags", "eq": ["a", "b"]}, True), ({"column": "tags", "ne": ["a"]}, True),
    ({"column": "tags", "eq": '["a","b"]'}, True),  # else by text: its JSON text
    ({"column": "doc", "eq": {"Name": "Ann", "address": {"city": "Lyon", "zip": 69001}, "list": [1, 2]}}, True),
])
def test_booleans_texts_and_json(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


def test_a_text_against_a_number_compares_texts() -> None:
    assert insert(where({"column": "status", "eq": 7}), {**ROW, "status": "7"})
    assert insert(where({"column": "status", "eq": True}), {**ROW, "status": "true"})


# -- where: null, membership, matches ----------------------------------------------------------


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "note", "is_null": True}, True), ({"column": "note", "is_null": False}, False),
    ({"column": "status", "is_null": True}, False), ({"column": "status", "is_null": False}, True),
    ({"column": "note", "eq": None}, True), ({"column": "status", "eq": None}, False),
    ({"column": "note", "ne": None}, False), ({"column": "status", "ne": None}, True),
    ({"column": "note", "ne": "x"}, True), ({"column": "note", "eq": "x"}, False),
    ({"column": "note", "gt": 1}, False), ({"column": "note", "lte": 1}, False),
    ({"column": "note", "gt": None}, False),
    ({"column": "note", "matches": ".*"}, False),
    ({"column": "note", "in": [None, "x"]}, True), ({"column": "note", "in": ["x"]}, False),
    ({"column": "note", "not_in": ["x"]}, True), ({"column": "note", "not_in": [None]}, False),
])
def test_null(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "status", "in": ["Open", "Paid"]}, True), ({"column": "status", "in": ["paid"]}, False),
    ({"column": "status", "not_in": ["Open", "Paid"]}, False), ({"column": "status", "not_in": ["Open"]}, True),
    ({"column": "id", "in": [1, "7"]}, True), ({"column": "id", "in": [7.0]}, True),
    ({"column": "id", "in": ["seven", 8]}, False), ({"column": "id", "not_in": ["seven", 8]}, True),
    ({"column": "amount", "in": [100, "100.5"]}, True), ({"column": "amount", "not_in": [100, 200]}, True),
    ({"column": "at", "in": ["2026-03-01T12:00:00.25Z"]}, True),
    ({"column": "ref", "in": ["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"]}, True),
    ({"column": "flag", "in": ["true"]}, True),
])
def test_in_and_not_in_read_each_element_as_the_value(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "status", "matches": "^P"}, True), ({"column": "status", "matches": "^p"}, False),
    ({"column": "id", "matches": "^7$"}, True),
    ({"column": "amount", "matches": r"^100\.50$"}, True),
    ({"column": "at", "matches": "^2026-03-01T12:00:00.25"}, True),
    ({"column": "doc", "matches": '"city":"Lyon"'}, True),
])
def test_matches_searches_the_values_text(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|aa)+$", r"(.*a){20}$", r"^(\w+\s?)*$"])
def test_matches_takes_time_linear_in_the_value_whatever_the_pattern(pattern: str) -> None:
    """Patterns Python's re takes exponential time on (30 ``a`` and a ``!``: minutes to hours), over
    far longer values: RE2 never backtracks."""
    check = where({"column": "status", "matches": pattern})
    started = time.monotonic()
    for length in (30, 1_000, 100_000):
        assert not insert(check, {**ROW, "status": "a" * length + "!"})
    assert time.monotonic() - started < 2


def test_matches_compiles_its_pattern_once_per_process() -> None:
    first, second = where({"column": "status", "matches": "^P(a|i)"}), where({"column": "status", "matches": "^P(a|i)"})
    assert matches_pattern("^P(a|i)") is matches_pattern("^P(a|i)")
    assert insert(first) and insert(second)


@pytest.mark.parametrize(("pattern", "reason"), [
    (r"(\w+)\1", "invalid escape sequence: \\1"), (r"(?=a)b", "invalid perl operator: (?="),
    (r"(?<!a)b", "invalid perl operator: (?<"), (r"a++", "bad repetition operator: ++"), (r"x\Z", "invalid escape sequence: \\Z"),
    (r"(?x) a # b", "invalid perl operator: (?x"), (r"a{1001}", "invalid repetition size: {1001}"), (r"[a", "missing ]"),
])
def test_a_pattern_re2_cannot_read_is_refused_at_config_load(pattern: str, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        Condition.model_validate({"column": "status", "matches": pattern})
    (error,) = info.value.errors()
    assert error["loc"] == ("matches",)
    assert reason in error["msg"] and "walflow matches with RE2, which never backtracks" in error["msg"]


def test_unicode_classes_are_written_as_re2_writes_them() -> None:
    """RE2's ``\\d`` and ``\\w`` are ASCII (the README says so): ``\\p{Nd}`` and ``\\p{L}`` are Unicode's."""
    arabic = {**ROW, "status": "\u0663 caf\u00e9"}
    assert not insert(where({"column": "status", "matches": r"^\d"}), arabic)
    assert insert(where({"column": "status", "matches": r"^\p{Nd} \p{L}+$"}), arabic)
    assert insert(where({"column": "status", "matches": "(?i)^PAID$"}))


# -- where: paths, unknown values ----------------------------------------------------------------


@pytest.mark.parametrize(("condition", "expected"), [
    ({"column": "doc", "path": "address.city", "eq": "Lyon"}, True),
    ({"column": "doc", "path": "address.zip", "gte": 69000}, True),
    ({"column": "doc", "path": "address.zip", "eq": "69001"}, True),
    ({"column": "doc", "path": "address.street", "is_null": True}, True),  # missing: NULL
    ({"column": "doc", "path": "address.city.name", "is_null": True}, True),  # into a text: NULL
    ({"column": "doc", "path": "list.0", "is_null": True}, True),  # into an array: NULL
    ({"column": "status", "path": "x", "is_null": True}, True),  # not a JSON object
    ({"column": "doc", "path": "address.street", "ne": "x"}, True),
])
def test_paths_into_json(condition: dict[str, Any], expected: bool) -> None:
    assert insert(where(condition)) is expected


@pytest.mark.parametrize("condition", [
    {"eq": "x"}, {"ne": "x"}, {"gt": "x"}, {"gte": "x"}, {"lt": "x"}, {"lte": "x"}, {"in": ["x"]},
    {"not_in": ["x"]}, {"is_null": True}, {"is_null": False}, {"matches": ".*"}, {"eq": None}, {"ne": None},
    {"path": "a", "is_null": True},
])
def test_unchanged_toast_and_absent_columns_make_every_operator_false(condition: dict[str, Any]) -> None:
    check = where({"column": "note", **condition})
    assert not check("update", {**ROW, "note": UNCHANGED_TOAST}, {}, None)
    assert not check("update", {key: value for key, value in ROW.items() if key != "note"}, {}, None)


# -- where: old rows, changed, any ---------------------------------------------------------------


def test_old_reads_the_row_before_the_change() -> None:
    paid = where({"column": "status", "old": True, "eq": "Open"})
    old = {**ROW, "status": "Open"}
    assert paid("update", ROW, {"status": "Open"}, old)
    assert not paid("update", old, {}, ROW)
    assert not paid("update", ROW, {}, None)  # no old row
    assert not paid("update", ROW, {}, {"id": 7})  # a key-only old row: status unknown
    assert paid("delete", old, None, old)  # a delete's row is its old row
    assert not paid("insert", old, None, None)
    assert not paid("read", old, None, None)
    assert where({"column": "status", "old": True, "is_null": True})("update", ROW, {}, {**ROW, "status": None})


@pytest.mark.parametrize(("action", "changes", "old", "changed", "unchanged"), [
    ("update", {"status": "Open"}, {**ROW, "status": "Open"}, True, False),
    ("update", {"amount": Decimal(1)}, {**ROW, "amount": Decimal(1)}, False, True),
    ("update", {}, None, False, False),  # no old row: unknown
    ("update", {"id": 6}, {"id": 6}, False, False),  # a key-only old row: status unknown
    ("insert", None, None, False, False),
    ("delete", None, ROW, False, False),
    ("read", None, None, False, False),
])
def test_changed(action: str, changes: Row | None, old: Row | None, changed: bool, unchanged: bool) -> None:
    assert where({"column": "status", "changed": True})(action, ROW, changes, old) is changed
    assert where({"column": "status", "changed": False})(action, ROW, changes, old) is unchanged


def test_changed_false_holds_for_a_toasted_column_the_update_left_alone() -> None:
    untouched = where({"column": "note", "changed": False})
    assert untouched("update", {k: v for k, v in ROW.items() if k != "note"}, {}, {**ROW, "note": "long"})


def test_any_is_an_or_and_the_list_an_and() -> None:
    rows = where(
        {"any": [{"column": "status", "eq": "Open"}, {"column": "amount", "gt": 100},
                 {"any": [{"column": "flag", "eq": False}]}]},
        {"column": "id", "lt": 10},
    )
    assert insert(rows)
    assert not insert(rows, {**ROW, "id": 10})
    assert not insert(rows, {**ROW, "amount": Decimal(5)})
    assert insert(rows, {**ROW, "amount": Decimal(5), "flag": False})
    assert insert(rows, {**ROW, "amount": Decimal(5), "status": "Open"})


def test_where_and_filters_all_hold() -> None:
    rows = RowFilter([Condition.model_validate({"column": "id", "eq": 7})],
                     [ColumnFilter.model_validate({"column_name": "status", "operator": "=",
                                                   "comparison_value": "Paid"})], TABLE, PATH)
    assert insert(rows)
    assert not insert(rows, {**ROW, "id": 8})
    assert not insert(rows, {**ROW, "status": "Open"})


# -- errors at construction ------------------------------------------------------------------------


@pytest.mark.parametrize(("conditions", "key"), [
    ([{"column": "id", "eq": 1}, {"column": "stauts", "eq": "Paid"}], "where[1].column"),
    ([{"any": [{"column": "id", "eq": 1}, {"column": "stauts", "eq": "Paid"}]}], "where[0].any[1].column"),
    ([{"column": "stauts", "changed": True}], "where[0].column"),
])
def test_a_condition_on_a_column_the_table_does_not_have_is_refused(conditions: list[dict[str, Any]],
                                                                    key: str) -> None:
    with pytest.raises(FatalError) as caught:
        where(*conditions)
    assert str(caught.value) == (
        f"{PATH}.{key}: table public.orders has no column 'stauts' (its columns: {', '.join(COLUMNS)}): correct the "
        "name (a condition on a column the table does not have would drop every row)")


def test_a_filter_on_a_column_the_table_does_not_have_is_refused() -> None:
    with pytest.raises(FatalError, match=r"^sinks\[0\]\.tables\[2\]\.filters\[1\]\.column_name: table public\.orders "
                                         r"has no column 'stauts' \(its columns: id, status, .*correct the name"):
        sequin({"column_name": "id", "operator": "is null"},
               {"column_name": "stauts", "operator": "=", "comparison_value": "x"})


@pytest.mark.parametrize(("spec", "fix"), [
    ({"operator": ">", "comparison_value": "ten", "field_type": "number"}, "write a number"),
    ({"operator": "=", "comparison_value": "yes", "field_type": "boolean"}, "write true or false"),
    ({"operator": ">", "comparison_value": "2026-03-01T12:00:00", "field_type": "datetime"},
     "write an ISO 8601 timestamp with its offset"),
    ({"operator": ">", "comparison_value": dt.datetime(2026, 3, 1), "field_type": "datetime"},
     "write an ISO 8601 timestamp with its offset"),
    ({"operator": "=", "comparison_value": 12, "field_type": "string"}, "write a string"),
    ({"operator": "in", "comparison_value": 12}, "write a list ([a, b]) or a comma-separated string"),
    ({"operator": "not in", "comparison_value": None}, "write a list"),
    ({"operator": ">", "comparison_value": None}, "needs a comparison_value"),
    ({"operator": "=", "comparison_value": {"a": 1}}, "fits no column type"),
])
def test_a_literal_sequin_refuses_is_refused(spec: dict[str, Any], fix: str) -> None:
    with pytest.raises(FatalError) as caught:
        sequin({"column_name": "id", **spec})
    message = str(caught.value)
    assert message.startswith(f"{PATH}.filters[0].comparison_value: ")
    assert fix in message and "Sequin refuses" in message


# -- Sequin's column filters ---------------------------------------------------------------------


def sequin_insert(row: Row = ROW, **spec: Any) -> bool:
    return insert(sequin(spec), row)


@pytest.mark.parametrize(("operator", "value", "expected"), [
    ("=", 7, True), ("==", 7, True), ("=", "7", True), ("=", 8, False), ("!=", 8, True), ("!=", 7, False),
    (">", 6.5, True), (">", 7, False), (">=", 7, True), ("<", 7.5, True), ("<", "7", False), ("<=", 7, True),
])
def test_sequin_number_comparisons(operator: str, value: Any, expected: bool) -> None:
    assert sequin_insert(column_name="id", operator=operator, comparison_value=value) is expected
    assert sequin_insert(column_name="id", operator=operator, comparison_value=value, field_type="number") is expected


@pytest.mark.parametrize(("operator", "expected"), [(">", True), ("<", False), ("=", False), ("!=", True)])
def test_sequin_numeric_compares_as_a_number(operator: str, expected: bool) -> None:
    # Sequin's Decimal is a struct, which Elixir orders above every number (every amount > 100 there)
    assert sequin_insert(column_name="amount", operator=operator, comparison_value=100) is expected
    assert sequin_insert(column_name="amount", operator="=", comparison_value="100.5")
    tenth = {**ROW, "amount": Decimal("0.1")}  # through the float's text: not the binary fraction
    assert sequin_insert(column_name="amount", operator="=", comparison_value=0.1, row=tenth)
    assert not sequin_insert(column_name="amount", operator=">", comparison_value="0.1", row=tenth)


@pytest.mark.parametrize(("operator", "column", "expected"), [
    ("is null", "note", True), ("IS NULL", "note", True), ("is_null", "note", True), ("is null", "status", False),
    ("not null", "status", True), ("is not null", "status", True), ("not_null", "status", True),
    ("is_not_null", "status", True), ("IS NOT NULL", "note", False),
])
def test_sequin_null_operators(operator: str, column: str, expected: bool) -> None:
    assert sequin_insert(column_name=column, operator=operator, comparison_value="ignored") is expected


@pytest.mark.parametrize(("operator", "value", "expected"), [
    ("in", "Open,Paid", True), ("in", " [Open, Paid] ", True), ("in", "{Open,Paid}", True),
    ("in", "[[Open, Paid]]", True), ("in", "Open, paid", False), ("in", ["Open", "Paid"], True),
    ("not in", "Open,Paid", False), ("not_in", "Open", True), ("NOT IN", ["Paid"], False),
])
def test_sequin_in_splits_a_string_as_sequin_does(operator: str, value: Any, expected: bool) -> None:
    assert sequin_insert(column_name="status", operator=operator, comparison_value=value) is expected


@pytest.mark.parametrize(("column", "value", "expected"), [
    ("id", "1, 7", True),  # by text: "7"
    ("id", [7], True), ("id", [7.0], False),  # Elixir: 7 is not 7.0, and "7" is not "7.0"
    ("price", [12.5], True), ("price", "12.5", True),
    ("amount", "100.50", True), ("amount", "100.5", False),  # a numeric's text keeps its scale
    ("flag", "true,false", True), ("flag", [1], False),
    ("note", "a,", True),  # NULL's text is "": the empty element after the comma
    ("note", [None], True), ("note", ["a"], False),
    ("ref", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", True),
    ("at", ["2026-03-01 12:00:00.250000Z"], True),  # Elixir's to_string of a DateTime
    ("local_at", "2026-03-01 12:00:00.000000", True),
    ("day", "2026-03-01", True),
    ("tags", [["a", "b"]], True), ("tags", "a,b", False),  # a list matches by value only
    ("doc", "x", False),
])
def test_sequin_in_matches_by_value_or_by_text(column: str, value: Any, expected: bool) -> None:
    assert sequin_insert(column_name=column, operator="in", comparison_value=value) is expected
    assert sequin_insert(column_name=column, operator="not in", comparison_value=value) is not expected


def test_sequin_cistring_lowercases_both_sides() -> None:
    assert sequin_insert(column_name="status", operator="=", comparison_value="PAID", field_type="cistring")
    assert sequin_insert(column_name="status", operator=">", comparison_value="OPEN", field_type="cistring")
    assert not sequin_insert(column_name="status", operator="=", comparison_value="PAID", field_type="string")
    assert not sequin_insert(column_name="status", operator="=", comparison_value="PAID")  # a citext column too
    # in takes a list whatever field_type says: no lowercasing
    assert not sequin_insert(column_name="status", operator="in", comparison_value="PAID", field_type="cistring")


def test_sequin_cistring_does_not_lowercase_a_value_found_through_a_path() -> None:
    # Sequin's coerce_field_value lowercases the column's value only when it is a string itself
    assert not sequin_insert(column_name="doc", field_path="Name", operator="=", comparison_value="ann",
                             field_type="cistring")
    assert sequin_insert(column_name="doc", field_path="Name", operator="=", comparison_value="ANN",
                         field_type="cistring", row={**ROW, "doc": {"Name": "ann"}})


@pytest.mark.parametrize(("spec", "expected"), [
    ({"field_path": "address.city", "operator": "=", "comparison_value": "Lyon"}, True),
    ({"field_path": "address.zip", "operator": ">", "comparison_value": 69000, "field_type": "number"}, True),
    # without field_type a JSON column's literal is a string, as Sequin's jsonb → string: 69001 is not "69001"
    ({"field_path": "address.zip", "operator": "=", "comparison_value": "69001"}, False),
    ({"field_path": "address.street", "operator": "is null"}, True),
    ({"field_path": "address.city.x", "operator": "is null"}, True),
    ({"field_path": "list.0", "operator": "is null"}, True),
    ({"field_path": "", "operator": "=", "comparison_value": "x"}, False),
])
def test_sequin_field_path(spec: dict[str, Any], expected: bool) -> None:
    assert sequin_insert(column_name="doc", **spec) is expected


def test_sequin_field_path_on_a_value_that_is_not_a_map_compares_it_whole() -> None:
    assert sequin_insert(column_name="status", field_path="a.b", operator="=", comparison_value="Paid")
    assert sequin_insert(column_name="note", field_path="a", operator="is null")


@pytest.mark.parametrize(("column", "operator", "value", "expected"), [
    ("at", ">", "2026-03-01T11:59:59Z", True),
    ("at", "=", "2026-03-01T12:00:00.25Z", False),  # the literal is cut to whole seconds (Ecto's utc_datetime)
    ("at", ">", "2026-03-01T12:00:00.9Z", True),
    ("at", "<", "2026-03-01T14:00:01+02:00", True),
    ("local_at", "=", "2026-03-01T12:00:00Z", True),  # a naive timestamp is UTC
    ("local_at", "=", "2026-03-01T13:00:00+01:00", True),
    ("day", "=", "2026-03-01T00:00:00Z", True),  # a date is its midnight in UTC
    ("day", "<", "2026-03-01T00:00:01Z", True),
    ("status", "!=", "2026-03-01T00:00:00Z", False),  # not a timestamp: Sequin raises; false
    ("note", "!=", "2026-03-01T00:00:00Z", False),
])
def test_sequin_datetime(column: str, operator: str, value: str, expected: bool) -> None:
    assert sequin_insert(column_name=column, operator=operator, comparison_value=value,
                         field_type="datetime") is expected


def test_sequin_datetime_without_field_type_follows_the_value() -> None:
    assert sequin_insert(column_name="at", operator=">", comparison_value="2026-03-01T11:00:00Z")
    assert sequin_insert(column_name="day", operator="=", comparison_value="2026-03-01T00:00:00+00:00")
    assert not sequin_insert(column_name="at", operator=">", comparison_value="2026-03-01T11:00:00")  # no offset


@pytest.mark.parametrize(("value", "field_type", "expected"), [
    (True, None, True), ("TRUE", "boolean", True), ("false", None, False), ("true", "string", False),
])
def test_sequin_booleans(value: Any, field_type: str | None, expected: bool) -> None:
    assert sequin_insert(column_name="flag", operator="=", comparison_value=value, field_type=field_type) is expected


def test_sequin_a_boolean_is_not_a_number() -> None:
    assert not sequin_insert(column_name="id", operator="=", comparison_value=True, field_type="boolean",
                             row={**ROW, "id": 1})
    assert sequin_insert(column_name="id", operator="!=", comparison_value=True, field_type="boolean",
                         row={**ROW, "id": 1})


@pytest.mark.parametrize(("operator", "expected"), [
    ("=", False), ("!=", True), (">", False), ("<", False), (">=", False), ("<=", False),
])
def test_sequin_values_of_another_kind_are_unequal_and_unordered(operator: str, expected: bool) -> None:
    # Elixir would order a binary above every number ("Paid" > 5); here a comparison across kinds is false
    assert sequin_insert(column_name="status", operator=operator, comparison_value=5, field_type="number") is expected
    assert sequin_insert(column_name="note", operator=operator, comparison_value=5) is expected  # NULL
    assert sequin_insert(column_name="note", operator=operator, comparison_value=5,
                         row={**ROW, "note": UNCHANGED_TOAST}) is expected


def test_sequin_unchanged_toast_is_an_atom_that_is_not_null() -> None:
    toasted = {**ROW, "note": UNCHANGED_TOAST}
    assert sequin_insert(column_name="note", operator="not null", row=toasted)
    assert not sequin_insert(column_name="note", operator="is null", row=toasted)
    assert sequin_insert(column_name="note", operator="in", comparison_value="unchanged_toast", row=toasted)


def test_sequin_a_literal_that_does_not_fit_the_inferred_type_is_false() -> None:
    assert not sequin_insert(column_name="id", operator="=", comparison_value="seven")
    assert not sequin_insert(column_name="id", operator="!=", comparison_value="seven")


def test_sequin_uuid_compares_as_its_text() -> None:
    assert sequin_insert(column_name="ref", operator="=", comparison_value="a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert not sequin_insert(column_name="ref", operator="=", comparison_value="A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11")
    assert sequin_insert(column_name="ref", operator="=", comparison_value="A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
                         field_type="cistring")


def test_sequin_reads_a_deletes_old_row_and_a_missing_field_is_false() -> None:
    paid = sequin({"column_name": "status", "operator": "=", "comparison_value": "Paid"})
    open_row = {**ROW, "status": "Open"}
    assert paid("delete", open_row, None, ROW)
    assert not paid("delete", ROW, None, open_row)
    assert not paid("update", open_row, {}, ROW)
    for operator in ("is null", "not null", "!=", "not in"):
        missing = sequin({"column_name": "status", "operator": operator, "comparison_value": "x"})
        assert not missing("update", {"id": 7}, {}, None)
        assert not missing("delete", ROW, None, None)
