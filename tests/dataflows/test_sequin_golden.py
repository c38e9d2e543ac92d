"""Golden tests: a Sequin config, real changes through real servers, and the message Sequin publishes.

Each expected message is built the way Sequin builds it (sequinstream/sequin at 46ce4e10):
values by ``lib/sequin/postgres/value_caster.ex`` and Jason, ``changes`` and ``record`` by
``consumers.ex`` (``message_changes``, ``message_record``), ``record_pks`` and
``commit_idx`` by ``slot_producer/processor.ex`` and ``slot_producer.ex``, the metadata by
``consumer_event_data.ex``, the subject and ``Nats-Msg-Id`` by
``runtime/routing/consumers/nats.ex``, a partition's name by ``slot_producer/relation.ex``;
the shapes as in Sequin's docs (``docs/reference/messages.mdx``,
``docs/how-to/annotate-changes.mdx``). Messages are compared as parsed JSON (key order aside).

Where walflow deliberately differs (Sequin loses information: ``time`` microseconds and
``timetz`` offsets, the old non-key values of an update that changed the key under
REPLICA IDENTITY DEFAULT; or a guarantee needs it: ``Nats-Msg-Id``), the expectation says
so next to the value, as the README's migration section does.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import Stored, assert_running, pipeline, stored, write_config

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)

TYPED = """
    id int PRIMARY KEY,
    c_bool boolean, c_int2 smallint, c_int8 bigint, c_float4 real, c_float8 double precision, c_nan float8,
    c_inf float8, c_numeric numeric(10, 2), c_tiny numeric, c_numeric_nan numeric, c_money money,
    c_char char(3), c_varchar varchar(20), c_text text, c_bytea bytea,
    c_ts timestamp, c_ts_frac timestamp, c_tstz timestamptz, c_tstz_frac timestamptz, c_ts_inf timestamp,
    c_date date, c_time time, c_timetz timetz, c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb,
    c_inet inet, c_cidr cidr, c_macaddr macaddr, c_bit bit(3), c_tsvector tsvector, c_xml xml, c_point point,
    c_oid oid, c_lsn pg_lsn, c_int4range int4range, c_mood mood, c_posint posint, c_pair pair,
    c_int_array int[], c_text_array text[], c_bool_array bool[], c_numeric_array numeric[],
    c_tstz_array timestamptz[], c_jsonb_array jsonb[], c_mood_array mood[], c_bytea_array bytea[],
    c_interval_array interval[], c_null text
"""

TYPED_VALUES = """
    1, true, -32768, 9223372036854775807, 1.5, 0.1, 'NaN', '-Infinity', 12.50, -0.00000000000000000001, 'NaN',
    12.34, 'ab', 'varchar', 'héllo ✓ \\ "quoted"', '\\xdeadbeef'::bytea,
    '2024-01-02 03:04:05', '2024-01-02 03:04:05.12', '2024-01-02 03:04:05+02', '2024-01-02 03:04:05.123456+00',
    'infinity', '2024-02-29', '23:59:59.999999', '12:00:00+05:30', '1 year 2 mons 3 days 04:05:06.789',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.5, null]}', '{"b": {"c": "d"}, "n": 12345678901234567890}',
    '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', B'101', 'a fat cat', '<x>1</x>', '(1,2)',
    26, '0/16B3748', '[1,10)', 'happy', 42, '(7,"x y")',
    '{1,NULL,3}', '{"a,b","c\\"d",NULL}', '{t,f}', '{1.5,0.00000001}',
    '{"2024-01-02 03:04:05+00","2024-01-02 03:04:05.5+00"}', ARRAY['{"k": 1}'::jsonb], '{sad,happy}',
    ARRAY['\\x01'::bytea], ARRAY['1 mon'::interval], NULL
