"""The envelope on hand-made changes: Sequin's payload, field for field, and the idempotency id; no servers.

Payloads are compared after ``json.loads`` (what a consumer sees; key order does not
matter), except :func:`test_insert_payload_is_exactly_these_bytes`, which pins the bytes
so that a formatting regression shows.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import enum
import json
import logging
import math
import pickle
import re
import uuid
from decimal import Decimal
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError, to_json

from config.schema import DatabaseConfig, SinkConfig
from connectors.postgres.types import json_loads
from core.events import UNCHANGED_TOAST, Action, Change, JsonText, ReadOf, Row
from core.ids import IdScheme
from core.message import Message
from tests.transforms.samples import TS, TS_US, make_database, make_sink
from transforms.envelope import Envelope, NotJSON, derived_id, encode_json, iso_usec
from transforms.record import record_and_changes

#: The ids ``make_sink()`` and ``make_database()`` get without an ``id``: pinned, since
#: consumers may store them ("stable across runs and machines", and across versions).
CONSUMER_ID = "e119200a-11f1-58f5-a8fa-54cd7b75a525"
DATABASE_ID = "d23609d4-2403-5bc3-877f-00e8149991e1"

ROW: Row = {"id": 7, "status": "paid", "amount": Decimal("12.50")}
ROW_JSON: dict[str, Any] = {"id": 7, "status": "paid", "amount": "12.50"}

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def make_change(
    action: Action = "insert",
    *,
    schema: str = "public",
    table: str = "orders",
    key: tuple[str, ...] = ("id",),
    new: Row | None = None,
    old: Row | None = None,
    lsn: int = 22150152,
    idx: int = 0,
    ts: dt.datetime = TS,
    read: ReadOf | None = None,
    annotations: bytes | None = None,
    pks: tuple[str, ...] = ("7",),
) -> Change:
    """A converted change as :func:`transforms.convert.convert` hands it to the envelope."""
    if new is None and action in ("insert", "update", "read"):
        new = dict(ROW)
    return Change(action, schema, table, key, new, old, lsn, idx, ts, 4711, read, annotations, pks)


def envelope(sink: SinkConfig | None = None, database: DatabaseConfig | None = None) -> Envelope:
    return Envelope(sink or make_sink(), database or make_database())


def render(change: Change, sink: SinkConfig | None = None, database: DatabaseConfig | None = None) -> Any:
    """The payload of ``change`` as a consumer parses it; a bare ``NaN``/``Infinity`` token fails the test."""
    payload = envelope(sink, database)(change).payload
    return json.loads(payload, parse_constant=lambda name: pytest.fail(f"bare {name} in {payload!r}"))


def record(value: Any, sink: SinkConfig | None = None) -> Any:
    """How ``value`` appears in ``record`` as column ``v``."""
    return render(make_change(new={"id": 1, "v": value}), sink)["record"]["v"]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- the payload's shape -----------------------------------------------------------------


def test_insert_payload_is_exactly_these_bytes() -> None:
    message = envelope()(make_change(idx=3))
    key = _b64("app/app-to-nats/22150152:3")
    assert message.payload == (
        b'{"record":{"id":7,"status":"paid","amount":"12.50"},"changes":null,"action":"insert",'
        b'"metadata":{"database_name":"app","table_schema":"public","table_name":"orders",'
        b'"commit_timestamp":"2026-11-30T04:00:00.123456Z","commit_lsn":22150152,"commit_idx":3,'
        b'"idempotency_key":"' + key.encode() + b'","record_pks":["7"],"transaction_annotations":null,'
        b'"enrichment":null,'
        b'"consumer":{"id":"' + CONSUMER_ID.encode() + b'","name":"app-to-nats","annotations":{}},'
        b'"database":{"id":"' + DATABASE_ID.encode() + b'","name":"app","annotations":{},"database":"app",'
        b'"hostname":"db.internal"}}}'
    )
    # addressed on the default subject, counted by table and action, the commit's Unix time for
    # commit → ack latency, no headers of its own
    assert message == Message(b"sequin.app.public.orders.insert", message.payload, key, ("public.orders", "insert"),
                              1796011200.123456)
    assert message.msg_id == key


def test_the_contracts_update_example_field_for_field() -> None:
    """``shared/CONTRACT.md``'s example: REPLICA IDENTITY FULL, status changed from 'new' to 'paid'."""
    message = envelope()(make_change("update", old=dict(ROW, status="new")))
    assert json.loads(message.payload) == {
        "record": {"id": 7, "status": "paid", "amount": "12.50"},
        "changes": {"status": "new"},
        "action": "update",
        "metadata": {
            "database_name": "app",
            "table_schema": "public",
            "table_name": "orders",
            "commit_timestamp": "2026-11-30T04:00:00.123456Z",
            "commit_lsn": 22150152,
            "commit_idx": 0,
            "idempotency_key": _b64("app/app-to-nats/22150152:0"),
            "record_pks": ["7"],
            "transaction_annotations": None,
            "enrichment": None,
            "consumer": {"id": CONSUMER_ID, "name": "app-to-nats", "annotations": {}},
            "database": {"id": DATABASE_ID, "name": "app", "annotations": {}, "database": "app",
                         "hostname": "db.internal"},
        },
    }
    assert (message.subject, message.labels) == (b"sequin.app.public.orders.update", ("public.orders", "update"))


@pytest.mark.parametrize("action", ["insert", "update", "delete", "read"])
def test_every_action_has_exactly_sequins_keys(action: Action) -> None:
    old = dict(ROW) if action == "delete" else None
    read = ReadOf("app-to-nats", "b1", '["7"]') if action == "read" else None
    payload = render(make_change(action, old=old, read=read))
    assert list(payload) == ["record", "changes", "action", "metadata"]
    assert payload["action"] == action
    metadata = payload["metadata"]
    assert set(metadata) == {
        "database_name", "table_schema", "table_name", "commit_timestamp", "commit_lsn", "commit_idx",
        "idempotency_key", "record_pks", "transaction_annotations", "enrichment", "consumer", "database",
    }
    assert set(metadata["consumer"]) == {"id", "name", "annotations"}
    assert set(metadata["database"]) == {"id", "name", "annotations", "database", "hostname"}
    assert metadata["enrichment"] is None


def test_metadata_fields_come_from_the_change_sink_and_database() -> None:
    sink = make_sink(name="s2", database="crm", id="1c9f0e5e-sink", annotations={"team": "billing", "tier": 1})
    database = make_database(name="crm", id="5d2a-db", annotations={"env": ["prod"]}, database="crm_prod",
                             hostname="pg.example.com")
    change = make_change(schema="sales", table="line_items", lsn=2**40 + 5, idx=12, ts=dt.datetime(2026, 1, 2, 3, 4, 5,
                         120000, tzinfo=dt.UTC), annotations=b'{"user": "yahya"}', pks=("7", "x y"))
    assert render(change, sink, database)["metadata"] == {
        "database_name": "crm",
        "table_schema": "sales",
        "table_name": "line_items",
        "commit_timestamp": "2026-01-02T03:04:05.120000Z",
        "commit_lsn": 2**40 + 5,
        "commit_idx": 12,
        "idempotency_key": _b64(f"crm/s2/{2**40 + 5}:12"),
        "record_pks": ["7", "x y"],
        "transaction_annotations": {"user": "yahya"},
        "enrichment": None,
        "consumer": {"id": "1c9f0e5e-sink", "name": "s2", "annotations": {"team": "billing", "tier": 1}},
        "database": {"id": "5d2a-db", "name": "crm", "annotations": {"env": ["prod"]}, "database": "crm_prod",
                     "hostname": "pg.example.com"},
    }


def test_names_are_cached_per_table_and_action_without_mixing_them_up() -> None:
    step = envelope()
    changes = [
        make_change(),
        make_change("delete", old=dict(ROW)),
        make_change(schema="sales"),
        make_change(table="items"),
        make_change("update"),
        make_change(),
    ]
    seen = [(p["action"], p["metadata"]["table_schema"], p["metadata"]["table_name"])
            for p in (json.loads(step(c).payload) for c in changes)]
    assert seen == [("insert", "public", "orders"), ("delete", "public", "orders"), ("insert", "sales", "orders"),
                    ("insert", "public", "items"), ("update", "public", "orders"), ("insert", "public", "orders")]


