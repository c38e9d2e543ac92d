"""The envelope on hand-made changes: Sequin's payload, byte for byte, and the idempotency id; no servers."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import pickle
import re
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.multirange import Multirange
from psycopg.types.range import Range

from core.events import UNCHANGED_TOAST, Action, Change, Message, Row
from core.ids import IdScheme
from tests.transforms.samples import TS, TS_US, make_sink
from transforms.envelope import Envelope, iso_duration, pg_text


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
) -> Change:
    if new is None and action in ("insert", "update"):
        new = {"id": 7, "status": "paid", "amount": Decimal("12.50")}
    return Change(action, schema, table, key, new, old, lsn, idx, ts, 4711)


def _idempotency_key(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _payload(message_payload: bytes) -> Any:
    return json.loads(message_payload)


def test_insert_payload_is_exactly_sequins_shape() -> None:
    message = Envelope(make_sink(), "app")(make_change(idx=3))
    key = _idempotency_key("app/app-to-nats/22150152:3")
    assert message.payload == (
        b'{"record":{"id":7,"status":"paid","amount":"12.50"},"changes":null,"action":"insert",'
        b'"metadata":{"database_name":"app","table_schema":"public","table_name":"orders",'
        b'"commit_timestamp":"2026-11-30T04:00:00.123456Z","commit_lsn":22150152,"commit_idx":3,'
        b'"idempotency_key":"' + key.encode() + b'","consumer":{"name":"app-to-nats"}}}'
    )
    assert message == Message("public", "orders", "insert", message.payload, key)  # names, no subject
    assert message.msg_id == key


def test_update_with_full_old_row_reports_the_changed_columns() -> None:
    """The contract's example: REPLICA IDENTITY FULL, status changed from 'new' to 'paid'."""
    old = {"id": 7, "status": "new", "amount": Decimal("12.50")}
    message = Envelope(make_sink(), "app")(make_change("update", old=old))
    payload = _payload(message.payload)
    assert payload["record"] == {"id": 7, "status": "paid", "amount": "12.50"}
    assert payload["changes"] == {"status": "new"}
    assert payload["action"] == "update"
    assert list(payload) == ["record", "changes", "action", "metadata"]
    assert (message.schema, message.table, message.action) == ("public", "orders", "update")


def test_update_without_old_row_has_null_changes() -> None:
    payload = _payload(Envelope(make_sink(), "app")(make_change("update")).payload)
    assert payload["changes"] is None
    assert payload["record"] == {"id": 7, "status": "paid", "amount": "12.50"}


def test_update_that_changed_the_key_reports_the_old_key() -> None:
    change = make_change("update", new={"id": 8, "status": "paid"}, old={"id": 7})
    payload = _payload(Envelope(make_sink(), "app")(change).payload)
    assert payload["changes"] == {"id": 7}
    assert payload["record"] == {"id": 8, "status": "paid"}


def test_full_update_that_changed_nothing_has_empty_changes() -> None:
    row = {"id": 7, "x": float("nan"), "n": Decimal("NaN"), "s": "same"}
    change = make_change("update", new=row, old=dict(row, x=float("nan")))
    assert _payload(Envelope(make_sink(), "app")(change).payload)["changes"] == {}


def test_unchanged_toast_under_full_identity_is_filled_from_the_old_row() -> None:
    big = "x" * 10_000
    change = make_change(
        "update",
        new={"id": 7, "status": "paid", "body": UNCHANGED_TOAST},
        old={"id": 7, "status": "new", "body": big},
    )
    payload = _payload(Envelope(make_sink(), "app")(change).payload)
    assert payload["record"] == {"id": 7, "status": "paid", "body": big}
    assert payload["changes"] == {"status": "new"}  # body: not known to have changed, left out


