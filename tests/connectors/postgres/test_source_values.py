"""Column values through the source equal what SELECT returns through psycopg, type by type."""

from __future__ import annotations

import datetime as dt
import math
import pickle
import uuid
from decimal import Decimal
from typing import Any

import pytest

from core.events import UNCHANGED_TOAST, Change
from tests.harness import Database, TestNames
from tests.replication import drain, partition

COLUMNS = """
    id int PRIMARY KEY,
    c_smallint smallint, c_bigint bigint, c_numeric numeric(40, 30), c_real real, c_double double precision,
    c_bool boolean, c_text text, c_varchar varchar(20), c_char char(3), c_bytea bytea,
    c_date date, c_time time, c_timetz timetz, c_ts timestamp, c_tstz timestamptz, c_interval interval,
    c_uuid uuid, c_json json, c_jsonb jsonb, c_inet inet, c_cidr cidr, c_macaddr macaddr,
    c_int_array int[], c_text_array text[], c_mood mood, c_mood_array mood[], c_posint posint,
    c_posint_array posint[], c_int4range int4range, c_tstzrange tstzrange, c_floatrange floatrange,
    c_point point, c_pair pair, c_money money, c_nan double precision, c_null text,
    c_mapped inet, c_oidvector oidvector, c_int2vector int2vector
"""

VALUES = """
    1, 32767, 9223372036854775807, 1234567890.123456789012345678901234567890, 1.5, 0.1,
    true, 'héllo ✓ \\ "quoted"', 'varchar', 'ab', '\\xdeadbeef'::bytea,
    '2024-02-29', '23:59:59.999999', '12:00:00+05:30', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123456+02',
    '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.5, null]}',
    '{"b": {"c": "d"}, "n": 12345678901234567890}', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
    '{1,NULL,3}', '{"a,b","c\\"d",NULL}', 'happy', '{sad,happy}', 42,
    '{1,2}', '[1,10)', '[2024-01-01 00:00+00,2024-02-01 00:00+00)', '[1.5,2.5]',
    '(1,2)', '(7,"x y")', '12.34', 'NaN', NULL,
    '::ffff:1.2.3.4/128', '1 2 3', '4 5'
"""


@pytest.fixture
def typed(database: Database, names: TestNames) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        conn.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
        conn.execute("CREATE TYPE floatrange AS RANGE (subtype = float8, subtype_diff = float8mi)")
        conn.execute("CREATE TYPE pair AS (n int, s text)")
        conn.execute(f"CREATE TABLE typed ({COLUMNS})")
        conn.execute("CREATE TABLE edge (id int PRIMARY KEY, d date, ts timestamp, tstz timestamptz, big text)")
        conn.execute("ALTER TABLE edge ALTER big SET STORAGE EXTERNAL")  # out of line, uncompressed
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE typed, edge")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
    return database


def _changes(db: Database, sql: str, count: int) -> list[Change]:
    with partition(db.config(create=False)) as part:
        with db.connect() as conn:
            conn.execute(sql)
        return drain(part, lambda out: len(out) >= count)


def test_every_common_type_arrives_as_select_returns_it(typed: Database) -> None:
    change = _changes(typed, f"INSERT INTO typed VALUES ({VALUES})", 1)[0]
    with typed.connect() as conn:
        cur = conn.execute("SELECT * FROM typed")
        selected = dict(zip([d.name for d in cur.description or []], cur.fetchone() or [], strict=True))
    assert change.new is not None
    # Where walflow loads a value as Sequin publishes it, or plain psycopg (no registered
    # custom types) returns raw text and walflow knows better:
    better: dict[str, Any] = {
        "c_mood_array": ["sad", "happy"],  # enum array: a list of labels, not '{sad,happy}'
        "c_posint_array": [1, 2],  # domain array: loaded as the base type's array
        "c_inet": "192.168.0.1/24",  # inet and cidr: Postgres's own text (Python rewrites some)
        "c_cidr": "10.0.0.0/8",
        "c_mapped": "::ffff:1.2.3.4",  # as Postgres prints it (Python would write ::ffff:102:304/128)
        # as Sequin publishes them: Postgres's text for bytea, ranges and vectors ...
        "c_bytea": "\\xdeadbeef",
        "c_int4range": "[1,10)",
        "c_tstzrange": '["2024-01-01 00:00:00+00","2024-02-01 00:00:00+00")',
        "c_oidvector": "1 2 3",
        "c_int2vector": "4 5",
        # ... and intervals as the three fields Postgres stores
        "c_interval": {"months": 14, "days": 3, "microseconds": 14706789000},
    }
    for name, value in selected.items():
        expected = better.get(name, value)
        got = change.new[name]
        if name == "c_nan":
            assert math.isnan(got)
            continue
        assert (name, got) == (name, expected)
        assert type(got) is type(expected), name
    assert change.new["c_numeric"] == Decimal("1234567890.123456789012345678901234567890")
    assert change.new["c_tstz"] == dt.datetime(2024, 1, 2, 1, 4, 5, 123456, tzinfo=dt.UTC)
    assert change.new["c_jsonb"] == {"b": {"c": "d"}, "n": 12345678901234567890}
    assert change.new["c_floatrange"] == "[1.5,2.5]"  # a custom range: its text too
    assert change.new["c_uuid"] == uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert change.new["c_int_array"] == [1, None, 3] and change.new["c_mood"] == "happy"
    assert change.new["c_posint"] == 42 and change.new["c_point"] == "(1,2)" and change.new["c_pair"] == '(7,"x y")'
    assert change.new["c_null"] is None


def test_values_python_cannot_hold_fall_back_to_their_text(typed: Database) -> None:
    sql = (
        "INSERT INTO edge VALUES (1, 'infinity', '-infinity', 'infinity', NULL), "
        "(2, '0044-03-15 BC', '0044-03-15 12:00 BC', '2024-05-06 07:08:09+00', NULL)"
    )
    first, second = _changes(typed, sql, 2)
    assert first.new == {"id": 1, "d": "infinity", "ts": "-infinity", "tstz": "infinity", "big": None}
    assert second.new is not None
    assert (second.new["d"], second.new["ts"]) == ("0044-03-15 BC", "0044-03-15 12:00:00 BC")
    assert second.new["tstz"] == dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)


def test_unchanged_toast_is_marked_not_null_not_missing(typed: Database) -> None:
    big = "".join(uuid.uuid4().hex for _ in range(32768))  # 1 MiB, incompressible
    with typed.connect() as conn:
        conn.execute("INSERT INTO edge (id, big) VALUES (1, %s)", [big])
    updates = "UPDATE edge SET d = '2024-01-01' WHERE id = 1; ALTER TABLE edge REPLICA IDENTITY FULL; " \
              "UPDATE edge SET d = '2024-01-02' WHERE id = 1"
    insert, default_identity, full_identity = _changes(typed, updates, 3)
    assert insert.new is not None and insert.new["big"] == big
    assert default_identity.new is not None and default_identity.new["big"] is UNCHANGED_TOAST
    assert default_identity.old is None  # key unchanged: Postgres sends no old tuple
    assert full_identity.new is not None and full_identity.new["big"] is UNCHANGED_TOAST
    assert full_identity.old is not None and full_identity.old["big"] == big  # FULL: the old row, detoasted
    # the marker stays itself through a trip to another process
    assert pickle.loads(pickle.dumps(default_identity)).new["big"] is UNCHANGED_TOAST