def test_message_carries_its_subject_escaped_and_its_labels_unescaped() -> None:
    message = envelope()(make_change("delete", schema="Sales", table="line.items", old={"id": 1}))
    assert message.subject == b"sequin.app.Sales.line%2Eitems.delete"
    assert message.labels == ("Sales.line.items", "delete")
    metadata = json.loads(message.payload)["metadata"]
    assert (metadata["table_schema"], metadata["table_name"]) == ("Sales", "line.items")


# -- record and changes ------------------------------------------------------------------


def test_insert_and_read_have_the_new_row_and_null_changes() -> None:
    for action in ("insert", "read"):
        payload = render(make_change(action, read=ReadOf("s", "b", "[7]") if action == "read" else None))
        assert payload["record"] == ROW_JSON
        assert payload["changes"] is None


def test_update_with_full_old_row_reports_the_changed_columns() -> None:
    old = {"id": 7, "status": "new", "amount": Decimal("0.00000001")}
    payload = render(make_change("update", old=old))
    assert payload["record"] == ROW_JSON
    assert payload["changes"] == {"status": "new", "amount": "0.00000001"}  # old values, rendered as values


def test_update_without_old_row_has_empty_changes_not_null() -> None:
    message = envelope()(make_change("update"))
    assert b'"changes":{},' in message.payload
    payload = json.loads(message.payload)
    assert payload["changes"] == {}
    assert payload["record"] == ROW_JSON


def test_update_that_changed_the_key_reports_the_old_key() -> None:
    change = make_change("update", new={"id": 8, "status": "paid"}, old={"id": 7}, pks=("8",))
    payload = render(change)
    assert payload["changes"] == {"id": 7}
    assert payload["record"] == {"id": 8, "status": "paid"}
    assert payload["metadata"]["record_pks"] == ["8"]


def test_full_update_that_changed_nothing_has_empty_changes() -> None:
    row = {"id": 7, "x": float("nan"), "n": Decimal("NaN"), "s": "same", "d": Decimal("1.0")}
    change = make_change("update", new=row, old=dict(row, x=float("nan"), n=Decimal("NaN"), d=Decimal("1.0")))
    assert render(change)["changes"] == {}


def test_a_column_that_became_nan_or_stopped_being_nan_changed() -> None:
    new = {"id": 7, "x": float("nan"), "n": Decimal(1), "y": 2.0}
    old = {"id": 7, "x": 1.5, "n": Decimal("NaN"), "y": float("nan")}
    assert render(make_change("update", new=new, old=old))["changes"] == {"x": 1.5, "n": "NaN", "y": "NaN"}


def test_a_column_that_became_null_changed_and_its_old_value_is_reported() -> None:
    new = {"id": 7, "a": None, "b": 1}
    old = {"id": 7, "a": "x", "b": None}
    assert render(make_change("update", new=new, old=old))["changes"] == {"a": "x", "b": None}


def test_an_array_holding_nan_that_stayed_the_same_did_not_change() -> None:
    row = {"id": 7, "f": [1.0, float("nan")], "d": [Decimal("NaN")], "s": "new"}
    change = make_change("update", new=row, old=dict(row, f=[1.0, float("nan")], d=[Decimal("NaN")], s="old"))
    assert render(change)["changes"] == {"s": "old"}


def test_unchanged_toast_under_full_identity_is_filled_from_the_old_row() -> None:
    big = "x" * 10_000
    change = make_change(
        "update",
        new={"id": 7, "status": "paid", "body": UNCHANGED_TOAST, "n": UNCHANGED_TOAST},
        old={"id": 7, "status": "new", "body": big, "n": Decimal("1E-8")},
    )
    payload = render(change)
    assert payload["record"] == {"id": 7, "status": "paid", "body": big, "n": "0.00000001"}  # detoasted, rendered
    assert payload["changes"] == {"status": "new"}  # body, n: not known to have changed, left out


def test_unchanged_toast_without_old_value_is_sequins_marker() -> None:
    step = envelope()
    default = make_change("update", new={"id": 7, "body": UNCHANGED_TOAST})
    assert json.loads(step(default).payload)["record"] == {"id": 7, "body": "unchanged_toast"}
    key_change = make_change("update", new={"id": 8, "body": UNCHANGED_TOAST}, old={"id": 7})
    payload = json.loads(step(key_change).payload)
    assert payload["record"] == {"id": 8, "body": "unchanged_toast"}
    assert payload["changes"] == {"id": 7}


def test_delete_under_default_identity_is_the_old_row_the_converter_filled() -> None:
    """convert fills the columns Postgres did not send with None (Sequin's record): the envelope renders old as is."""
    message = envelope()(make_change("delete", old={"id": 7, "status": None, "amount": None}))
    assert message.payload.startswith(
        b'{"record":{"id":7,"status":null,"amount":null},"changes":null,"action":"delete","metadata":{'
    )
    assert message.labels == ("public.orders", "delete")


def test_delete_under_full_identity_holds_the_whole_row() -> None:
    old = {"id": 7, "status": "paid", "amount": Decimal("12.50"), "at": dt.datetime(2024, 1, 2, 3, 4, 5), "note": None}
    payload = render(make_change("delete", old=old))
    assert payload["record"] == {"id": 7, "status": "paid", "amount": "12.50", "at": "2024-01-02T03:04:05.000000",
                                 "note": None}
    assert payload["changes"] is None
    assert payload["action"] == "delete"


def test_truncate_has_no_envelope() -> None:
    with pytest.raises(ValueError, match="SinkFilter"):
        envelope()(make_change("truncate", new={}))


def test_the_change_itself_is_left_untouched() -> None:
    new = {"id": 7, "n": Decimal("1E-8"), "at": dt.datetime(2024, 1, 2, tzinfo=dt.UTC), "t": UNCHANGED_TOAST,
           "ns": [Decimal("1E-8"), None], "ats": [[dt.datetime(2024, 1, 2)]], "i": {"months": 1, "days": 0,
                                                                                   "microseconds": 0}}
    old = {"id": 7, "n": Decimal("2E-8"), "at": dt.datetime(2024, 1, 3, tzinfo=dt.UTC), "t": "toasted",
           "ns": [Decimal("2E-8")], "ats": [[dt.datetime(2024, 1, 3)]], "i": {"months": 2, "days": 0,
                                                                            "microseconds": 0}}
    change = make_change("update", new=new, old=old, annotations=b'{"a": 1}')
    before = pickle.dumps(change)
    for sink in (make_sink(), make_sink(timestamp_format="unix_microsecond")):
        Envelope(sink, make_database())(change)
    assert pickle.dumps(change) == before
    assert change.new is new and change.new["t"] is UNCHANGED_TOAST
    assert type(change.new["n"]) is Decimal and type(change.old["ats"][0][0]) is dt.datetime  # type: ignore[index]


def test_a_row_that_needs_no_rewriting_is_rendered_as_is() -> None:
    row = {"id": 7, "s": "x", "f": 1.5, "b": False, "j": {"a": [1, None, "z"]}, "l": ["a", None], "e": [], "z": None}
    assert render(make_change(new=row))["record"] == row


# -- values ------------------------------------------------------------------------------

