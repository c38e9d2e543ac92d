"""The Debezium envelope on hand-made changes: its keys in Debezium's order, rows, op codes, source fields; no servers."""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest

from config.schema import DatabaseConfig, SinkConfig
from core.events import UNCHANGED_TOAST, Action, Change, ReadOf, Row
from tests.transforms.samples import TS, TS_US, make_database, make_sink
from tests.transforms.test_envelope import EVERY_TYPE, ROW, ROW_JSON, make_change
from transforms.debezium import UNAVAILABLE, Debezium
from transforms.envelope import Envelope

#: When the tests' envelopes are rendered (ns since the epoch): 2027-01-15T07:26:40.123456789Z.
NOW_NS = 1_799_998_000_123_456_789
TS_MS = TS_US // 1000


def debezium(sink: SinkConfig | None = None, database: DatabaseConfig | None = None) -> Debezium:
    return Debezium(sink or make_sink(envelope="debezium"), database or make_database(), clock=lambda: NOW_NS)


def value(change: Change, before: Row | None, after: Row | None, step: Debezium | None = None) -> Any:
    """The change's value as a consumer parses it; a bare ``NaN``/``Infinity`` token fails the test."""
    payload = (step or debezium()).payload(change, before, after, b"a2V5")
    return json.loads(payload, parse_constant=lambda name: pytest.fail(f"bare {name} in {payload!r}"))


def test_an_insert_is_exactly_these_bytes() -> None:
    version = json.loads(debezium().payload(make_change(), None, ROW, b"k"))["source"]["version"]
    assert debezium().payload(make_change(), None, dict(ROW), b"k") == (
        b'{"before":null,"after":{"id":7,"status":"paid","amount":"12.50"},'
        b'"source":{"version":"' + version.encode() + b'","connector":"postgresql","name":"app",'
        b'"ts_ms":' + str(TS_MS).encode() + b',"snapshot":"false","db":"app","sequence":null,'
        b'"ts_us":' + str(TS_US).encode() + b',"ts_ns":' + str(TS_US * 1000).encode() + b','
        b'"schema":"public","table":"orders","txId":4711,"lsn":22150152,"xmin":null},'
        b'"op":"c","ts_ms":1799998000123,"ts_us":1799998000123456,"ts_ns":1799998000123456789,"transaction":null}'
    )


@pytest.mark.parametrize(("action", "op"), [("insert", "c"), ("update", "u"), ("delete", "d"), ("read", "r")])
def test_every_action_has_debeziums_keys_in_debeziums_order(action: Action, op: str) -> None:
    read = ReadOf("app-to-nats", "bf-1", '["7"]') if action == "read" else None
    change = make_change(action, old=dict(ROW) if action == "delete" else None, read=read)
    got = value(change, dict(ROW) if action == "delete" else None, None if action == "delete" else dict(ROW))
    assert list(got) == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"]
    assert list(got["source"]) == ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us",
                                   "ts_ns", "schema", "table", "txId", "lsn", "xmin"]
    assert got["op"] == op
    assert got["transaction"] is None


def test_an_update_with_the_old_row_has_it_as_before() -> None:
    old = dict(ROW, status="new", amount=Decimal("1E-8"))
    got = value(make_change("update", old=old), old, dict(ROW))
    assert got["before"] == {"id": 7, "status": "new", "amount": "0.00000001"}
    assert got["after"] == ROW_JSON
    assert got["op"] == "u"


def test_an_update_without_the_old_row_has_null_before() -> None:
    got = value(make_change("update"), None, dict(ROW))
    assert got["before"] is None
    assert got["after"] == ROW_JSON


def test_an_update_of_the_key_has_the_old_key_as_before() -> None:
    change = make_change("update", new={"id": 8, "status": "paid"}, old={"id": 7}, pks=("8",))
    got = value(change, {"id": 7}, {"id": 8, "status": "paid"})
    assert (got["before"], got["after"], got["op"]) == ({"id": 7}, {"id": 8, "status": "paid"}, "u")


def test_a_delete_under_default_identity_has_the_key_and_nulls_as_before() -> None:
    old = {"id": 7, "status": None, "amount": None}
    got = value(make_change("delete", old=old), old, None)
    assert got["before"] == {"id": 7, "status": None, "amount": None}
    assert got["after"] is None
    assert got["op"] == "d"


def test_a_delete_under_full_identity_has_the_whole_row_as_before() -> None:
    old = dict(ROW, at=dt.datetime(2024, 1, 2, 3, 4, 5))
    got = value(make_change("delete", old=old), old, None)
    assert got["before"] == dict(ROW_JSON, at="2024-01-02T03:04:05.000000")