"""

#: The record Sequin publishes for TYPED_VALUES, value by value (value_caster.ex, then Jason).
TYPED_RECORD: dict[str, Any] = {
    "id": 1,
    "c_bool": True,
    "c_int2": -32768,
    "c_int8": 9223372036854775807,
    "c_float4": 1.5,
    "c_float8": 0.1,
    "c_nan": "NaN",  # Ecto cannot cast "NaN" to a float: Sequin keeps the text
    "c_inf": "-Infinity",
    "c_numeric": "12.50",  # Decimal, written by Jason as a string, positionally
    "c_tiny": "-0.00000000000000000001",
    "c_numeric_nan": "NaN",
    "c_money": "$12.34",  # Ecto cannot cast "$12.34" to a decimal: the text
    "c_char": "ab ",
    "c_varchar": "varchar",
    "c_text": 'héllo ✓ \\ "quoted"',
    "c_bytea": "\\xdeadbeef",  # Ecto's :binary cast keeps Postgres's hex text
    "c_ts": "2024-01-02T03:04:05.000000",  # :naive_datetime_usec: always six digits
    "c_ts_frac": "2024-01-02T03:04:05.120000",
    "c_tstz": "2024-01-02T01:04:05.000000Z",  # :utc_datetime_usec
    "c_tstz_frac": "2024-01-02T03:04:05.123456Z",
    "c_ts_inf": "infinity",
    "c_date": "2024-02-29",
    # Sequin casts time and timetz with Ecto's :time, which drops the fraction and the
    # offset ("23:59:59", "12:00:00"): walflow keeps both (README, migration section)
    "c_time": "23:59:59.999999",
    "c_timetz": "12:00:00+05:30",
    "c_interval": {"months": 14, "days": 3, "microseconds": 14706789000},
    "c_uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "c_json": {"a": [1, 2.5, None]},
    "c_jsonb": {"b": {"c": "d"}, "n": 12345678901234567890},
    "c_inet": "192.168.0.1/24",
    "c_cidr": "10.0.0.0/8",
    "c_macaddr": "08:00:2b:01:02:03",
    "c_bit": "101",
    "c_tsvector": "'a' 'cat' 'fat'",
    "c_xml": "<x>1</x>",
    "c_point": "(1,2)",  # Ecto cannot cast "(1,2)" to {:array, :float}: the text
    "c_oid": 26,
    "c_lsn": "0/16B3748",
    "c_int4range": "[1,10)",
    "c_mood": "happy",
    "c_posint": 42,  # a domain casts as its base type
    "c_pair": '(7,"x y")',
    "c_int_array": [1, None, 3],
    "c_text_array": ["a,b", 'c"d', None],
    "c_bool_array": [True, False],
    "c_numeric_array": ["1.5", "0.00000001"],
    "c_tstz_array": ["2024-01-02T03:04:05.000000Z", "2024-01-02T03:04:05.500000Z"],
    "c_jsonb_array": [{"k": 1}],
    "c_mood_array": ["sad", "happy"],
    "c_bytea_array": ["\\x01"],
    "c_interval_array": [{"months": 1, "days": 0, "microseconds": 0}],
    "c_null": None,
}

SINK = "shop-to-nats"
SINK_ID = "f47ac10b-58cc-4372-a567-0e02b2c3d479"


@pytest.fixture
def shop(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        conn.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
        conn.execute("CREATE TYPE pair AS (n int, s text)")
        conn.execute(f"CREATE TABLE typed ({TYPED})")
        # the key in another order than the columns: record_pks follow the columns (Sequin sorts by attnum)
        conn.execute("CREATE TABLE orders (id int, region text, status text, note text, PRIMARY KEY (region, id))")
        conn.execute("CREATE TABLE full_orders (id int PRIMARY KEY, status text, placed timestamptz)")
        conn.execute("ALTER TABLE full_orders REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text)")
        conn.execute("ALTER TABLE docs ALTER body SET STORAGE EXTERNAL")  # out of line: TOASTed
        conn.execute("CREATE TABLE full_docs (id int PRIMARY KEY, title text, body text)")
        conn.execute("ALTER TABLE full_docs ALTER body SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE full_docs REPLICA IDENTITY FULL")
        conn.execute('CREATE TABLE "Line Items" (id int PRIMARY KEY, "Qty" int)')
        conn.execute('CREATE TABLE "café" (id int PRIMARY KEY)')
        conn.execute("CREATE TABLE events (id int, at date, kind text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)")
        conn.execute("CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    return database


class Sequin:
    """What Sequin publishes for one change, given what only the server knows (position, time)."""

    def __init__(self, db: Database, names: TestNames, consumer_annotations: dict[str, Any]) -> None:
        self.consumer = {"id": SINK_ID, "name": SINK, "annotations": consumer_annotations}
        self.db = db
        self.names = names

    def message(self, got: Stored, *, action: str, table: str, record: dict[str, Any],
                changes: dict[str, Any] | None, pks: list[str], idx: int, schema: str = "public",
                annotations: dict[str, Any] | None = None) -> dict[str, Any]:
        meta = got.event["metadata"]
        lsn = meta["commit_lsn"]  # the server's: checked against the WAL separately
        return {
            "record": record,
            "changes": changes,
            "action": action,
            "metadata": {
                "database_name": "shop",
                "table_schema": schema,
                "table_name": table,
                "commit_timestamp": meta["commit_timestamp"],
                "commit_lsn": lsn,
                "commit_idx": idx,
                # Sequin: base64("<lsn>:<idx>"); walflow names database and sink (msg_id: sequin gives Sequin's)
                "idempotency_key": base64.b64encode(f"shop/{SINK}/{lsn}:{idx}".encode()).decode(),
                "record_pks": pks,
                "transaction_annotations": annotations,
                "enrichment": None,
                "consumer": self.consumer,
                "database": {
                    "id": meta["database"]["id"],  # derived from the name: checked below
                    "name": "shop",
                    "annotations": {"team": "data"},
                    "database": self.names.database,
                    "hostname": conninfo_to_dict(self.db.dsn)["host"],
                },
            },
        }


def want(**fields: Any) -> dict[str, Any]:
    """The fields of one expected message (Sequin.message's keywords)."""
    return fields


def _subject(action: str, table: str, schema: str = "public") -> str:
    return f"sequin.shop.{schema}.{table}.{action}"  # no subject_prefix in the file: Sequin's


def _run(config: Path, shop: Database, steps: list[Callable[[psycopg.Connection[Any]], object]]) -> list[tuple[int, int]]:
    """Run the pipeline, apply ``steps`` (one transaction each) and wait until the slot
    passed them. Returns, per step, the WAL insert positions around it."""
    bounds = []
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(shop), timeout=60, what="the pipeline to open its slot",
                 check=lambda: assert_running(proc))
        with shop.connect() as conn:
            for step in steps:
                before = shop.current_lsn()
                with conn.transaction():
                    step(conn)
                bounds.append((before, shop.current_lsn()))
        end = shop.current_lsn()
        wait_for(lambda: _confirmed(shop) >= end, timeout=60, what="the slot to pass the changes",
                 check=lambda: assert_running(proc))
    return bounds