EVERY_TYPE: Row = {
    "c_smallint": 32767,
    "c_bigint": 9223372036854775807,
    "c_numeric": Decimal("1234567890.123456789012345678901234567890"),
    "c_numeric_scale": Decimal("0.00000000"),
    "c_numeric_tiny": Decimal("1E-8"),
    "c_numeric_nan": Decimal("NaN"),
    "c_numeric_inf": Decimal("Infinity"),
    "c_numeric_array": [Decimal("1.10"), None, Decimal("-1E-20")],
    "c_real": 1.5,
    "c_double": 0.1,
    "c_nan": float("nan"),
    "c_inf": float("inf"),
    "c_minus_inf": float("-inf"),
    "c_bool": True,
    "c_text": 'héllo ✓ \\ "quoted"\n\u2028',
    "c_bytea": "\\xfbffbf00",  # the source loads Postgres's hex text
    "c_bytea_array": [None, "\\xfbff", "\\x61"],
    "c_date": dt.date(2024, 2, 29),
    "c_time": dt.time(23, 59, 59, 999999),
    "c_timetz": dt.time(12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    "c_ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
    "c_ts_whole": dt.datetime(2024, 1, 2, 3, 4, 5),
    "c_tstz": dt.datetime(2024, 1, 2, 1, 4, 5, 120000, tzinfo=dt.UTC),
    "c_tstz_whole": dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=dt.UTC),
    "c_tstz_array": [None, dt.datetime(2024, 1, 2, tzinfo=dt.UTC), dt.datetime(2024, 1, 2, 0, 0, 0, 1, tzinfo=dt.UTC)],
    "c_interval": {"months": 14, "days": 3, "microseconds": 14706789000},
    "c_interval_array": [{"months": 0, "days": 0, "microseconds": -1}, None],
    "c_uuid": uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    "c_json": {"a": [1, 2.5, None]},
    "c_jsonb": {"b": {"c": "d"}, "n": 12345678901234567890},
    "c_json_array": [{"x": 1}, [1, 2], "s"],
    "c_inet": "192.168.0.1/24",
    "c_inet_mapped": "::ffff:1.2.3.4",
    "c_cidr": "10.0.0.0/8",
    "c_macaddr": "08:00:2b:01:02:03",
    "c_int_array": [1, None, 3],
    "c_int_matrix": [[1, 2], [3, 4]],
    "c_text_array": ["a,b", 'c"d', None],
    "c_empty_array": [],
    "c_mood": "happy",
    "c_int4range": "[1,10)",
    "c_tstzrange": '["2024-01-01 00:00:00+00","2024-02-01 00:00:00+00")',
    "c_emptyrange": "empty",
    "c_range_array": ["[1,3)", "[5,)"],
    "c_multirange": "{[1,3),[5,7)}",
    "c_int2vector": "1 2 3",
    "c_point": "(1,2)",
    "c_pair": '(7,"x y")',
    "c_infinity_date": "infinity",  # convert's text fallback
    "c_null": None,
}

EVERY_TYPE_JSON: dict[str, Any] = {
    "c_numeric": "1234567890.123456789012345678901234567890",
    "c_numeric_scale": "0.00000000",
    "c_numeric_tiny": "0.00000001",
    "c_numeric_nan": "NaN",
    "c_numeric_inf": "Infinity",
    "c_numeric_array": ["1.10", None, "-0.00000000000000000001"],
    "c_nan": "NaN",
    "c_inf": "Infinity",
    "c_minus_inf": "-Infinity",
    "c_date": "2024-02-29",
    "c_time": "23:59:59.999999",
    "c_timetz": "12:00:00+05:30",
    "c_ts": "2024-01-02T03:04:05.123456",
    "c_ts_whole": "2024-01-02T03:04:05.000000",
    "c_tstz": "2024-01-02T01:04:05.120000Z",
    "c_tstz_whole": "2024-01-02T01:04:05.000000Z",
    "c_tstz_array": [None, "2024-01-02T00:00:00.000000Z", "2024-01-02T00:00:00.000001Z"],
    "c_uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    **{name: EVERY_TYPE[name] for name in (
        "c_smallint", "c_bigint", "c_real", "c_double", "c_bool", "c_text", "c_bytea", "c_bytea_array",
        "c_interval", "c_interval_array", "c_json", "c_jsonb", "c_json_array", "c_inet", "c_inet_mapped",
        "c_cidr", "c_macaddr", "c_int_array", "c_int_matrix", "c_text_array", "c_empty_array", "c_mood",
        "c_int4range", "c_tstzrange", "c_emptyrange", "c_range_array", "c_multirange", "c_int2vector",
        "c_point", "c_pair", "c_infinity_date", "c_null",
    )},  # JSON holds these as they are
}


def test_every_value_type_round_trips() -> None:
    payload = render(make_change(key=("c_smallint",), new=EVERY_TYPE, pks=("32767",)))
    got = payload["record"]
    assert got == EVERY_TYPE_JSON
    assert list(got) == list(EVERY_TYPE)  # column order kept
    assert Decimal(got["c_numeric"]) == EVERY_TYPE["c_numeric"]
    assert Decimal(got["c_numeric_scale"]).as_tuple() == EVERY_TYPE["c_numeric_scale"].as_tuple()  # scale kept
    assert dt.datetime.fromisoformat(got["c_tstz"]) == EVERY_TYPE["c_tstz"]
    assert dt.datetime.fromisoformat(got["c_ts"]) == EVERY_TYPE["c_ts"]
    assert bytes.fromhex(got["c_bytea"].removeprefix("\\x")) == b"\xfb\xff\xbf\x00"


def test_bytea_intervals_and_ranges_pass_through_as_the_source_loaded_them() -> None:
    row = {
        "id": 1,
        "b": "\\x0102",
        "empty_b": "\\x",
        "i": {"months": -13, "days": 40, "microseconds": 3_600_000_001},
        "r": "[1.5,2.5]",
        "mr": "{}",
        "rs": ['["2024-01-01 00:00:00",)', "empty"],
    }
    message = envelope()(make_change(new=row))
    assert b'"b":"\\\\x0102"' in message.payload  # one backslash in the string, escaped in JSON
    assert json.loads(message.payload)["record"] == row


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "2024-01-02T03:04:05.000000Z"),
        (dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05.000000"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 120000, tzinfo=dt.UTC), "2024-01-02T03:04:05.120000Z"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 120000), "2024-01-02T03:04:05.120000"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 1, tzinfo=dt.UTC), "2024-01-02T03:04:05.000001Z"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 999999), "2024-01-02T03:04:05.999999"),
        (dt.datetime(2024, 1, 2, tzinfo=dt.timezone(dt.timedelta(0))), "2024-01-02T00:00:00.000000Z"),
        (dt.datetime(1, 1, 1), "0001-01-01T00:00:00.000000"),
        (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC), "9999-12-31T23:59:59.999999Z"),
        (dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=dt.UTC), "1969-12-31T23:59:59.000000Z"),
    ],
)
def test_timestamps_always_have_six_fractional_digits(value: dt.datetime, text: str) -> None:
    assert record(value) == text
    assert record([value]) == [text]
    assert record([None, value, None]) == [None, text, None]
    assert record([[value], [None]]) == [[text], [None]]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("1E-8"), "0.00000001"),
        (Decimal("0.00000001"), "0.00000001"),
        (Decimal("-1E-20"), "-0.00000000000000000001"),
        (Decimal("12.50"), "12.50"),
        (Decimal("0E-10"), "0.0000000000"),
        (Decimal("-0"), "-0"),
        (Decimal(100), "100"),
        (Decimal("123456789012345678901234567890.000000000000000000001"),
         "123456789012345678901234567890.000000000000000000001"),
        (Decimal("NaN"), "NaN"),
        (Decimal("Infinity"), "Infinity"),
        (Decimal("-Infinity"), "-Infinity"),
    ],
)
def test_numerics_are_positional_digit_strings(value: Decimal, text: str) -> None:
    assert record(value) == text
    assert record([value, None]) == [text, None]
    assert record([None, [value]]) == [None, [text]]
    assert record(value, make_sink(timestamp_format="unix_microsecond")) == text


@pytest.mark.parametrize(("value", "text"), [(float("nan"), "NaN"), (float("inf"), "Infinity"),
                                             (float("-inf"), "-Infinity")])
def test_non_finite_floats_are_strings(value: float, text: str) -> None:
    assert record(value) == text  # render() fails on a bare NaN/Infinity token
    assert record([1.0, value]) == [1.0, text]


