"""The per-change steps (filter, group key, subject, envelope) on hand-made changes: no servers."""

from __future__ import annotations

import base64
import calendar
import datetime as dt
import ipaddress
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from psycopg.types.multirange import Multirange
from psycopg.types.range import Range

from config.schema import SinkConfig
from connectors.postgres.changes import Action, Change
from connectors.postgres.values import UNCHANGED_TOAST, Row
from transforms.envelope import Envelope, iso_duration, pg_text
from transforms.filter import SinkFilter
from transforms.group import GroupKey
from transforms.route import escape_token, subject

ROOT = Path(__file__).resolve().parent.parent
TS = dt.datetime(2026, 11, 30, 4, 0, 0, 123456, tzinfo=dt.UTC)
TS_US = calendar.timegm((2026, 11, 30, 4, 0, 0)) * 1_000_000 + 123456


def make_sink(**fields: Any) -> SinkConfig:
    """A sink as the config loader builds it; ``fields`` override the defaults."""
    base: dict[str, Any] = {"name": "app-to-nats", "database": "app", "destination": {"type": "nats", "host": "nats"}}
    return SinkConfig.model_validate({**base, **fields})


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


# -- filter ---------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["insert", "update", "delete"])
def test_default_sink_receives_every_row_change_of_every_table(action: Action) -> None:
    accept = SinkFilter(make_sink())
    assert accept(make_change(action, old={"id": 7}))
    assert accept(make_change(action, schema="other", table="anything", old={"id": 7}))


@pytest.mark.parametrize(
    ("fields", "schema", "table", "action", "passes"),
    [
        ({"actions": ["insert"]}, "public", "orders", "insert", True),
        ({"actions": ["insert"]}, "public", "orders", "update", False),
        ({"actions": ["insert"]}, "public", "orders", "delete", False),
        ({"actions": ["update", "delete"]}, "public", "orders", "delete", True),
        ({"source": {"include_schemas": ["public"]}}, "public", "orders", "insert", True),
        ({"source": {"include_schemas": ["public"]}}, "app", "orders", "insert", False),
        ({"source": {"include_schemas": []}}, "public", "orders", "insert", False),  # empty list: nothing
        ({"source": {"exclude_schemas": ["audit"]}}, "audit", "log", "insert", False),
        ({"source": {"exclude_schemas": ["audit"]}}, "public", "log", "insert", True),
        ({"source": {"include_tables": ["public.orders"]}}, "public", "orders", "insert", True),
        ({"source": {"include_tables": ["public.orders"]}}, "public", "items", "insert", False),
        ({"source": {"include_tables": ["public.orders"]}}, "app", "orders", "insert", False),
        ({"source": {"exclude_tables": ["public.json_web_tokens"]}}, "public", "json_web_tokens", "insert", False),
        ({"source": {"exclude_tables": ["public.json_web_tokens"]}}, "app", "json_web_tokens", "insert", True),
        ({"source": {"include_tables": ["public.Orders"]}}, "public", "orders", "insert", False),  # exact names
        ({"table": "public.orders"}, "public", "orders", "update", True),
        ({"table": "public.orders"}, "public", "items", "update", False),
        # every condition must hold
        ({"source": {"include_schemas": ["public"], "exclude_tables": ["public.secret"]}}, "public", "secret",
         "insert", False),
        ({"source": {"include_schemas": ["public"], "exclude_tables": ["public.secret"]}}, "public", "orders",
         "insert", True),
        ({"source": {"include_tables": ["public.orders"], "exclude_schemas": ["public"]}}, "public", "orders",
         "insert", False),
        ({"source": {"include_tables": ["public.orders"], "exclude_tables": ["public.orders"]}}, "public",
         "orders", "insert", False),
        ({"table": "public.orders", "source": {"include_tables": ["public.items"]}}, "public", "orders", "insert",
         False),
        ({"table": "public.orders", "source": {"include_schemas": ["app"]}}, "public", "orders", "insert", False),
        ({"table": "public.orders", "actions": ["delete"]}, "public", "orders", "insert", False),
        ({"table": "public.orders", "actions": ["delete"]}, "public", "orders", "delete", True),
    ],
)
def test_filter_rules(fields: dict[str, Any], schema: str, table: str, action: Action, passes: bool) -> None:
    change = make_change(action, schema=schema, table=table, old={"id": 7})
    accept = SinkFilter(make_sink(**fields))
    assert accept(change) is passes
    assert accept(change) is passes  # and again, from the per-table cache


