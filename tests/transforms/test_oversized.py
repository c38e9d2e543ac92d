"""A value too large to publish (core/sizes.py) through every step that sees values, without
servers: each writes or treats its marker as documented, none raises on it."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from config.shaping import ColumnFilter, Columns, Condition
from core.events import OversizedValue
from tests.transforms.samples import make_sink, raw_change
from tests.transforms.test_debezium import value
from tests.transforms.test_envelope import make_change, record, render
from transforms.columns import ColumnShaper
from transforms.conditions import RowFilter
from transforms.envelope import encode_json
from transforms.group import GroupKey
from transforms.record import record_and_changes

BIG = OversizedValue.of(b"x" * 5_000_000)
SHOWN = "__walflow_oversized_value:5000000"


def test_the_envelope_writes_the_marker_as_a_string_in_the_values_place() -> None:
    assert record(BIG) == SHOWN
    assert record([BIG]) == [SHOWN]  # an array: the exact encoder's path
    # a row orjson does not write as the exact encoder would (a non-finite float) takes the exact path
    assert render(make_change(new={"id": 1, "v": BIG, "f": math.inf}))["record"] == {"id": 1, "v": SHOWN,
                                                                                     "f": "Infinity"}


def test_changes_reports_an_oversized_column_only_when_its_value_changed() -> None:
    other = OversizedValue.of(b"y" * 5_000_000)
    same = make_change("update", new={"id": 7, "v": BIG, "n": 2}, old={"id": 7, "v": BIG, "n": 1})
    changed = make_change("update", new={"id": 7, "v": other, "n": 1}, old={"id": 7, "v": BIG, "n": 1})
    assert record_and_changes(same)[1] == {"n": 1}
    assert record_and_changes(changed)[1] == {"v": BIG}
    assert render(changed)["changes"] == {"v": SHOWN}


def test_the_debezium_envelope_writes_walflows_marker() -> None:
    change = make_change(new={"id": 7, "v": BIG})
    assert value(change, None, change.new)["after"] == {"id": 7, "v": SHOWN}


def test_a_transforms_result_holding_the_marker_is_json() -> None:
    assert json.loads(encode_json({"record": {"v": BIG}})) == {"record": {"v": SHOWN}}


def test_masks_leave_the_marker_as_it_is() -> None:
    from tests.transforms.test_dispatch import typed_table

    columns = ColumnShaper(Columns.model_validate({"mask": {"status": "hash", "doc": "redact"},
                                                         "rename": {"amount": "total"}}),
                           "s3cret", typed_table(), "sinks[0].tables[0].columns")
    shaped = columns.row({"id": 7, "status": BIG, "amount": Decimal("1.5"), "doc": BIG})
    assert shaped == {"id": 7, "status": BIG, "total": Decimal("1.5"), "doc": BIG}


def test_a_condition_on_an_oversized_value_is_unknown_and_a_sequin_filter_sees_its_text() -> None:
    from tests.transforms.test_dispatch import typed_table

    table = typed_table()
    where = RowFilter([Condition.model_validate({"column": "status", "eq": "paid"})], [], table, "sinks[0]")
    not_null = RowFilter([Condition.model_validate({"column": "status", "is_null": False})], [], table, "sinks[0]")
    assert not where("insert", {"status": BIG}, None, None)
    assert not not_null("insert", {"status": BIG}, None, None)  # unknown: every operator false
    assert where("insert", {"status": "paid"}, None, None)
    sequin = RowFilter([], [ColumnFilter(column_name="status", operator="==", comparison_value=SHOWN)], table,
                       "sinks[0]")
    assert sequin("insert", {"status": BIG}, None, None)  # the text it is published as


def test_a_group_column_holding_a_marker_still_groups() -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["tenant"]}]))
    change: Any = raw_change(new={"id": b"7", "tenant": BIG})
    assert key(change) == key(raw_change(new={"id": b"8", "tenant": OversizedValue.of(b"x" * 5_000_000)}))
    assert key(change) != key(raw_change(new={"id": b"7", "tenant": b"eu"}))