def test_non_finite_annotations_are_strings_as_everywhere_else() -> None:
    sink = make_sink(annotations={"ratio": float("nan"), "cap": float("inf")})
    database = make_database(annotations={"floor": float("-inf")})
    metadata = render(make_change(), sink, database)["metadata"]
    assert metadata["consumer"]["annotations"] == {"ratio": "NaN", "cap": "Infinity"}
    assert metadata["database"]["annotations"] == {"floor": "-Infinity"}


def test_unknown_objects_fall_back_to_their_text() -> None:
    class Box:
        def __str__(self) -> str:
            return "(0,0),(1,1)"

    assert record(Box()) == "(0,0),(1,1)"
    assert record([Box(), None]) == ["(0,0),(1,1)", None]


# -- timestamps and timestamp_format -----------------------------------------------------


def test_commit_timestamp_is_utc_with_six_fractional_digits() -> None:
    step = envelope()
    whole = dt.datetime(2026, 11, 30, 4, 0, tzinfo=dt.UTC)
    east = dt.datetime(2026, 11, 30, 6, 0, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    west_whole = dt.datetime(2026, 11, 29, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-4, minutes=-30)))
    small = dt.datetime(2026, 11, 30, 4, 0, 0, 50, tzinfo=dt.UTC)
    stamps = [json.loads(step(make_change(ts=ts)).payload)["metadata"]["commit_timestamp"]
              for ts in (TS, whole, east, TS, TS, west_whole, small, whole)]  # changing, repeated: the cache
    assert stamps == ["2026-11-30T04:00:00.123456Z", "2026-11-30T04:00:00.000000Z", "2026-11-30T04:00:00.000005Z",
                      "2026-11-30T04:00:00.123456Z", "2026-11-30T04:00:00.123456Z", "2026-11-30T04:00:00.000000Z",
                      "2026-11-30T04:00:00.000050Z", "2026-11-30T04:00:00.000000Z"]


def test_unix_microsecond_format_applies_to_record_and_changes_only() -> None:
    new = {
        "id": 1,
        "tstz": TS,
        "ts": TS.replace(tzinfo=None),  # without time zone: read as UTC
        "whole": TS.replace(microsecond=0),
        "before_epoch": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        "epoch": dt.datetime(1970, 1, 1),
        "tstz_array": [None, TS],
        "matrix": [[TS.replace(tzinfo=None)]],
        "d": dt.date(2024, 2, 29),
        "t": dt.time(1, 2, 3),
        "n": Decimal("1E-8"),
        "r": '["2024-01-01 00:00:00+00",)',
    }
    old = dict(new, tstz=TS.replace(microsecond=0), ts=None)
    sink = make_sink(timestamp_format="unix_microsecond")
    payload = render(make_change("update", new=new, old=old), sink)
    assert payload["metadata"]["commit_timestamp"] == "2026-11-30T04:00:00.123456Z"  # stays ISO, as in Sequin
    assert payload["record"] == {
        "id": 1,
        "tstz": TS_US,
        "ts": TS_US,
        "whole": TS_US - 123456,
        "before_epoch": -1,
        "epoch": 0,
        "tstz_array": [None, TS_US],
        "matrix": [[TS_US]],
        "d": "2024-02-29",
        "t": "01:02:03",
        "n": "0.00000001",
        "r": '["2024-01-01 00:00:00+00",)',
    }
    assert payload["changes"] == {"tstz": TS_US - 123456, "ts": None}


def test_iso8601_timestamps_in_changes_have_six_fractional_digits() -> None:
    new = {"id": 1, "at": dt.datetime(2024, 1, 2, 3, 4, 6, tzinfo=dt.UTC)}
    old = {"id": 1, "at": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}
    payload = render(make_change("update", new=new, old=old))
    assert payload["changes"] == {"at": "2024-01-02T03:04:05.000000Z"}
    assert payload["record"]["at"] == "2024-01-02T03:04:06.000000Z"


# -- record_pks and transaction annotations ----------------------------------------------


@pytest.mark.parametrize("pks", [(), ("7",), ("7", "2024-01-02 03:04:05+00", 'a "b"', "unchanged_toast")])
def test_record_pks_are_the_changes_pks_as_strings(pks: tuple[str, ...]) -> None:
    assert render(make_change(pks=pks))["metadata"]["record_pks"] == list(pks)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (b'{ "username": "yahya" }', {"username": "yahya"}),
        (b'{"a": {"b": [1, 2.5, null, true]}, "s": "h\\u00e9 \xe2\x9c\x93", "n": -9223372036854775808}',
         {"a": {"b": [1, 2.5, None, True]}, "s": "hé ✓", "n": -9223372036854775808}),
        (b"{}", {}),
        (b'  {"x": 1}\n', {"x": 1}),
    ],
)
def test_transaction_annotations_are_the_parsed_json(text: bytes, parsed: Any) -> None:
    assert render(make_change(annotations=text))["metadata"]["transaction_annotations"] == parsed


def test_no_transaction_annotations_are_null() -> None:
    message = envelope()(make_change(annotations=None))
    assert b'"transaction_annotations":null,' in message.payload


