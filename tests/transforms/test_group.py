"""The group key: made from the group columns' texts, before any value is converted."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.events import UNCHANGED_TOAST
from tests.transforms.samples import make_sink, raw_change
from transforms.group import GroupKey

ROOT = Path(__file__).resolve().parents[2]


def test_group_key_is_the_primary_key_by_default() -> None:
    key = GroupKey(make_sink())
    assert key(raw_change(new={"id": b"7", "status": b"paid"})) == 'public.orders:["7"]'
    update = raw_change("update", new={"id": b"7", "status": b"sent"}, idx=1)
    delete = raw_change("delete", columns=("status",), old={"id": b"7"}, old_is_key=True, idx=2)
    assert key(update) == key(delete) == 'public.orders:["7"]'
    assert key(raw_change(new={"id": b"8", "status": b"paid"})) == 'public.orders:["8"]'


def test_group_key_of_a_composite_key_follows_the_key_column_order() -> None:
    change = raw_change(table="items", key=("order_id", "line"), new={"line": b"b", "order_id": b"7", "qty": b"1"})
    assert GroupKey(make_sink())(change) == 'public.items:["7","b"]'


def test_null_and_any_text_are_kept_apart() -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.t", "group_column_names": ["a", "b"]}]))
    assert key(raw_change(table="t", new={"a": None, "b": b"x"})) == 'public.t:[null,"x"]'
    assert key(raw_change(table="t", new={"a": b"null", "b": b"x"})) == 'public.t:["null","x"]'
    assert key(raw_change(table="t", new={"a": b'",', "b": b""})) == 'public.t:["\\",",""]'


def test_configured_group_columns_replace_the_key_for_their_table_only() -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["account_id", "region"]}]))
    row = {"id": b"7", "account_id": b"42", "region": b"eu"}
    assert key(raw_change(new=row)) == 'public.orders:["42","eu"]'
    assert key(raw_change("update", new={**row, "id": b"8"})) == 'public.orders:["42","eu"]'
    assert key(raw_change(table="items", new=row)) == 'public.items:["7"]'
    assert key(raw_change(schema="app", new=row)) == 'app.orders:["7"]'


def test_a_table_entry_without_group_columns_groups_by_the_key() -> None:
    """Sequin's ``tables: [{name}]`` without ``group_column_names``: the primary key."""
    key = GroupKey(make_sink(tables=[{"name": "public.orders"}]))
    assert key(raw_change(new={"id": b"7", "account_id": b"42"})) == 'public.orders:["7"]'


def test_legacy_table_and_group_column_names() -> None:
    key = GroupKey(make_sink(table="public.orders", group_column_names=["account_id"]))
    assert key(raw_change(new={"id": b"7", "account_id": b"42"})) == 'public.orders:["42"]'


def test_tables_entry_wins_over_the_legacy_form_for_the_same_table() -> None:
    key = GroupKey(make_sink(table="public.orders", group_column_names=["account_id"],
                             tables=[{"name": "public.orders", "group_column_names": ["region"]}]))
    assert key(raw_change(new={"id": b"7", "account_id": b"42", "region": b"eu"})) == 'public.orders:["eu"]'


def test_deletes_are_grouped_by_their_old_row() -> None:
    """Under REPLICA IDENTITY FULL the old row has the group column: a delete joins its row's group."""
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["account_id"]}]))
    row = {"id": b"7", "account_id": b"42"}
    assert key(raw_change("delete", old=row)) == key(raw_change(new=row)) == 'public.orders:["42"]'