def test_unchanged_toast_without_old_value_is_sequins_marker() -> None:
    default = make_change("update", new={"id": 7, "body": UNCHANGED_TOAST})
    key_change = make_change("update", new={"id": 8, "body": UNCHANGED_TOAST}, old={"id": 7})
    envelope = Envelope(make_sink(), "app")
    assert _payload(envelope(default).payload)["record"] == {"id": 7, "body": "unchanged_toast"}
    payload = _payload(envelope(key_change).payload)
    assert payload["record"] == {"id": 8, "body": "unchanged_toast"}
    assert payload["changes"] == {"id": 7}


def test_delete_under_default_identity_holds_only_the_key() -> None:
    message = Envelope(make_sink(), "app")(make_change("delete", old={"id": 7}))
    assert message.payload.startswith(b'{"record":{"id":7},"changes":null,"action":"delete","metadata":{')
    assert (message.schema, message.table, message.action) == ("public", "orders", "delete")


def test_delete_under_full_identity_holds_the_whole_row() -> None:
    old = {"id": 7, "status": "paid", "note": None}
    payload = _payload(Envelope(make_sink(), "app")(make_change("delete", old=old)).payload)
    assert payload["record"] == {"id": 7, "status": "paid", "note": None}
    assert payload["changes"] is None


def test_truncate_has_no_envelope() -> None:
    with pytest.raises(ValueError, match="SinkFilter"):
        Envelope(make_sink(), "app")(make_change("truncate", new={}))


def test_the_change_itself_is_left_untouched() -> None:
    row = {"id": 7, "i": dt.timedelta(hours=1), "b": b"\x00", "t": UNCHANGED_TOAST}
    change = make_change("update", new=row)
    Envelope(make_sink(), "app")(change)
    assert change.new == {"id": 7, "i": dt.timedelta(hours=1), "b": b"\x00", "t": UNCHANGED_TOAST}


EVERY_TYPE: Row = {
    "c_smallint": 32767,
    "c_bigint": 9223372036854775807,
    "c_numeric": Decimal("1234567890.123456789012345678901234567890"),
    "c_numeric_scale": Decimal("0.00000000"),
    "c_numeric_nan": Decimal("NaN"),
    "c_real": 1.5,
    "c_double": 0.1,
    "c_nan": float("nan"),
    "c_inf": float("-inf"),
    "c_bool": True,
    "c_text": 'héllo ✓ \\ "quoted"\n\u2028',
    "c_bytea": b"\xfb\xff\xbf\x00",
    "c_date": dt.date(2024, 2, 29),
    "c_time": dt.time(23, 59, 59, 999999),
    "c_timetz": dt.time(12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    "c_ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
    "c_tstz": dt.datetime(2024, 1, 2, 1, 4, 5, 123456, tzinfo=dt.UTC),
    "c_interval": dt.timedelta(days=428, seconds=14706, microseconds=789000),
    "c_uuid": uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    "c_json": {"a": [1, 2.5, None]},
    "c_jsonb": {"b": {"c": "d"}, "n": 12345678901234567890},
    "c_json_array": [{"x": 1}, [1, 2], "s"],
    "c_inet": ipaddress.ip_interface("192.168.0.1/24"),
    "c_cidr": ipaddress.ip_network("10.0.0.0/8"),
    "c_inet6": ipaddress.ip_address("::1"),
    "c_macaddr": "08:00:2b:01:02:03",
    "c_int_array": [1, None, 3],
    "c_int_matrix": [[1, 2], [3, 4]],
    "c_text_array": ["a,b", 'c"d', None],
    "c_bytea_array": [None, b"\xfb\xff", b"a"],
    "c_interval_array": [dt.timedelta(hours=1), None],
    "c_mood": "happy",
    "c_int4range": Range(1, 10, "[)"),
    "c_tstzrange": Range(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 2, 1, tzinfo=dt.UTC), "[)"),
    "c_floatrange": Range(1.5, 2.5, "[]"),
    "c_emptyrange": Range(empty=True),
    "c_range_array": [Range(1, 3), Range(5, None)],
    "c_multirange": Multirange([Range(1, 3), Range(5, 7)]),
    "c_point": "(1,2)",
    "c_pair": '(7,"x y")',
    "c_infinity_date": "infinity",
    "c_null": None,
}