@pytest.mark.parametrize("text", [b"{ invalid json }", b"", b'{"a": NaN}', b'{"a": 1', b"\xff", b'{"a": 1} x'])
def test_invalid_transaction_annotations_are_null_with_one_warning(
    text: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    step = envelope()
    with caplog.at_level(logging.WARNING, logger="walflow.envelope"):
        # three changes of one transaction: one warning for its annotations, not one per change
        payloads = [json.loads(step(make_change(idx=i, annotations=text)).payload) for i in range(3)]
    assert [p["metadata"]["transaction_annotations"] for p in payloads] == [None, None, None]
    warnings = [r for r in caplog.records if r.name == "walflow.envelope"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "annotations" in warnings[0].getMessage()


def test_annotations_follow_each_change_across_transactions(caplog: pytest.LogCaptureFixture) -> None:
    """The per-transaction cache never hands one transaction's annotations to another."""
    step = envelope()
    texts = [b'{"t": 1}', b'{"t": 1}', None, b'{"t": 2}', b"bad", b'{"t": 2}', b'{"t": ' + b'1}', None, b"bad"]
    with caplog.at_level(logging.WARNING, logger="walflow.envelope"):
        got = [json.loads(step(make_change(idx=i, annotations=t)).payload)["metadata"]["transaction_annotations"]
               for i, t in enumerate(texts)]
    assert got == [{"t": 1}, {"t": 1}, None, {"t": 2}, None, {"t": 2}, {"t": 1}, None, None]
    assert len([r for r in caplog.records if r.name == "walflow.envelope"]) == 1  # once per process, not per text


def test_annotations_keep_integers_beyond_64_bits_exact() -> None:
    text = b'{"n": 123456789012345678901234567890, "m": -18446744073709551617}'
    annotations = render(make_change(annotations=text))["metadata"]["transaction_annotations"]
    assert annotations == {"n": 123456789012345678901234567890, "m": -18446744073709551617}


# -- consumer and database ----------------------------------------------------------------


def test_consumer_and_database_ids_default_to_stable_uuids_derived_from_the_names() -> None:
    metadata = render(make_change())["metadata"]
    assert metadata["consumer"] == {"id": CONSUMER_ID, "name": "app-to-nats", "annotations": {}}
    assert metadata["database"] == {"id": DATABASE_ID, "name": "app", "annotations": {}, "database": "app",
                                    "hostname": "db.internal"}
    assert derived_id("consumer", "app", "app-to-nats") == CONSUMER_ID
    assert derived_id("database", "app") == DATABASE_ID
    for text in (CONSUMER_ID, DATABASE_ID):
        assert str(uuid.UUID(text)) == text and uuid.UUID(text).version == 5
    # another envelope (another run, another worker) derives the same
    assert render(make_change())["metadata"]["consumer"]["id"] == CONSUMER_ID


def test_derived_ids_differ_per_sink_and_database() -> None:
    def ids(sink: str, database: str) -> tuple[str, str]:
        payload = render(make_change(), make_sink(name=sink, database=database), make_database(name=database))
        metadata = payload["metadata"]
        return metadata["consumer"]["id"], metadata["database"]["id"]

    consumer, database = ids("app-to-nats", "app")
    other_sink = ids("audit", "app")
    other_database = ids("app-to-nats", "crm")
    assert other_sink[0] != consumer and other_sink[1] == database  # same database, same database id
    assert other_database[0] != consumer and other_database[1] != database
    assert len({consumer, database, *other_sink, *other_database}) == 5
    assert derived_id("consumer", "app") != derived_id("database", "app")  # kinds apart


def test_derived_ids_of_names_holding_a_slash_cannot_collide() -> None:
    assert derived_id("consumer", "a/b", "c") != derived_id("consumer", "a", "b/c")


def test_configured_ids_and_annotations_are_used_as_given() -> None:
    sink = make_sink(id="0b7a6d1e-3f0c-4c1f-9d47-6ad1c9a8e2f1", annotations={"team": "billing", "tags": ["a"]})
    database = make_database(id="b5a1f3d2-sequin", annotations={"region": "eu"})
    metadata = render(make_change(), sink, database)["metadata"]
    assert metadata["consumer"] == {"id": "0b7a6d1e-3f0c-4c1f-9d47-6ad1c9a8e2f1", "name": "app-to-nats",
                                    "annotations": {"team": "billing", "tags": ["a"]}}
    assert metadata["database"] == {"id": "b5a1f3d2-sequin", "name": "app", "annotations": {"region": "eu"},
                                    "database": "app", "hostname": "db.internal"}


def test_database_name_and_postgres_database_are_apart() -> None:
    database = make_database(name="shop", database="shop_production", hostname="10.0.0.5")
    metadata = render(make_change(), make_sink(database="shop"), database)["metadata"]
    assert metadata["database_name"] == "shop"
    assert (metadata["database"]["name"], metadata["database"]["database"], metadata["database"]["hostname"]) == (
        "shop", "shop_production", "10.0.0.5")


# -- idempotency ---------------------------------------------------------------------------


def test_ids_are_the_id_schemes_and_decode_back_to_the_position() -> None:
    message = envelope(make_sink(name="s/1", database="my db"), make_database(name="my db"))(
        make_change(lsn=2**40, idx=9))
    ids = IdScheme("my db", "s/1")
    assert message.msg_id == ids.encode(2**40, 9).decode("ascii")
    assert ids.decode(message.msg_id) == (2**40, 9)
    assert IdScheme("my db", "s").decode(message.msg_id) is None  # another sink's
    assert json.loads(message.payload)["metadata"]["idempotency_key"] == message.msg_id


def test_a_reads_id_names_the_backfill_and_the_row() -> None:
    read = ReadOf("app-to-nats", "bf-1", '["7"]')
    message = envelope()(make_change("read", read=read, lsn=900, idx=4))
    ids = IdScheme("app", "app-to-nats")
    assert message.msg_id == ids.encode_read("bf-1", '["7"]').decode("ascii")
    assert base64.b64decode(message.msg_id) == b'app/app-to-nats/read/bf-1/["7"]'
    assert ids.is_read(message.msg_id) and ids.decode(message.msg_id) is None  # names no position
    payload = json.loads(message.payload)
    assert payload["metadata"]["idempotency_key"] == message.msg_id
    assert (payload["metadata"]["commit_lsn"], payload["metadata"]["commit_idx"]) == (900, 4)
    assert message.commit_ts == 0.0  # a read has no commit that latency could be measured from
    # the same row read by another chunk at another position: the same id
    assert envelope()(make_change("read", read=read, lsn=950, idx=0)).msg_id == message.msg_id


def test_idempotency_key_is_stable_and_unique_per_change_sink_and_database() -> None:
    change = make_change(lsn=500, idx=2)

    def key(sink_name: str, database: str, change: Change) -> str:
        message = envelope(make_sink(name=sink_name, database=database), make_database(name=database))(change)
        assert message.msg_id == json.loads(message.payload)["metadata"]["idempotency_key"]
        return message.msg_id

    first = key("s1", "app", change)
    assert base64.b64decode(first, validate=True) == b"app/s1/500:2"
    assert key("s1", "app", pickle.loads(pickle.dumps(change))) == first  # a replay names it the same
    assert key("s1", "app", make_change("update", lsn=500, idx=2)) == first  # the position names it, not the row
    others = [
        key("s2", "app", change),  # another sink into the same stream is not a duplicate
        key("s1", "crm", change),  # nor is another database at the same LSN
        key("s1", "app", make_change(lsn=500, idx=3)),
        key("s1", "app", make_change(lsn=501, idx=2)),
        key("s1", "app", make_change(lsn=50, idx=12)),  # "50:12" vs "501:2"
        key("c", "a/b", change),  # names holding '/' cannot collide ...
        key("b/c", "a", change),  # ... with each other
    ]
    assert len({first, *others}) == 1 + len(others)


def test_sequin_msg_id_is_sequins_key() -> None:
    sink = make_sink(destination={"type": "nats", "host": "nats", "msg_id": "sequin"})
    message = envelope(sink)(make_change(lsn=22150152, idx=3))
    assert message.msg_id == _b64("22150152:3")
    assert json.loads(message.payload)["metadata"]["idempotency_key"] == message.msg_id


# -- properties ----------------------------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_AWARE = st.datetimes(timezones=st.just(dt.UTC))
_NAIVE = st.datetimes()


@given(st.dictionaries(_TEXT, _JSONISH, max_size=8))
def test_plain_values_round_trip(row: Row) -> None:
    assert render(make_change(new=row))["record"] == row


@given(_AWARE)
def test_aware_timestamps_read_back_exactly_with_six_digits_and_z(value: dt.datetime) -> None:
    text = record(value)
    assert text == value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", text)
    assert dt.datetime.fromisoformat(text) == value


@given(_NAIVE)
def test_naive_timestamps_read_back_exactly_with_six_digits(value: dt.datetime) -> None:
    text = record(value)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}", text)
    assert dt.datetime.fromisoformat(text) == value


@given(_AWARE | _NAIVE)
def test_unix_microseconds_read_back_exactly(value: dt.datetime) -> None:
    micros = record(value, make_sink(timestamp_format="unix_microsecond"))
    assert type(micros) is int
    assert _EPOCH + dt.timedelta(microseconds=micros) == value.replace(tzinfo=dt.UTC)


@given(st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1),
                    timezones=st.builds(dt.timezone, st.integers(-14 * 60, 14 * 60).map(
                        lambda m: dt.timedelta(minutes=m)))))
def test_commit_timestamp_is_always_iso_utc_with_six_digits(ts: dt.datetime) -> None:
    for sink in (make_sink(), make_sink(timestamp_format="unix_microsecond")):
        text = render(make_change(ts=ts), sink)["metadata"]["commit_timestamp"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", text)
        assert dt.datetime.fromisoformat(text) == ts


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_numerics_read_back_exactly_without_exponent(value: Decimal) -> None:
    text = record(value)
    assert re.fullmatch(r"-?\d+(\.\d+)?", text), text
    assert Decimal(text) == value
    if value.as_tuple().exponent <= 0:  # type: ignore[operator]  # what numeric_out gives: the scale kept
        assert Decimal(text).as_tuple() == value.as_tuple()


_ROW_VALUES = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["a", "b"]), st.booleans(),
                        st.sampled_from([Decimal("1.0"), Decimal("1.00"), Decimal("NaN"), Decimal("1E-8")]),
                        st.sampled_from([0.5, 1.0, float("nan")]),
                        st.sampled_from([{"a": 1}, {"a": 1.0}, {"a": True}, [1, 2], [1.0, 2]]))


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), st.tuples(_ROW_VALUES, _ROW_VALUES)))
def test_changes_are_the_old_values_that_differ_strictly_as_in_sequin(columns: dict[str, tuple[Any, Any]]) -> None:
    new = {"id": 1, **{name: after for name, (_, after) in columns.items()}}
    old = {"id": 1, **{name: before for name, (before, _) in columns.items()}}

    def same(before: Any, after: Any) -> bool:
        """Sequin's strict equality: the same type and the same text; NaN stays NaN."""
        return type(before) is type(after) and repr(before) == repr(after)

    expected = {name: before for name, (before, after) in columns.items() if not same(before, after)}
    changes = render(make_change("update", new=new, old=old))["changes"]
    assert changes == render(make_change(new=expected))["record"]


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**31))
def test_every_position_has_its_own_id_that_decodes_back(lsn: int, idx: int) -> None:
    message = envelope()(make_change(lsn=lsn, idx=idx))
    assert IdScheme("app", "app-to-nats").decode(message.msg_id) == (lsn, idx)
    metadata = json.loads(message.payload)["metadata"]
    assert (metadata["commit_lsn"], metadata["commit_idx"], metadata["idempotency_key"]) == (lsn, idx, message.msg_id)