def test_a_read_is_a_snapshot_row_without_a_transaction() -> None:
    change = make_change("read", read=ReadOf("app-to-nats", "bf-1", '["7"]'), lsn=900, idx=4)
    got = value(change, None, dict(ROW))
    assert (got["before"], got["after"], got["op"]) == (None, ROW_JSON, "r")
    assert got["source"]["snapshot"] == "true"
    assert got["source"]["txId"] is None  # a backfill's row is no transaction's change
    assert got["source"]["lsn"] == 900  # the chunk's watermark: where the read stands in the stream


def test_changes_of_the_log_are_not_snapshot_rows() -> None:
    for action in ("insert", "update", "delete"):
        change = make_change(action, old=dict(ROW) if action == "delete" else None)
        assert value(change, None, dict(ROW))["source"]["snapshot"] == "false"


def test_an_unchanged_toast_value_is_debeziums_placeholder() -> None:
    change = make_change("update", new={"id": 7, "body": UNCHANGED_TOAST})
    got = value(change, None, {"id": 7, "body": UNCHANGED_TOAST, "n": None})
    assert got["after"] == {"id": 7, "body": "__debezium_unavailable_value", "n": None}
    assert UNAVAILABLE == "__debezium_unavailable_value"
    before = {"id": 7, "body": UNCHANGED_TOAST}
    assert value(change, before, {"id": 7, "body": "new"})["before"] == {"id": 7, "body": UNAVAILABLE}
    assert before["body"] is UNCHANGED_TOAST  # the row itself is left untouched


def test_the_source_names_the_database_and_the_table() -> None:
    database = make_database(name="shop", database="shop_production", hostname="10.0.0.5")
    step = debezium(make_sink(database="shop", envelope="debezium"), database)
    ts = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    change = make_change(schema="Sales", table="line.items", lsn=2**40 + 5, ts=ts)._replace(xid=2**32 + 9)
    source = value(change, None, dict(ROW), step)["source"]
    micros = int((ts - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) / dt.timedelta(microseconds=1))
    assert source == {
        "version": source["version"],
        "connector": "postgresql",
        "name": "shop",  # Debezium's topic.prefix: the database's name in the config
        "ts_ms": micros // 1000,
        "snapshot": "false",
        "db": "shop_production",
        "sequence": None,
        "ts_us": micros,
        "ts_ns": micros * 1000,
        "schema": "Sales",
        "table": "line.items",
        "txId": 2**32 + 9,
        "lsn": 2**40 + 5,
        "xmin": None,
    }


def test_the_version_is_walflows() -> None:
    try:
        expected = version("walflow")
    except PackageNotFoundError:
        expected = "0"
    assert value(make_change(), None, dict(ROW))["source"]["version"] == expected


def test_the_envelopes_time_is_when_it_was_rendered() -> None:
    got = value(make_change(), None, dict(ROW))
    assert (got["ts_ms"], got["ts_us"], got["ts_ns"]) == (NOW_NS // 10**6, NOW_NS // 1000, NOW_NS)
    before = time.time_ns()
    rendered = json.loads(Debezium(make_sink(), make_database()).payload(make_change(), None, ROW, b"k"))
    assert before // 1000 <= rendered["ts_us"] <= time.time_ns() // 1000  # the real clock by default
    assert rendered["ts_ms"] == rendered["ts_us"] // 1000 and rendered["ts_ns"] // 1000 == rendered["ts_us"]


def test_values_are_walflows_sequin_encoding() -> None:
    step = debezium()
    after = value(make_change(key=("c_smallint",), new=EVERY_TYPE, pks=("32767",)), None, EVERY_TYPE, step)["after"]
    assert after == json.loads(Envelope(make_sink(), make_database()).encode_row(EVERY_TYPE))
    unix = debezium(make_sink(envelope="debezium", timestamp_format="unix_microsecond"))
    assert value(make_change(), None, {"id": 1, "at": TS}, unix)["after"] == {"id": 1, "at": TS_US}
    assert value(make_change(), None, {"id": 1, "at": TS}, unix)["source"]["ts_us"] == TS_US  # the commit's


def test_the_payload_is_written_for_each_table_apart() -> None:
    step = debezium()
    tables = [(p["source"]["schema"], p["source"]["table"]) for p in (
        value(make_change(schema=s, table=t), None, dict(ROW), step)
        for s, t in [("public", "orders"), ("sales", "orders"), ("public", "items"), ("public", "orders")])]
    assert tables == [("public", "orders"), ("sales", "orders"), ("public", "items"), ("public", "orders")]


def test_a_truncate_has_no_payload() -> None:
    with pytest.raises(ValueError, match="SinkFilter"):
        debezium().payload(make_change("truncate", new={}), None, None, b"k")