EVERY_TYPE_JSON: dict[str, Any] = {
    "c_smallint": 32767,
    "c_bigint": 9223372036854775807,
    "c_numeric": "1234567890.123456789012345678901234567890",
    "c_numeric_nan": "NaN",
    "c_real": 1.5,
    "c_double": 0.1,
    "c_nan": "NaN",
    "c_inf": "-Infinity",
    "c_bool": True,
    "c_text": 'héllo ✓ \\ "quoted"\n\u2028',
    "c_bytea": "+/+/AA==",  # standard alphabet, padded
    "c_date": "2024-02-29",
    "c_time": "23:59:59.999999",
    "c_timetz": "12:00:00+05:30",
    "c_ts": "2024-01-02T03:04:05.123456",
    "c_tstz": "2024-01-02T01:04:05.123456Z",
    "c_interval": "P428DT4H5M6.789S",
    "c_uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "c_json": {"a": [1, 2.5, None]},
    "c_jsonb": {"b": {"c": "d"}, "n": 12345678901234567890},
    "c_json_array": [{"x": 1}, [1, 2], "s"],
    "c_inet": "192.168.0.1/24",
    "c_cidr": "10.0.0.0/8",
    "c_inet6": "::1",
    "c_macaddr": "08:00:2b:01:02:03",
    "c_int_array": [1, None, 3],
    "c_int_matrix": [[1, 2], [3, 4]],
    "c_text_array": ["a,b", 'c"d', None],
    "c_bytea_array": [None, "+/8=", "YQ=="],
    "c_interval_array": ["PT1H", None],
    "c_mood": "happy",
    "c_int4range": "[1,10)",
    "c_tstzrange": '["2024-01-01 00:00:00+00","2024-02-01 00:00:00+00")',
    "c_floatrange": "[1.5,2.5]",
    "c_emptyrange": "empty",
    "c_range_array": ["[1,3)", "[5,)"],
    "c_multirange": "{[1,3),[5,7)}",
    "c_point": "(1,2)",
    "c_pair": '(7,"x y")',
    "c_infinity_date": "infinity",
    "c_null": None,
}


def test_every_value_type_round_trips() -> None:
    payload = _payload(Envelope(make_sink(), "app")(make_change(key=("c_smallint",), new=EVERY_TYPE)).payload)
    record = payload["record"]
    scaled = record.pop("c_numeric_scale")
    assert Decimal(scaled).as_tuple() == Decimal("0.00000000").as_tuple()  # exact, scale included
    assert record == EVERY_TYPE_JSON
    assert list(record) == [c for c in EVERY_TYPE if c != "c_numeric_scale"]  # column order kept
    assert base64.b64decode(record["c_bytea"], validate=True) == EVERY_TYPE["c_bytea"]
    assert Decimal(record["c_numeric"]) == EVERY_TYPE["c_numeric"]
    assert dt.datetime.fromisoformat(record["c_tstz"]) == EVERY_TYPE["c_tstz"]
    assert dt.datetime.fromisoformat(record["c_ts"]) == EVERY_TYPE["c_ts"]


def test_unknown_objects_fall_back_to_their_text() -> None:
    class Box:
        def __str__(self) -> str:
            return "(0,0),(1,1)"

    payload = _payload(Envelope(make_sink(), "app")(make_change(new={"id": 1, "box": Box()})).payload)
    assert payload["record"]["box"] == "(0,0),(1,1)"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (dt.timedelta(0), "PT0S"),
        (dt.timedelta(days=3), "P3D"),
        (dt.timedelta(days=1), "P1D"),
        (dt.timedelta(hours=1, seconds=5), "PT1H5S"),
        (dt.timedelta(minutes=90), "PT1H30M"),
        (dt.timedelta(microseconds=1), "PT0.000001S"),
        (dt.timedelta(seconds=-1), "-PT1S"),
        (dt.timedelta(days=-1, hours=1), "-PT23H"),
        (dt.timedelta(days=-428, seconds=-14706, microseconds=-789000), "-P428DT4H5M6.789S"),
        (dt.timedelta(days=428, seconds=14706, microseconds=789000), "P428DT4H5M6.789S"),
        (dt.timedelta(days=999999999, seconds=86399, microseconds=999999), "P999999999DT23H59M59.999999S"),
    ],
)
def test_intervals_are_iso_durations_in_days_and_time(value: dt.timedelta, text: str) -> None:
    assert iso_duration(value) == text