SCHEMAS = ["public", "app", "a.b"]
TABLES = ["orders", "secret", "c"]
QUALIFIED = [f"{s}.{t}" for s in SCHEMAS for t in TABLES]


def _maybe_subset(names: list[str]) -> st.SearchStrategy[list[str] | None]:
    return st.none() | st.lists(st.sampled_from(names), unique=True)


@given(
    actions=st.lists(st.sampled_from(["insert", "update", "delete"]), min_size=1, unique=True),
    include_schemas=_maybe_subset(SCHEMAS),
    exclude_schemas=_maybe_subset(SCHEMAS),
    include_tables=_maybe_subset(QUALIFIED),
    exclude_tables=_maybe_subset(QUALIFIED),
    legacy=st.none() | st.sampled_from(QUALIFIED),
    changes=st.lists(
        st.tuples(st.sampled_from(["insert", "update", "delete", "truncate"]), st.sampled_from(SCHEMAS),
                  st.sampled_from(TABLES)),
        min_size=1, max_size=12,
    ),
)
def test_filter_is_the_conjunction_of_its_rules(
    actions: list[str],
    include_schemas: list[str] | None,
    exclude_schemas: list[str] | None,
    include_tables: list[str] | None,
    exclude_tables: list[str] | None,
    legacy: str | None,
    changes: list[tuple[Action, str, str]],
) -> None:
    """Any combination: a change passes exactly when every rule admits it (truncates: never)."""
    source = {"include_schemas": include_schemas, "exclude_schemas": exclude_schemas,
              "include_tables": include_tables, "exclude_tables": exclude_tables}
    accept = SinkFilter(make_sink(actions=actions, source=source, table=legacy))
    for action, schema, table in changes:
        name = f"{schema}.{table}"
        expected = (
            action in actions
            and (include_schemas is None or schema in include_schemas)
            and schema not in (exclude_schemas or [])
            and (include_tables is None or name in include_tables)
            and name not in (exclude_tables or [])
            and (legacy is None or name == legacy)
        )
        assert accept(make_change(action, schema=schema, table=table, old={"id": 1})) is expected


def test_truncate_never_passes_and_warns_once_per_table(caplog: pytest.LogCaptureFixture) -> None:
    accept = SinkFilter(make_sink(name="audit", source={"exclude_tables": ["public.skipped"]}))
    with caplog.at_level(logging.WARNING, logger="walflow.transforms.filter"):
        results = [
            accept(make_change("truncate", table="orders", new={})),
            accept(make_change("truncate", table="orders", new={})),
            accept(make_change("truncate", table="items", new={})),
            accept(make_change("truncate", table="skipped", new={})),  # not this sink's table: no noise
            accept(make_change("truncate", table="orders", new={})),
        ]
    assert results == [False] * 5
    assert [r.getMessage() for r in caplog.records] == [
        "TRUNCATE of public.orders is not delivered to sink audit: walflow delivers row changes only",
        "TRUNCATE of public.items is not delivered to sink audit: walflow delivers row changes only",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_tables_first_seen_later_pass_by_the_same_rules() -> None:
    """A table added to the publication while walflow runs needs no restart."""
    accept = SinkFilter(make_sink(source={"include_schemas": ["public"], "exclude_tables": ["public.secret"]}))
    assert accept(make_change(table="orders"))
    assert accept(make_change(table="created_later"))
    assert not accept(make_change(schema="later_schema", table="created_later"))
    assert not accept(make_change(table="secret"))


# -- group key -------------------------------------------------------------------------------


def test_group_key_is_the_primary_key_by_default() -> None:
    key = GroupKey(make_sink())
    assert key(make_change(new={"id": 7, "status": "paid"})) == "public.orders:[7]"
    update = make_change("update", new={"id": 7, "status": "sent"}, idx=1)
    delete = make_change("delete", old={"id": 7}, idx=2)
    assert key(update) == key(delete) == "public.orders:[7]"
    assert key(make_change(new={"id": 8, "status": "paid"})) == "public.orders:[8]"


def test_group_key_of_a_composite_key_follows_the_key_column_order() -> None:
    change = make_change(table="items", key=("order_id", "line"), new={"line": "b", "order_id": 7, "qty": 1})
    assert GroupKey(make_sink())(change) == 'public.items:[7,"b"]'


def test_configured_group_columns_replace_the_key_for_their_table_only() -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["account_id", "region"]}]))
    row = {"id": 7, "account_id": 42, "region": "eu"}
    assert key(make_change(new=row)) == 'public.orders:[42,"eu"]'
    assert key(make_change("update", new={**row, "id": 8})) == 'public.orders:[42,"eu"]'
    assert key(make_change(table="items", new=row)) == "public.items:[7]"
    assert key(make_change(schema="app", new=row)) == "app.orders:[7]"