# -- the two encoders --------------------------------------------------------------------

def one_type(values: list[Any]) -> list[Any]:
    """A Postgres array: elements of one type, NULLs among them."""
    kind = next((type(value) for value in values if value is not None), None)
    return [value for value in values if value is None or type(value) is kind]


_ZONES = st.sampled_from([None, dt.UTC, ZoneInfo("UTC"), ZoneInfo("Europe/Amsterdam"),  # +00:19:32 before 1937
                          dt.timezone(dt.timedelta(hours=5, minutes=30)),
                          dt.timezone(-dt.timedelta(hours=5, minutes=30, seconds=7)),
                          dt.timezone(dt.timedelta(microseconds=-3))])
#: Any text, lone surrogates included (which neither encoder writes).
_ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["null", "nullnull", "2024-01-02T03:04:05", "x T12:00:00Z", "T12:00:00.123456+", "unchanged_toast"])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**64), 2**64), st.floats(), _ANY_TEXT, st.decimals(),
    st.datetimes(timezones=_ZONES), st.datetimes(), st.datetimes(timezones=st.just(dt.UTC)).map(
        lambda value: value.replace(microsecond=0)),
    st.dates(), st.times(), st.times(timezones=_ZONES), st.uuids(), st.just(UNCHANGED_TOAST), st.binary(max_size=4),
    st.timedeltas(),
)
#: What the source makes of a column: a scalar, an array (elements of one type, any
#: number of dimensions) or a json value (which ``1e400`` can make infinite).
_VALUES = _SCALARS | st.recursive(
    st.lists(_SCALARS, max_size=3).map(one_type), lambda inner: st.lists(inner, max_size=3), max_leaves=8
) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)


def exact(step: Envelope, row: Row) -> bytes:
    """What the exact encoder writes for ``row`` (the bytes before orjson took part)."""
    return to_json(step._row(row), inf_nan_mode="strings", fallback=str)


@pytest.mark.parametrize("timestamp_format", ["iso8601", "unix_microsecond"])
@given(row=st.dictionaries(_ANY_TEXT, _VALUES, max_size=6))
def test_rows_are_the_exact_encoders_bytes(timestamp_format: str, row: Row) -> None:
    step = envelope(make_sink(timestamp_format=timestamp_format))
    try:
        expected = exact(step, row)
    except PydanticSerializationError:
        with pytest.raises(PydanticSerializationError):  # a lone surrogate: refused either way
            step.encode_row(row)
    else:
        assert step.encode_row(row) == expected


def test_a_typical_row_is_encoded_without_the_exact_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's rows (and a delete's, with NULLs) take orjson's way, else the speed-up is gone unseen
    (a json value holding null takes the exact way: its nulls are not the columns' NULLs)."""
    step = envelope()
    monkeypatch.setattr("transforms.envelope._json", lambda _: pytest.fail("the exact encoder ran"))
    row = {"id": 7, "s": "5f2b9c1e", "n": Decimal("123456.78"), "ts": dt.datetime(2026, 12, 1, 19, 0, 0, 123456,
           tzinfo=dt.UTC), "j": {"client": 1, "tag": "bench", "l": [1.5]}, "at": dt.datetime(2026, 12, 1, 1, 2, 3, 4),
           "f": [1.0, 2.5], "d": dt.date(2024, 1, 2), "t": dt.time(1, 2, 3, 456789), "u": uuid.UUID(int=5), "b": True}
    for change in (make_change(new=row), make_change("delete", old=dict.fromkeys(row) | {"id": 7}),
                   make_change("update", new=row, old=dict(row, n=Decimal(1)))):
        step(change)


@pytest.mark.parametrize(("row", "text"), [
    ({"id": 7, "x": float("nan")}, b'"x":"NaN"'),
    ({"id": 7, "x": None, "l": [None, float("inf")]}, b'"l":[null,"Infinity"]'),
    ({"id": 7, "j": {"a": -math.inf}}, b'"j":{"a":"-Infinity"}'),
    ({"id": 7, "ts": dt.datetime(2024, 1, 2, 3, 4, 5)}, b'"ts":"2024-01-02T03:04:05.000000"'),
    ({"id": 7, "t": dt.time(0, 0, 0, 10000)}, b'"t":"00:00:00.010000"'),  # orjson 3.11: "00:00:00.10000"
    ({"id": 7, "n": 2**64}, b'"n":18446744073709551616'),
])
def test_rows_orjson_would_write_otherwise_take_the_exact_encoder(row: Row, text: bytes) -> None:
    step = envelope()
    assert step.encode_row(row) == exact(step, row)
    assert text in step.encode_row(row)


@pytest.mark.parametrize("zone", [None, dt.UTC, ZoneInfo("UTC"), ZoneInfo("Europe/Amsterdam"), dt.timezone(dt.timedelta(0)),
                                  dt.timezone(dt.timedelta(seconds=1)), dt.timezone(-dt.timedelta(hours=8))])
def test_timestamps_and_times_of_every_fraction_boundary_are_the_exact_encoders(zone: dt.tzinfo | None) -> None:
    """Which timestamps orjson writes otherwise is decided on the values (_inexact_times), not found
    in its output: every kind of fraction and offset, alone, in an array, beside another value."""
    step = envelope()
    for micros in (0, 1, 9_999, 10_000, 10_001, 99_999, 100_000, 123_456, 999_999):
        for year in (1900, 2026):
            stamp = dt.datetime(year, 12, 4, 3, 55, 37, micros, tzinfo=zone)
            values: list[Any] = [stamp, [stamp, None], [[stamp]], "12:00:00"]
            if zone is None:
                values.append(dt.time(3, 55, 37, micros))
            for value in values:
                row = {"id": 7, "v": value, "at": dt.datetime(2026, 1, 1, 0, 0, 0, 5)}
                assert step.encode_row(row) == exact(step, row), (value, zone)


@given(st.datetimes(timezones=st.sampled_from([dt.UTC, ZoneInfo("UTC"), dt.timezone(dt.timedelta(hours=-3))])))
def test_commit_timestamps_are_rendered_as_before(ts: dt.datetime) -> None:
    _, rendered, committed = envelope()._commit_time(ts)
    assert rendered == to_json(iso_usec(ts.astimezone(dt.UTC)))
    assert committed == ts.timestamp()


@given(st.decimals())
def test_numerics_are_the_exact_encoders_digits(value: Decimal) -> None:
    step = envelope()
    assert step.encode_row({"n": value}) == exact(step, {"n": value})


# -- shaped messages: the parts render shapes ------------------------------------------------

_TOASTED = {"id": 7, "status": "paid", "body": UNCHANGED_TOAST}
#: Changes as the envelope meets them: every action, old rows or not, TOAST, reads, annotations.
SAMPLES: dict[str, Change] = {
    "insert": make_change(idx=3),
    "update_full": make_change("update", old=dict(ROW, status="new", amount=Decimal("0.00000001"))),
    "update_without_old_row": make_change("update"),
    "update_of_the_key": make_change("update", new={"id": 8, "status": "paid"}, old={"id": 7}, pks=("8",)),
    "toast_filled": make_change("update", new=_TOASTED, old={"id": 7, "status": "new", "body": "x" * 3000}),
    "toast_marker": make_change("update", new=_TOASTED),
    "toast_marker_key_change": make_change("update", new=dict(_TOASTED, id=8), old={"id": 7}, pks=("8",)),
    "delete_default_identity": make_change("delete", old={"id": 7, "status": None, "amount": None}),
    "delete_full_identity": make_change("delete", old=dict(ROW, at=dt.datetime(2024, 1, 2, 3, 4, 5))),
    "read": make_change("read", read=ReadOf("app-to-nats", "bf-1", '["7"]'), lsn=900, idx=4),
    "annotated": make_change(annotations=b'{"user": "yahya", "n": 123456789012345678901234567890}'),
    "annotations_not_json": make_change(annotations=b"{ invalid json }"),
    "no_key": make_change(key=(), pks=()),
    "every_type": make_change(key=("c_smallint",), new=EVERY_TYPE, pks=("32767",)),
    "other_zone": make_change(ts=dt.datetime(2026, 11, 30, 6, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))),
}
SINKS: dict[str, SinkConfig] = {
    "default": make_sink(),
    "unix_microsecond": make_sink(timestamp_format="unix_microsecond"),
    "sequin_ids": make_sink(destination={"type": "nats", "host": "nats", "msg_id": "sequin"}),
}