_DURATION = re.compile(r"(-?)P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")


@given(st.timedeltas())
def test_iso_durations_read_back_exactly(value: dt.timedelta) -> None:
    match = _DURATION.fullmatch(iso_duration(value))
    assert match, iso_duration(value)
    sign, days, hours, minutes, seconds = match.groups()
    parsed = dt.timedelta(days=int(days or 0), hours=int(hours or 0), minutes=int(minutes or 0),
                          microseconds=round(Decimal(seconds or 0) * 1_000_000))
    assert (-parsed if sign else parsed) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Range(1, 10, "[)"), "[1,10)"),
        (Range(1, 10, "(]"), "(1,10]"),
        (Range(None, 5, "[)"), "(,5)"),
        (Range(5, None, "[]"), "[5,)"),
        (Range(None, None), "(,)"),
        (Range(empty=True), "empty"),
        (Range(Decimal("1.50"), Decimal("0.0000001"), "[)"), "[1.50,0.0000001)"),
        (Range(dt.date(2024, 1, 1), dt.date(2024, 2, 1)), "[2024-01-01,2024-02-01)"),
        (Range(dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2, 12, 30, 0, 500000)),
         '["2024-01-01 00:00:00","2024-01-02 12:30:00.5")'),
        (Range(dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=-3))), None),
         '["2024-01-01 12:00:00-03",)'),
        (Range(dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))), None),
         '["2024-01-01 12:00:00+05:30",)'),
        (Range(100.0, float("inf")), "[100,Infinity)"),
        (Range(-0.5, 1e20), "[-0.5,1e+20)"),
        (Range("a b", "c"), '["a b",c)'),
        (Range("", 'q"\\'), '["","q""\\\\")'),
        (Range("x,y", "(z)"), '["x,y","(z)")'),
        (Range(dt.timedelta(hours=1), dt.timedelta(days=2)), "[PT1H,P2D)"),
        (Multirange([Range(1, 3), Range(5, 7)]), "{[1,3),[5,7)}"),
        (Multirange([]), "{}"),
        (ipaddress.ip_address("10.0.0.1"), "10.0.0.1"),
    ],
)
def test_ranges_are_written_as_postgres_does(value: Any, text: str) -> None:
    assert pg_text(value) == text


def test_commit_timestamp_is_utc_with_six_fractional_digits() -> None:
    envelope = Envelope(make_sink(), "app")
    whole = dt.datetime(2026, 11, 30, 4, 0, tzinfo=dt.UTC)
    east = dt.datetime(2026, 11, 30, 6, 0, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    small = dt.datetime(2026, 11, 30, 4, 0, 0, 50, tzinfo=dt.UTC)  # rendered by to_json: still 6 digits
    stamps = [_payload(envelope(make_change(ts=ts)).payload)["metadata"]["commit_timestamp"]
              for ts in (TS, whole, east, TS, small)]
    assert stamps == ["2026-11-30T04:00:00.123456Z", "2026-11-30T04:00:00.000000Z",
                      "2026-11-30T04:00:00.000005Z", "2026-11-30T04:00:00.123456Z", "2026-11-30T04:00:00.000050Z"]


def test_unix_microsecond_format_applies_to_commit_timestamp_and_record_timestamps() -> None:
    row = {
        "id": 1,
        "tstz": TS,
        "ts": TS.replace(tzinfo=None),  # without time zone: read as UTC
        "before_epoch": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        "tstz_array": [None, TS],
        "d": dt.date(2024, 2, 29),
        "t": dt.time(1, 2, 3),
        "r": Range(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), None),
    }
    payload = _payload(Envelope(make_sink(timestamp_format="unix_microsecond"), "app")(make_change(new=row)).payload)
    assert payload["metadata"]["commit_timestamp"] == TS_US
    assert payload["record"] == {
        "id": 1,
        "tstz": TS_US,
        "ts": TS_US,
        "before_epoch": -1,
        "tstz_array": [None, TS_US],
        "d": "2024-02-29",
        "t": "01:02:03",
        "r": '["2024-01-01 00:00:00+00",)',
    }