def test_legacy_table_and_group_column_names() -> None:
    key = GroupKey(make_sink(table="public.orders", group_column_names=["account_id"]))
    assert key(make_change(new={"id": 7, "account_id": 42})) == "public.orders:[42]"


def test_tables_entry_wins_over_the_legacy_form_for_the_same_table() -> None:
    key = GroupKey(make_sink(table="public.orders", group_column_names=["account_id"],
                             tables=[{"name": "public.orders", "group_column_names": ["region"]}]))
    assert key(make_change(new={"id": 7, "account_id": 42, "region": "eu"})) == 'public.orders:["eu"]'


def test_deletes_are_grouped_by_their_old_row() -> None:
    """Under REPLICA IDENTITY FULL the old row has the group column: a delete joins its row's group."""
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["account_id"]}]))
    row = {"id": 7, "account_id": 42}
    assert key(make_change("delete", key=("id", "account_id"), old=row)) == key(make_change(new=row))


def test_missing_group_column_falls_back_to_present_key_columns(caplog: pytest.LogCaptureFixture) -> None:
    """REPLICA IDENTITY DEFAULT: a delete carries only the key; it is grouped by it, with one warning."""
    key = GroupKey(make_sink(tables=[{"name": "public.orders", "group_column_names": ["account_id"]}]))
    with caplog.at_level(logging.WARNING, logger="walflow.transforms.group"):
        first = key(make_change("delete", old={"id": 7}))
        second = key(make_change("delete", old={"id": 8}))
    assert (first, second) == ("public.orders:[7]", "public.orders:[8]")
    assert len(caplog.records) == 1
    assert "public.orders lacks group column(s) account_id" in caplog.records[0].getMessage()
    assert "REPLICA IDENTITY FULL" in caplog.records[0].getMessage()


def test_untouched_toast_group_column_uses_the_old_value_or_falls_back() -> None:
    key = GroupKey(make_sink(tables=[{"name": "public.docs", "group_column_names": ["body"]}]))
    full = make_change("update", table="docs", new={"id": 1, "body": UNCHANGED_TOAST}, old={"id": 1, "body": "x"})
    assert key(full) == key(make_change(table="docs", new={"id": 1, "body": "x"})) == 'public.docs:["x"]'
    default = make_change("update", table="docs", new={"id": 1, "body": UNCHANGED_TOAST})
    assert key(default) == "public.docs:[1]"
    assert "UNCHANGED" not in key(default)


def test_without_message_grouping_each_change_is_its_own_group() -> None:
    key = GroupKey(make_sink(message_grouping=False))
    first = make_change(new={"id": 7}, lsn=100, idx=0)
    second = make_change("update", new={"id": 7}, lsn=100, idx=1)
    assert (key(first), key(second)) == ("100:0", "100:1")


def test_table_without_key_columns_is_one_group() -> None:
    key = GroupKey(make_sink())
    assert key(make_change(table="log", key=(), new={"line": "a"})) == "public.log:[]"
    assert key(make_change(table="log", key=(), new={"line": "b"})) == "public.log:[]"