def test_a_sequin_config_publishes_what_sequin_publishes(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    big = "".join(uuid.uuid4().hex for _ in range(4096))  # 128 KiB, incompressible: stored out of line
    sink = {"name": SINK, "id": SINK_ID, "annotations": {"team": "cdc"},
            "destination": {"stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    written = yaml.safe_load(config.read_text())
    written["databases"][0]["annotations"] = {"team": "data"}
    config.write_text(yaml.safe_dump(written))
    with shop.connect() as conn:  # rows the changes below work on, before the pipeline starts
        conn.execute("INSERT INTO docs VALUES (1, 'a', %s)", [big])
        conn.execute("INSERT INTO full_docs VALUES (1, 'a', %s)", [big])

    steps: list[Callable[[psycopg.Connection[Any]], object]] = [
        lambda c: c.execute(f"INSERT INTO typed VALUES ({TYPED_VALUES})"),
        lambda c: (c.execute("INSERT INTO orders VALUES (7, 'eu', 'new', 'x')"),
                   c.execute("INSERT INTO orders VALUES (8, 'us', 'new', NULL)")),
        lambda c: c.execute("UPDATE orders SET status = 'paid' WHERE id = 7"),
        lambda c: c.execute("UPDATE orders SET id = 70 WHERE id = 7"),
        lambda c: c.execute("DELETE FROM orders WHERE id = 70"),
        lambda c: c.execute("INSERT INTO full_orders VALUES (1, 'new', '2026-11-30 04:00:00+00')"),
        lambda c: c.execute("UPDATE full_orders SET status = 'paid' WHERE id = 1"),
        lambda c: c.execute("DELETE FROM full_orders WHERE id = 1"),
        lambda c: c.execute("UPDATE docs SET title = 'b' WHERE id = 1"),
        lambda c: c.execute("UPDATE full_docs SET title = 'b' WHERE id = 1"),
        lambda c: c.execute('INSERT INTO "Line Items" VALUES (1, 3)'),
        lambda c: c.execute("INSERT INTO events VALUES (1, '2024-06-01', 'signup')"),
        lambda c: (c.execute("INSERT INTO orders VALUES (9, 'eu', 'new', NULL)"),
                   c.execute("SELECT pg_logical_emit_message(true, 'sequin:transaction_annotations.set', "
                             "'{\"username\": \"paul.atreides\", \"source\": \"web_ui\"}')"),
                   c.execute("UPDATE orders SET note = 'vip' WHERE id = 9"),
                   c.execute("SELECT pg_logical_emit_message(true, 'sequin:transaction_annotations.clear', '')"),
                   c.execute("DELETE FROM orders WHERE id = 9")),
        lambda c: c.execute('INSERT INTO "café" VALUES (1)'),
    ]
    bounds = _run(config, shop, steps)
    events = sorted(stored(nats_srv.url, names.stream),
                    key=lambda e: (e.event["metadata"]["commit_lsn"], e.event["metadata"]["commit_idx"]))
    sequin = Sequin(shop, names, {"team": "cdc"})
    blank_order = {"id": None, "region": None, "status": None, "note": None}
    full_row = {"id": 1, "status": "new", "placed": "2026-11-30T04:00:00.000000Z"}
    expected = [
        # (subject, Sequin's message, step)
        (_subject("insert", "typed"), want(action="insert", table="typed", record=TYPED_RECORD, changes=None,
                                           pks=["1"], idx=0), 0),
        (_subject("insert", "orders"), want(action="insert", table="orders", changes=None, idx=0, pks=["7", "eu"],
                                            record={"id": 7, "region": "eu", "status": "new", "note": "x"}), 1),
        (_subject("insert", "orders"), want(action="insert", table="orders", changes=None, idx=1, pks=["8", "us"],
                                            record={"id": 8, "region": "us", "status": "new", "note": None}), 1),
        # REPLICA IDENTITY DEFAULT, key unchanged: Postgres sends no old row, Sequin's changes are {}
        (_subject("update", "orders"), want(action="update", table="orders", changes={}, idx=0, pks=["7", "eu"],
                                            record={"id": 7, "region": "eu", "status": "paid", "note": "x"}), 2),
        # the key changed: Postgres sends the old key, walflow keeps it in changes (Sequin's
        # processor.ex reads only an 'O' old tuple and publishes {}: README, what still differs)
        (_subject("update", "orders"), want(action="update", table="orders", changes={"id": 7}, idx=0,
                                            pks=["70", "eu"],
                                            record={"id": 70, "region": "eu", "status": "paid", "note": "x"}), 3),
        # delete under DEFAULT: every column, those Postgres did not send as null
        (_subject("delete", "orders"), want(action="delete", table="orders", changes=None, idx=0, pks=["70", "eu"],
                                            record={**blank_order, "id": 70, "region": "eu"}), 4),
        (_subject("insert", "full_orders"), want(action="insert", table="full_orders", changes=None, idx=0, pks=["1"],
                                                 record=full_row), 5),
        (_subject("update", "full_orders"), want(action="update", table="full_orders", changes={"status": "new"},
                                                 idx=0, pks=["1"], record={**full_row, "status": "paid"}), 6),
        (_subject("delete", "full_orders"), want(action="delete", table="full_orders", changes=None, idx=0,
                                                 pks=["1"], record={**full_row, "status": "paid"}), 7),
        # a TOASTed column the update left alone: Sequin's marker; FULL sends the old value
        (_subject("update", "docs"), want(action="update", table="docs", changes={}, idx=0, pks=["1"],
                                          record={"id": 1, "title": "b", "body": "unchanged_toast"}), 8),
        (_subject("update", "full_docs"), want(action="update", table="full_docs", changes={"title": "a"}, idx=0,
                                               pks=["1"], record={"id": 1, "title": "b", "body": big}), 9),
        # Sequin does not escape names in subjects (a space makes its subject invalid);
        # walflow escapes them reversibly (README), the payload holds the names as they are
        (_subject("insert", "Line%20Items"), want(action="insert", table="Line Items", changes=None, idx=0,
                                                  pks=["1"], record={"id": 1, "Qty": 3}), 10),
        # a partition's change is reported as its parent's
        (_subject("insert", "events"), want(action="insert", table="events", changes=None, idx=0,
                                            pks=["1", "2024-06-01"],
                                            record={"id": 1, "at": "2024-06-01", "kind": "signup"}), 11),
        # annotations apply to what follows them; each logical message takes an index too
        (_subject("insert", "orders"), want(action="insert", table="orders", changes=None, idx=0, pks=["9", "eu"],
                                            record={"id": 9, "region": "eu", "status": "new", "note": None}), 12),
        (_subject("update", "orders"), want(action="update", table="orders", changes={}, idx=2, pks=["9", "eu"],
                                            annotations={"username": "paul.atreides", "source": "web_ui"},
                                            record={"id": 9, "region": "eu", "status": "new", "note": "vip"}), 12),
        (_subject("delete", "orders"), want(action="delete", table="orders", changes=None, idx=4, pks=["9", "eu"],
                                            record={**blank_order, "id": 9, "region": "eu"}), 12),
        # a name NATS carries as it is: the subject Sequin publishes
        (_subject("insert", "café"), want(action="insert", table="café", changes=None, idx=0, pks=["1"],
                                         record={"id": 1}), 13),
    ]
    assert [e.subject for e in events] == [subject for subject, _, _ in expected]
    for got, (_, fields, step) in zip(events, expected, strict=True):
        assert got.event == sequin.message(got, **fields), got.subject
        assert got.msg_id == got.event["metadata"]["idempotency_key"]
        before, after = bounds[step]
        assert before < got.event["metadata"]["commit_lsn"] <= after, "commit_lsn is the transaction's commit LSN"
        stamp = got.event["metadata"]["commit_timestamp"]
        assert len(stamp) == 27 and stamp.endswith("Z"), stamp  # 2026-12-01T15:00:00.123456Z
    database_ids = {e.event["metadata"]["database"]["id"] for e in events}
    assert len(database_ids) == 1 and uuid.UUID(database_ids.pop())


def test_unix_microsecond_converts_record_and_changes_not_the_commit_timestamp(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Sequin's format_timestamps: DateTime and NaiveDateTime (read as UTC) in record and
    changes become integers; metadata keeps its ISO commit_timestamp."""
    sink = {"name": SINK, "timestamp_format": "unix_microsecond", "destination": {"stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    _run(config, shop, [
        lambda c: c.execute("INSERT INTO full_orders VALUES (1, 'new', '2026-11-30 04:00:00.5+00')"),
        lambda c: c.execute("UPDATE full_orders SET placed = '1970-01-01 00:00:01+00' WHERE id = 1"),
    ])
    insert, update = (e.event for e in stored(nats_srv.url, names.stream))
    assert insert["record"]["placed"] == 1_796_011_200_500_000
    assert update["record"]["placed"] == 1_000_000 and update["changes"] == {"placed": 1_796_011_200_500_000}
    assert isinstance(insert["metadata"]["commit_timestamp"], str)
    assert insert["metadata"]["consumer"]["annotations"] == {}  # Sequin's default
    assert uuid.UUID(insert["metadata"]["consumer"]["id"])  # no id in the file: derived from the names


def test_a_backfilled_row_is_sequins_read_message(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """``initial_backfill: true``: existing rows arrive as Sequin's ``read`` (docs/reference/messages.mdx,
    "Read Example (Backfill)"): the same shape as an insert, ``changes`` null."""
    with shop.connect() as conn:
        conn.execute("INSERT INTO orders VALUES (7, 'eu', 'new', NULL)")
    sink = {"name": SINK, "id": SINK_ID, "initial_backfill": True,
            "source": {"include_tables": ["public.orders"]}, "destination": {"stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    written = yaml.safe_load(config.read_text())
    written["databases"][0]["annotations"] = {"team": "data"}
    config.write_text(yaml.safe_dump(written))
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) >= 1, timeout=60, what="the read",
                 check=lambda: assert_running(proc))
    (read,) = stored(nats_srv.url, names.stream)
    expected = Sequin(shop, names, {}).message(
        read, action="read", table="orders", changes=None, pks=["7", "eu"], idx=read.event["metadata"]["commit_idx"],
        record={"id": 7, "region": "eu", "status": "new", "note": None})
    expected["metadata"]["idempotency_key"] = read.msg_id  # walflow's read id: the backfill and the row
    assert read.subject == _subject("read", "orders")
    assert read.event == expected
    assert isinstance(read.event["metadata"]["commit_lsn"], int) and read.event["metadata"]["commit_lsn"] > 0