def test_annotations_appear_in_consumer_only_when_set() -> None:
    plain = _payload(Envelope(make_sink(), "app")(make_change()).payload)
    assert plain["metadata"]["consumer"] == {"name": "app-to-nats"}
    annotated = make_sink(annotations={"team": "billing", "tier": 1, "tags": ["a"]})
    payload = _payload(Envelope(annotated, "app")(make_change()).payload)
    assert payload["metadata"]["consumer"] == {"name": "app-to-nats",
                                               "annotations": {"team": "billing", "tier": 1, "tags": ["a"]}}


def test_non_finite_annotations_are_strings_as_everywhere_else() -> None:
    annotated = make_sink(annotations={"ratio": float("nan"), "cap": float("inf")})
    payload = Envelope(annotated, "app")(make_change()).payload
    consumer = json.loads(payload, parse_constant=lambda name: pytest.fail(f"bare {name} in {payload!r}"))
    assert consumer["metadata"]["consumer"]["annotations"] == {"ratio": "NaN", "cap": "Infinity"}


def test_metadata_fields() -> None:
    change = make_change(schema="sales", table="orders", lsn=2**40 + 5, idx=12)
    metadata = _payload(Envelope(make_sink(name="s2"), "crm")(change).payload)["metadata"]
    assert metadata == {
        "database_name": "crm",
        "table_schema": "sales",
        "table_name": "orders",
        "commit_timestamp": "2026-11-30T04:00:00.123456Z",
        "commit_lsn": 2**40 + 5,
        "commit_idx": 12,
        "idempotency_key": _idempotency_key(f"crm/s2/{2**40 + 5}:12"),
        "consumer": {"name": "s2"},
    }


def test_message_carries_the_names_unescaped_for_the_sink_to_address() -> None:
    sink = make_sink(destination={"type": "nats", "host": "nats", "subject_prefix": "sequin"})
    message = Envelope(sink, "app")(make_change("delete", schema="Sales", table="line.items", old={"id": 1}))
    assert (message.schema, message.table, message.action) == ("Sales", "line.items", "delete")


def test_ids_are_the_id_schemes_and_decode_back_to_the_position() -> None:
    message = Envelope(make_sink(name="s/1"), "my db")(make_change(lsn=2**40, idx=9))
    ids = IdScheme("my db", "s/1")
    assert message.msg_id == ids.encode(2**40, 9).decode("ascii")
    assert ids.decode(message.msg_id) == (2**40, 9)
    assert IdScheme("my db", "s").decode(message.msg_id) is None  # another sink's


def test_idempotency_key_is_stable_and_unique_per_change_sink_and_database() -> None:
    change = make_change(lsn=500, idx=2)

    def key(sink_name: str, database: str, change: Change) -> str:
        message = Envelope(make_sink(name=sink_name), database)(change)
        assert message.msg_id == _payload(message.payload)["metadata"]["idempotency_key"]
        return message.msg_id

    first = key("s1", "app", change)
    assert base64.b64decode(first, validate=True) == b"app/s1/500:2"
    assert key("s1", "app", pickle.loads(pickle.dumps(change))) == first  # a replay names it the same
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