def shaped_as_is(step: Envelope, change: Change) -> bytes:
    """``change``'s payload from unshaped parts, as render builds them without shaping."""
    record, changes = record_and_changes(change)
    return step.shaped(change, record, changes, change.pks, step.key(change))


@pytest.mark.parametrize("sink", SINKS.values(), ids=SINKS.keys())
@pytest.mark.parametrize("change", SAMPLES.values(), ids=SAMPLES.keys())
def test_shaped_from_unshaped_parts_is_the_unshaped_payload_byte_for_byte(change: Change, sink: SinkConfig) -> None:
    step = envelope(sink)
    message = step(change)
    assert shaped_as_is(step, change) == message.payload
    assert step.key(change).decode("ascii") == message.msg_id
    assert shaped_as_is(envelope(sink), change) == message.payload  # a fresh envelope: no cache decides it


@given(row=st.dictionaries(_TEXT, _VALUES.filter(lambda value: not _surrogate(value)), max_size=6),
       action=st.sampled_from(["insert", "read", "delete", "update"]))
def test_shaped_from_unshaped_parts_is_the_unshaped_payload_for_any_row(row: Row, action: Action) -> None:
    change = make_change(action, new=None if action == "delete" else row, old=row if action != "insert" else None,
                         read=ReadOf("s", "b", "[1]") if action == "read" else None)
    step = envelope()
    assert shaped_as_is(step, change) == step(change).payload


def test_shaped_writes_the_parts_it_is_given() -> None:
    step = envelope(make_sink(timestamp_format="unix_microsecond"))
    change = make_change("update", new=_TOASTED, old={"id": 7, "status": "new", "body": "detoasted"}, pks=("7",))
    enrichment = {"id": 7, "tier": "gold", "since": dt.datetime(2024, 1, 2, tzinfo=dt.UTC), "limit": Decimal("1E+3")}
    payload = json.loads(step.shaped(change, {"order_id": 7, "body": UNCHANGED_TOAST}, {"state": "new"}, ("h4sh",),
                                     step.read_key("bf-1", '["h4sh"]'), enrichment))
    assert payload["record"] == {"order_id": 7, "body": "unchanged_toast"}  # as given: not filled from the old row
    assert payload["changes"] == {"state": "new"}
    metadata = payload["metadata"]
    assert metadata["record_pks"] == ["h4sh"]
    assert base64.b64decode(metadata["idempotency_key"]) == b'app/app-to-nats/read/bf-1/["h4sh"]'
    # Sequin enriches after converting record and changes: the enrichment's timestamps stay ISO
    assert metadata["enrichment"] == {"id": 7, "tier": "gold", "since": "2024-01-02T00:00:00.000000Z", "limit": "1000"}
    assert list(payload) == ["record", "changes", "action", "metadata"]
    assert list(metadata) == list(render(change)["metadata"])


def test_shaped_refuses_a_truncate_and_a_non_json_enrichment() -> None:
    step = envelope()
    with pytest.raises(ValueError, match="SinkFilter"):
        step.shaped(make_change("truncate", new={}), {}, None, (), b"k")
    with pytest.raises(NotJSON, match=r"a set at \['tags'\] is not JSON"):
        step.shaped(make_change(), dict(ROW), None, ("7",), b"k", {"tags": {"a"}})


def test_keys_are_the_messages_ids() -> None:
    step = envelope()
    ids = IdScheme("app", "app-to-nats")
    assert step.key(make_change(lsn=5, idx=2)) == ids.encode(5, 2)
    read = make_change("read", read=ReadOf("app-to-nats", "bf-1", '["7"]'))
    assert step.key(read) == ids.encode_read("bf-1", '["7"]') == step.read_key("bf-1", '["7"]')
    sequin = envelope(SINKS["sequin_ids"])
    assert sequin.read_key("bf-1", '["x"]') == ids.encode_read("bf-1", '["x"]')  # reads name the sink in both forms
    assert sequin.key(make_change(lsn=5, idx=2)) == base64.b64encode(b"5:2")


# -- metadata for the callables ----------------------------------------------------------------


@pytest.mark.parametrize("sink", SINKS.values(), ids=SINKS.keys())
@pytest.mark.parametrize("change", SAMPLES.values(), ids=SAMPLES.keys())
def test_metadata_is_the_payloads_metadata_as_python_values(change: Change, sink: SinkConfig) -> None:
    step = envelope(sink)
    metadata = step.metadata(change, change.pks, step.key(change))
    encoded = json.loads(step.encode_value(metadata, iso=True))
    assert encoded == json.loads(step(change).payload)["metadata"]
    assert list(metadata) == list(encoded)  # the payload's keys, in its order