def test_missing_group_column_falls_back_to_present_key_columns(caplog: pytest.LogCaptureFixture) -> None:
    """REPLICA IDENTITY DEFAULT: a delete carries only the key; it is grouped by it, with one warning."""
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["account_id"]}]))
    with caplog.at_level(logging.WARNING, logger="walflow.transforms.group"):
        first = key(raw_change("delete", columns=("account_id",), old={"id": b"7"}, old_is_key=True))
        second = key(raw_change("delete", columns=("account_id",), old={"id": b"8"}, old_is_key=True))
    assert (first, second) == ('public.orders:["7"]', 'public.orders:["8"]')
    assert len(caplog.records) == 1
    assert "public.orders lacks group column(s) account_id" in caplog.records[0].getMessage()
    assert "REPLICA IDENTITY FULL" in caplog.records[0].getMessage()


def test_a_group_column_the_table_does_not_have_falls_back_too(caplog: pytest.LogCaptureFixture) -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["gone"]}]))
    with caplog.at_level(logging.WARNING, logger="walflow.transforms.group"):
        assert key(raw_change(new={"id": b"7"})) == 'public.orders:["7"]'
    assert "lacks group column(s) gone" in caplog.records[0].getMessage()


def test_untouched_toast_group_column_uses_the_old_value_or_falls_back() -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.docs", "group_column_names": ["body"]}]))
    full = raw_change("update", table="docs", new={"id": b"1", "body": UNCHANGED_TOAST},
                      old={"id": b"1", "body": b"x"})
    assert key(full) == key(raw_change(table="docs", new={"id": b"1", "body": b"x"})) == 'public.docs:["x"]'
    default = raw_change("update", table="docs", new={"id": b"1", "body": UNCHANGED_TOAST})
    assert key(default) == 'public.docs:["1"]'
    key_only = raw_change("update", table="docs", new={"id": b"2", "body": UNCHANGED_TOAST},
                          old={"id": b"1"}, old_is_key=True)
    assert key(key_only) == 'public.docs:["2"]'  # a key-only old row has no body either


def test_without_message_grouping_each_change_is_its_own_group() -> None:
    key = GroupKey(make_sink(message_grouping=False))
    first = raw_change(new={"id": b"7"}, lsn=100, idx=0)
    second = raw_change("update", new={"id": b"7"}, lsn=100, idx=1)
    assert (key(first), key(second)) == ("100:0", "100:1")


def test_table_without_key_columns_is_one_group() -> None:
    key = GroupKey(make_sink())
    assert key(raw_change(table="log", key=(), new={"line": b"a"})) == "public.log:[]"
    assert key(raw_change(table="log", key=(), new={"line": b"b"})) == "public.log:[]"


def test_group_key_is_the_same_in_every_process() -> None:
    """Made from texts, never from ``hash()``: processes with other hash seeds agree."""
    new = {"id": "1234567890.123456789012345678901234567890", "ts": "2024-01-02 03:04:05.123456+00", "s": "héllo"}
    script = (
        "import sys\n"
        "from tests.transforms.samples import make_sink, raw_change\n"
        "from transforms.group import GroupKey\n"
        "new = {name: value.encode() for name, value in zip(('id', 'ts', 's'), sys.argv[1:], strict=True)}\n"
        "print(GroupKey(make_sink())(raw_change(table='t', key=('id', 'ts', 's'), new=new)))\n"
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script, *new.values()], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
        keys.add(out.stdout.rstrip("\n"))
    assert keys == {'public.t:["1234567890.123456789012345678901234567890","2024-01-02 03:04:05.123456+00","héllo"]'}


def test_texts_that_are_not_utf8_still_make_a_key() -> None:
    """A SQL_ASCII database sends any bytes: the key is then made from their base64."""
    key = GroupKey(make_sink())
    first = key(raw_change(new={"id": b"\xff\xfe"}))
    assert first == 'public.orders:["__4="]' and key(raw_change("update", new={"id": b"\xff\xfe"})) == first


def test_one_plan_per_table_however_many_versions_come_by() -> None:
    """Every session and every DDL brings a new version of a table: the cache does not grow with them."""
    key = GroupKey(make_sink())
    for n in range(50):
        assert key(raw_change(new={"id": str(n).encode()})) == f'public.orders:["{n}"]'
    assert len(key._plans) == 1