VARIED: Row = {
    "n": Decimal("1234567890.123456789012345678901234567890"),
    "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
    "u": uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    "j": {"b": {"c": "d"}, "a": [1, 2.5, None]},
    "r": Range(1, 10, "[)"),
    "b": b"\xde\xad\xbe\xef",
    "i": dt.timedelta(days=3, seconds=5),
    "ip": ipaddress.ip_interface("192.168.0.1/24"),
    "s": "héllo",
}
VARIED_COLUMNS = tuple(VARIED)


def test_group_key_is_deterministic_across_pickling_and_processes() -> None:
    """The same change gives the same key after travelling to another worker or process."""
    change = make_change(table="t", key=VARIED_COLUMNS, new=VARIED)
    key = GroupKey(make_sink())(change)
    assert key == GroupKey(make_sink())(pickle.loads(pickle.dumps(change)))
    assert key.startswith('public.t:["1234567890.123456789012345678901234567890","2024-01-02T03:04:05.123456Z",')
    script = (
        "import pickle, sys\n"
        "from tests.test_transforms import GroupKey, make_sink\n"
        "print(GroupKey(make_sink())(pickle.loads(bytes.fromhex(sys.argv[1]))))\n"
    )
    for seed in ("1", "2"):  # str hashes differ between these processes and this one
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script, pickle.dumps(change).hex()], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
        assert out.stdout.rstrip("\n") == key


# -- subjects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("orders", "orders"),
        ("Order_Items-2", "Order_Items-2"),
        ("my.table", "my%2Etable"),
        ("a b", "a%20b"),
        ("tab\there", "tab%09here"),
        ("*", "%2A"),
        (">", "%3E"),
        ("100%", "100%25"),
        ("%2E", "%252E"),  # a literal '%2E' cannot pass for an escaped '.'
        ("café", "caf%C3%A9"),
        ("日本", "%E6%97%A5%E6%9C%AC"),
        ("", "%"),
        ("\udc80", "%ED%B2%80"),  # a lone surrogate (no Postgres name has one): still a distinct token
    ],
)
def test_escape_token(name: str, token: str) -> None:
    assert escape_token(name) == token


def test_subject_is_prefix_database_schema_table_action() -> None:
    assert subject("walflow", "app", "public", "orders", "insert") == "walflow.app.public.orders.insert"
    assert subject("sequin", "app", "public", "orders", "delete") == "sequin.app.public.orders.delete"
    assert subject("a.b", "my db", "Sales.EU", "line items", "update") == "a.b.my%20db.Sales%2EEU.line%20items.update"


def _unescape(token: str) -> str:
    """Percent-decoding, as a consumer would do it: the inverse of ``escape_token``."""
    if token == "%":
        return ""
    out, i = bytearray(), 0
    while i < len(token):
        if token[i] == "%":
            out.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            out += token[i].encode()
            i += 1
    return out.decode("utf-8", "surrogatepass")


#: Any str, lone surrogates included: the rule is total.
any_text = st.text(st.characters(exclude_categories=()))


@given(any_text)
def test_escaped_tokens_are_valid_nats_tokens_and_reversible(name: str) -> None:
    token = escape_token(name)
    assert token
    assert re.fullmatch(r"[A-Za-z0-9_%-]+", token), token  # so no '.', '*', '>' or whitespace
    assert _unescape(token) == name


@given(any_text, any_text)
def test_escaping_is_injective(a: str, b: str) -> None:
    assume(a != b)
    assert escape_token(a) != escape_token(b)


@given(st.lists(st.text(), min_size=3, max_size=3))
def test_subject_has_one_token_per_name(names: list[str]) -> None:
    database, schema, table = names
    tokens = subject("walflow", database, schema, table, "insert").split(".")
    assert [_unescape(t) for t in tokens] == ["walflow", database, schema, table, "insert"]


# -- envelope --------------------------------------------------------------------------------


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
    assert message.subject == "walflow.app.public.orders.insert"
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
    assert message.subject == "walflow.app.public.orders.update"


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
    assert message.subject == "walflow.app.public.orders.delete"


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


def test_subject_uses_prefix_database_and_escaped_names() -> None:
    sink = make_sink(destination={"type": "nats", "host": "nats", "subject_prefix": "sequin"})
    message = Envelope(sink, "app")(make_change("delete", schema="Sales", table="line.items", old={"id": 1}))
    assert message.subject == "sequin.app.Sales.line%2Eitems.delete"


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