def test_metadata_values_are_python_values() -> None:
    step = envelope(make_sink(id="c-1", annotations={"team": {"name": "billing"}, "tags": ["a"]}),
                    make_database(id="d-1", annotations={"env": "prod"}, database="app_prod"))
    east = dt.datetime(2026, 11, 30, 6, 0, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    change = make_change(ts=east, lsn=2**40, idx=3, annotations=b'{"user": "yahya", "n": 2.5}', pks=("7", "x"))
    metadata = step.metadata(change, ("7", "x"), step.key(change), {"tier": "gold"})
    assert metadata == {
        "database_name": "app",
        "table_schema": "public",
        "table_name": "orders",
        "commit_timestamp": dt.datetime(2026, 11, 30, 4, 0, 0, 5, tzinfo=dt.UTC),
        "commit_lsn": 2**40,
        "commit_idx": 3,
        "idempotency_key": _b64(f"app/app-to-nats/{2**40}:3"),
        "record_pks": ["7", "x"],
        "transaction_annotations": {"user": "yahya", "n": 2.5},
        "enrichment": {"tier": "gold"},
        "consumer": {"id": "c-1", "name": "app-to-nats", "annotations": {"team": {"name": "billing"}, "tags": ["a"]}},
        "database": {"id": "d-1", "name": "app", "annotations": {"env": "prod"}, "database": "app_prod",
                     "hostname": "db.internal"},
    }
    assert metadata["commit_timestamp"].tzinfo is dt.UTC
    assert type(metadata["idempotency_key"]) is str and type(metadata["record_pks"]) is list


@pytest.mark.parametrize("text", [None, b"{ invalid json }", b'{"a": NaN}', b"\xff"])
def test_metadata_annotations_absent_or_not_json_are_none(text: bytes | None) -> None:
    step = envelope()
    assert step.metadata(make_change(annotations=text), ("7",), b"k")["transaction_annotations"] is None


def test_metadata_is_new_on_every_call_so_a_callable_may_change_it() -> None:
    step = envelope(make_sink(annotations={"team": {"name": "billing"}, "tags": ["a"]}))
    enrichment = {"tier": "gold", "labels": ["x"]}
    change = make_change(annotations=b'{"user": "yahya"}')
    first = step.metadata(change, ("7",), b"k", enrichment)
    first["consumer"]["annotations"]["team"]["name"] = "changed"
    first["consumer"]["annotations"]["tags"].append("b")
    first["database"]["name"] = "changed"
    first["transaction_annotations"]["user"] = "changed"
    first["enrichment"]["labels"].append("y")
    first["record_pks"].append("8")
    second = step.metadata(change, ("7",), b"k", enrichment)
    assert second["consumer"]["annotations"] == {"team": {"name": "billing"}, "tags": ["a"]}
    assert second["database"]["name"] == "app"
    assert second["transaction_annotations"] == {"user": "yahya"}
    assert second["enrichment"] == enrichment == {"tier": "gold", "labels": ["x"]}
    assert second["record_pks"] == ["7"]
    assert json.loads(step(change).payload)["metadata"]["consumer"]["annotations"]["team"]["name"] == "billing"


# -- encode_value: any JSON value, by the exact encoder's rules -------------------------------


class Color(enum.Enum):
    RED = "red"


class Tier(enum.StrEnum):
    GOLD = "gold"


class Level(enum.IntEnum):
    HIGH = 3


class Point(NamedTuple):
    x: int
    y: Decimal


class Stamp(dt.datetime):
    """A datetime of another library (pendulum's, pandas's are subclasses)."""


@pytest.mark.parametrize(("value", "text"), [
    (None, b"null"),
    (True, b"true"),
    (2**70, b"1180591620717411303424"),  # exact, as Jason writes big integers
    (1.5, b"1.5"),
    ("héllo \"q\"", b'"h\xc3\xa9llo \\"q\\""'),
    (Decimal("1E-8"), b'"0.00000001"'),
    (Decimal("NaN"), b'"NaN"'),
    (float("nan"), b'"NaN"'),
    ([float("inf"), -math.inf], b'["Infinity","-Infinity"]'),
    (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), b'"2024-01-02T03:04:05.000000Z"'),
    (dt.datetime(2024, 1, 2, 3, 4, 5), b'"2024-01-02T03:04:05.000000"'),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 120000, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
     b'"2024-01-02T03:04:05.120000+05:30"'),
    (Stamp(2024, 1, 2, tzinfo=dt.UTC), b'"2024-01-02T00:00:00.000000Z"'),
    (dt.date(2024, 2, 29), b'"2024-02-29"'),
    (dt.time(1, 2, 3, 4), b'"01:02:03.000004"'),
    (uuid.UUID(int=5), b'"00000000-0000-0000-0000-000000000005"'),
    (UNCHANGED_TOAST, b'"unchanged_toast"'),
    ((1, [Decimal("1.10"), None]), b'[1,["1.10",null]]'),
    ({"a": {"b": [{"c": Decimal("-0")}]}}, b'{"a":{"b":[{"c":"-0"}]}}'),  # nested dicts too, at any depth
    (collections.OrderedDict(z=1, a=2), b'{"z":1,"a":2}'),
    (Point(1, Decimal("2.5")), b'[1,"2.5"]'),
    ([Tier.GOLD, Level.HIGH], b'["gold",3]'),
    ({}, b"{}"),
    ([], b"[]"),
])
def test_encode_value_writes_json_values_as_the_exact_encoder(value: Any, text: bytes) -> None:
    assert envelope().encode_value(value) == text


def test_encode_value_follows_timestamp_format_unless_told_iso() -> None:
    step = envelope(make_sink(timestamp_format="unix_microsecond"))
    value = {"at": TS, "naive": TS.replace(tzinfo=None), "d": dt.date(2024, 2, 29), "n": Decimal("1E-8")}
    assert json.loads(step.encode_value(value)) == {"at": TS_US, "naive": TS_US, "d": "2024-02-29", "n": "0.00000001"}
    assert json.loads(step.encode_value(value, iso=True)) == {
        "at": "2026-11-30T04:00:00.123456Z", "naive": "2026-11-30T04:00:00.123456", "d": "2024-02-29",
        "n": "0.00000001"}
    assert json.loads(envelope().encode_value(value, iso=True)) == json.loads(envelope().encode_value(value))
    assert encode_json(value, unix=True) == step.encode_value(value)  # the rule, without an envelope
    assert encode_json(value) == step.encode_value(value, iso=True) == envelope().encode_value(value)


@pytest.mark.parametrize(("value", "message"), [
    ({"a", "b"}, "a set is not JSON"),
    (b"\x00", "a bytes is not JSON"),
    (bytearray(b"x"), "a bytearray is not JSON"),
    (dt.timedelta(seconds=1), "a datetime.timedelta is not JSON"),
    (Color.RED, "a tests.transforms.test_envelope.Color is not JSON"),
    (object(), "an object is not JSON"),
    ({"record": {"tags": [1, frozenset()]}}, r"a frozenset at \['record'\]\['tags'\]\[1\] is not JSON"),
    ({1: "x"}, "a dict with an int key is not JSON"),
    ({"a": {None: 1}}, r"a dict with a NoneType key at \['a'\] is not JSON"),
    ([{"x": "\ud800"}], r"a string holding a lone surrogate \(not Unicode\) is not JSON"),
])
def test_encode_value_refuses_what_is_not_json_and_names_it(value: Any, message: str) -> None:
    with pytest.raises(NotJSON, match=message) as caught:
        envelope().encode_value(value)
    assert isinstance(caught.value, ValueError)


def test_encode_value_refuses_a_value_holding_itself() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(NotJSON, match="nested too deep"):
        envelope().encode_value(value)


@pytest.mark.parametrize("levels", [500, 501, 100_000])
def test_encode_value_writes_values_500_deep_and_refuses_deeper(levels: int) -> None:
    """Counted, not left to the recursion limit: the compiled module has none (a crash there)."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    if levels <= 500:
        assert envelope().encode_value(value) == b"[" * levels + b"1" + b"]" * levels
    else:
        with pytest.raises(NotJSON, match="nested too deep"):
            envelope().encode_value(value)


@pytest.mark.parametrize("timestamp_format", ["iso8601", "unix_microsecond"])
@given(row=st.dictionaries(_TEXT, _VALUES.filter(lambda value: not _surrogate(value)), max_size=6))
def test_encode_value_of_a_row_is_the_rows_encoding(timestamp_format: str, row: Row) -> None:
    """What the source makes (no bytes, no timedeltas: it loads bytea and intervals otherwise)."""
    step = envelope(make_sink(timestamp_format=timestamp_format))
    assert step.encode_value(row) == exact(step, row) == step.encode_row(row)


def _surrogate(value: Any) -> bool:
    """Whether ``value`` holds a lone surrogate, or is one of the values the source never makes."""
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, bytes | dt.timedelta):
        return True
    if isinstance(value, list):
        return any(_surrogate(item) for item in value)
    if isinstance(value, dict):
        return any(_surrogate(key) or _surrogate(item) for key, item in value.items())
    return False


def test_json_too_deep_to_load_is_published_as_its_text() -> None:
    """json/jsonb of any depth: deeper than orjson writes, the loader keeps Postgres's text
    (``JsonText``) and the envelope splices it in, on orjson's path and on the exact one."""
    for levels in (241, 300, 1500, 20_000):
        text = ("[" * levels + '{"a": null}' + "]" * levels).encode()
        value = json_loads(text)
        assert value == JsonText(text)
        encode = envelope().encode_row
        assert encode({"id": 1, "doc": value}) == b'{"id":1,"doc":' + text + b"}"
        exact = encode({"id": 1, "doc": value, "f": float("nan"), "list": [value, None]})  # NaN: the exact encoder
        assert exact == b'{"id":1,"doc":' + text + b',"f":"NaN","list":[' + text + b",null]}"
    assert json_loads(b"[" * 240 + b"]" * 240) == json.loads(b"[" * 240 + b"]" * 240)  # still Python values
