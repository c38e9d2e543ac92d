"""The catalog against a real PostgreSQL: loaders for the types pgoutput sends as text, the
resolution rule for types gone from the catalog, and the key of a table under DDL.

Values are the server's text output (what pgoutput sends: the type's output function),
read raw from a connection made as walflow makes it, with its pinned settings. Relations
are built from the catalog as pgoutput would describe them at the time of the change; the
DDL that follows is what walflow, lagging behind, finds when it reads them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import pickle
from collections.abc import Iterator

import psycopg
import pytest

from connectors.postgres.connection import conninfo
from connectors.postgres.relations import Column, Relation, TypeName
from connectors.postgres.types import MAX_JSON_DEPTH, Catalog, PgvectorLoader, TypeSpecs, loaders_for
from core.events import JsonText
from tests.harness import Database
from tests.pipeline import any_depth

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def conn(database: Database) -> Iterator[Conn]:
    with psycopg.connect(conninfo(database.config(), application_name="walflow-test"), autocommit=True) as conn:
        yield conn


def output(conn: Conn, expression: str) -> bytes:
    """The server's text output of ``expression``, as pgoutput sends it (no psycopg loader)."""
    result = conn.pgconn.exec_(f"SELECT {expression}".encode())
    assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.get_error_message()
    value = result.get_value(0, 0)
    assert value is not None
    return value


def oid_of(conn: Conn, expression: str) -> int:
    row = conn.execute(f"SELECT {expression}::oid").fetchone()
    assert row is not None
    return int(str(row[0]))


def relation_of(conn: Conn, table: str) -> Relation:
    """What pgoutput's Relation message says about ``table`` now: under FULL every column is
    flagged, else the primary key's columns."""
    row = conn.execute(
        "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        [table],
    ).fetchone()
    assert row is not None
    relid, namespace, name, identity = int(str(row[0])), str(row[1]), str(row[2]), str(row[3])
    columns = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod,"
        " coalesce(a.attnum = ANY (i.indkey::int2[]), false)"
        " FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [relid],
    ).fetchall()
    return Relation(
        relid,
        namespace,
        name,
        identity,
        tuple(
            Column(str(col), int(str(oid)), int(str(typmod)), identity == "f" or bool(pk))
            for col, oid, typmod, pk in columns
        ),
    )


def without(relation: Relation, *names: str) -> Relation:
    """The relation as a later Relation message would describe it once ``names`` are dropped."""
    columns = tuple(c for c in relation.columns if c.name not in names)
    return Relation(relation.relid, relation.namespace, relation.name, relation.replica_identity, columns)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- oidvector, int2vector --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'1 2 3'::int2vector", "1 2 3"),
        ("'-32768 32767'::int2vector", "-32768 32767"),
        ("''::int2vector", ""),
        ("'1 2 4294967295'::oidvector", "1 2 4294967295"),
        ("'26'::oidvector", "26"),
        ("ARRAY['1 2'::int2vector, '3'::int2vector, NULL]", ["1 2", "3", None]),
        ("ARRAY['1 2'::oidvector, ''::oidvector]", ["1 2", ""]),
        ("'{}'::int2vector[]", []),
    ],
)
def test_vectors_load_as_their_text_as_sequin_publishes_them(conn: Conn, expression: str, expected: object) -> None:
    catalog = Catalog(conn)
    oid = oid_of(conn, f"pg_typeof({expression})")
    assert oid in {22, 30, 1006, 1013}
    assert catalog.loader(oid)(output(conn, expression)) == expected


def test_a_catalog_column_of_type_int2vector(conn: Conn) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, keys int2vector, types oidvector)")
    catalog = Catalog(conn)
    table = catalog.describe(relation_of(conn, "t"))
    keys, types = table.loaders[1:]
    assert keys(output(conn, "indkey FROM pg_index WHERE indrelid = 't'::regclass")) == "1"
    assert types(output(conn, "proargtypes FROM pg_proc WHERE oid = 'int4pl'::regproc")) == "23 23"


# -- inet, cidr -------------------------------------------------------------------------------

_NETWORKS = [
    "'::ffff:1.2.3.4/128'::inet",
    "'::ffff:1.2.3.4/120'::inet",
    "'::ffff:1.2.3.4/128'::cidr",
    "'::ffff:1.2.3.0/120'::cidr",
    "'1.2.3.4'::inet",
    "'192.168.1.5/24'::inet",
    "'10.0.0.0/8'::cidr",
    "'2001:db8::1/64'::inet",
]


@pytest.mark.parametrize("expression", _NETWORKS)
def test_networks_load_as_postgres_own_text(conn: Conn, expression: str) -> None:
    catalog = Catalog(conn)
    text = output(conn, expression)
    assert catalog.loader(oid_of(conn, f"pg_typeof({expression})"))(text) == text.decode()


def test_ipv4_mapped_ipv6_is_not_rewritten(conn: Conn) -> None:
    catalog = Catalog(conn)
    assert output(conn, "'::ffff:1.2.3.4/128'::cidr") == b"::ffff:1.2.3.4/128"
    assert catalog.loader(650)(b"::ffff:1.2.3.4/128") == "::ffff:1.2.3.4/128"  # ipaddress: ::ffff:102:304/128
    assert catalog.loader(869)(b"::ffff:1.2.3.4/128") == "::ffff:1.2.3.4/128"


@pytest.mark.parametrize("kind", ["inet", "cidr"])
def test_network_arrays_and_domains_load_as_str(conn: Conn, kind: str) -> None:
    conn.execute(f"CREATE DOMAIN net AS {kind}")
    catalog = Catalog(conn)
    elements = [e for e in _NETWORKS if e.endswith(kind)]
    array = f"ARRAY[{', '.join(elements)}, NULL]"
    expected = [output(conn, e).decode() for e in elements] + [None]
    assert catalog.loader(oid_of(conn, f"'{kind}[]'::regtype"))(output(conn, array)) == expected
    assert catalog.loader(oid_of(conn, "'net'::regtype"))(output(conn, elements[0])) == expected[0]
    assert catalog.loader(oid_of(conn, "'net[]'::regtype"))(output(conn, array)) == expected


# -- type resolution when the type is gone -----------------------------------------------------


@pytest.mark.parametrize("namespace", ["", "pg_catalog"])  # pgoutput sends pg_catalog as ""
def test_a_dropped_domain_loads_as_the_base_type_its_type_message_named(
    conn: Conn, caplog: pytest.LogCaptureFixture, namespace: str
) -> None:
    conn.execute("CREATE DOMAIN d AS int; CREATE DOMAIN ds AS int[]; CREATE TABLE t (id int PRIMARY KEY, v d, a ds)")
    relation = relation_of(conn, "t")
    d, ds = oid_of(conn, "'d'::regtype"), oid_of(conn, "'ds'::regtype")
    conn.execute("DROP TABLE t; DROP DOMAIN d; DROP DOMAIN ds")  # before walflow reads the change
    catalog = Catalog(conn)
    catalog.type_seen(TypeName(d, namespace, "int4"))
    catalog.type_seen(TypeName(ds, namespace, "_int4"))
    table = catalog.describe(relation)
    assert table.loaders[1](b"3") == 3
    assert table.loaders[2](b"{1,2}") == [1, 2]
    assert catalog.effective_oid(d) == 23
    assert catalog.effective_oid(ds) == 1007
    assert warnings(caplog) == []


def test_the_type_message_and_the_catalog_agree_while_the_domain_exists(conn: Conn) -> None:
    conn.execute("CREATE DOMAIN d AS varchar(10)")
    d = oid_of(conn, "'d'::regtype")
    told = Catalog(conn)
    told.type_seen(TypeName(d, "", "varchar"))
    assert told.effective_oid(d) == Catalog(conn).effective_oid(d) == 1043


def test_a_dropped_type_no_type_message_named_as_built_in_loads_as_text_with_one_warning(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # An enum named like a built-in type, in another schema: its name is not psycopg's int4.
    conn.execute("CREATE TYPE public.int4 AS ENUM ('3'); CREATE DOMAIN lost AS int")
    enum, lost = oid_of(conn, "'public.int4'::regtype"), oid_of(conn, "'lost'::regtype")
    conn.execute("DROP TYPE public.int4; DROP DOMAIN lost")
    catalog = Catalog(conn)
    catalog.type_seen(TypeName(enum, "public", "int4"))
    assert catalog.loader(enum)(b"3") == "3"
    assert catalog.loader(lost)(b"3") == "3"  # no Type message at all: the catalog decides
    assert catalog.loader(lost)(b"3") == "3"
    assert warnings(caplog) == [
        f"type OID {enum} is not in pg_type; its values are passed as text",
        f"type OID {lost} is not in pg_type; its values are passed as text",
    ]


def test_a_type_message_naming_a_custom_type_leaves_it_to_the_catalog(conn: Conn) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('ok'); CREATE DOMAIN dm AS mood[]")
    dm = oid_of(conn, "'dm'::regtype")
    catalog = Catalog(conn)
    catalog.type_seen(TypeName(dm, "public", "_mood"))
    assert catalog.loader(dm)(b"{ok}") == ["ok"]


# -- the key under REPLICA IDENTITY FULL -------------------------------------------------------


def test_full_table_dropped_keeps_its_key_for_a_new_version(conn: Conn, caplog: pytest.LogCaptureFixture) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, w text); ALTER TABLE t REPLICA IDENTITY FULL")
    first = relation_of(conn, "t")
    catalog = Catalog(conn)
    assert catalog.describe(first).key_columns == ("id",)
    conn.execute("DROP TABLE t")  # walflow reads the next version after the table is gone
    table = catalog.describe(without(first, "w"))
    assert table.key_columns == ("id",)
    assert table.identity_columns == ("id", "v")
    assert warnings(caplog) == []


def test_a_never_seen_dropped_full_table_is_one_group_with_one_warning(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text); ALTER TABLE t REPLICA IDENTITY FULL")
    relation = relation_of(conn, "t")
    conn.execute("DROP TABLE t")
    catalog = Catalog(conn)
    assert catalog.describe(relation).key_columns == ()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")  # another table, a new relid
    assert catalog.describe(relation).key_columns == ()  # stays one group, no second warning
    (message,) = warnings(caplog)
    assert "public.t" in message and "kept in order as one group" in message and "no primary key" in message


def test_a_full_table_without_primary_key_is_one_group_with_one_warning(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute("CREATE TABLE t (id int, v text); ALTER TABLE t REPLICA IDENTITY FULL")
    catalog = Catalog(conn)
    assert catalog.describe(relation_of(conn, "t")).key_columns == ()
    conn.execute("ALTER TABLE t ADD PRIMARY KEY (id)")
    assert catalog.describe(relation_of(conn, "t")).key_columns == ()  # a group never splits mid-run
    assert len(warnings(caplog)) == 1


def test_a_primary_key_not_published_is_one_group(conn: Conn, caplog: pytest.LogCaptureFixture) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text); ALTER TABLE t REPLICA IDENTITY FULL")
    catalog = Catalog(conn)
    assert catalog.describe(without(relation_of(conn, "t"), "id")).key_columns == ()  # a column list without id
    (message,) = warnings(caplog)
    assert "primary key (id) is not among its published columns" in message


def test_an_altered_primary_key_keeps_the_old_key_while_its_columns_exist(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute("CREATE TABLE t (a int PRIMARY KEY, b int NOT NULL, c int); ALTER TABLE t REPLICA IDENTITY FULL")
    catalog = Catalog(conn)
    assert catalog.describe(relation_of(conn, "t")).key_columns == ("a",)
    conn.execute("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (b)")
    assert catalog.describe(relation_of(conn, "t")).key_columns == ("a",)
    assert Catalog(conn).describe(relation_of(conn, "t")).key_columns == ("b",)  # the next run's key
    assert warnings(caplog) == []

    conn.execute("ALTER TABLE t DROP COLUMN a")  # the key columns are gone: the whole table, once
    assert catalog.describe(relation_of(conn, "t")).key_columns == ()
    assert catalog.describe(relation_of(conn, "t")).key_columns == ()
    (message,) = warnings(caplog)
    assert "public.t" in message and "key columns (a) are no longer all among its columns" in message


def test_a_keyed_table_turned_full_keeps_its_key(conn: Conn) -> None:
    conn.execute("CREATE TABLE t (a int PRIMARY KEY, b int NOT NULL UNIQUE)")
    catalog = Catalog(conn)
    assert catalog.describe(relation_of(conn, "t")).key_columns == ("a",)
    conn.execute("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (b), REPLICA IDENTITY FULL")
    assert catalog.describe(relation_of(conn, "t")).key_columns == ("a",)


def test_default_and_index_identity_use_the_flagged_columns(conn: Conn, caplog: pytest.LogCaptureFixture) -> None:
    conn.execute("CREATE TABLE t (a int PRIMARY KEY, b int)")
    catalog = Catalog(conn)
    relation = relation_of(conn, "t")
    assert catalog.describe(relation).key_columns == ("a",)
    flagged_b = tuple(Column(c.name, c.type_oid, c.typmod, c.name == "b") for c in relation.columns)
    index = Relation(relation.relid, relation.namespace, relation.name, "i", flagged_b)
    table = catalog.describe(index)
    assert (table.key_columns, table.identity_columns) == (("b",), ("b",))
    nothing = Relation(relation.relid, relation.namespace, relation.name, "n", ())
    assert catalog.describe(nothing).key_columns == ()
    assert warnings(caplog) == []


# -- values as Sequin publishes them ------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'1 year 2 mons 3 days 04:05:06.789'::interval", {"months": 14, "days": 3, "microseconds": 14706789000}),
        ("'-1 year -2 mons +3 days -04:05:06'::interval", {"months": -14, "days": 3, "microseconds": -14706000000}),
        ("'0'::interval", {"months": 0, "days": 0, "microseconds": 0}),
        ("'40 days'::interval", {"months": 0, "days": 40, "microseconds": 0}),
        ("'1000 hours 0.000001 seconds'::interval", {"months": 0, "days": 0, "microseconds": 3600000000001}),
        ("'-0.5 seconds'::interval", {"months": 0, "days": 0, "microseconds": -500000}),
        ("'178000000 years'::interval", {"months": 2136000000, "days": 0, "microseconds": 0}),
        ("ARRAY['1 mon'::interval, NULL]", [{"months": 1, "days": 0, "microseconds": 0}, None]),
    ],
)
def test_intervals_load_as_their_three_fields(conn: Conn, expression: str, expected: object) -> None:
    """Months, days and microseconds, as Postgres stores them and Sequin publishes them:
    nothing folded (psycopg's own loader makes a month 30 days and a year 365)."""
    oid = oid_of(conn, f"pg_typeof({expression})")
    assert Catalog(conn).loader(oid)(output(conn, expression)) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'\\x0102ff'::bytea", "\\x0102ff"),
        ("''::bytea", "\\x"),
        ("ARRAY['\\x01'::bytea, NULL]", ["\\x01", None]),
        ("'[1,10)'::int4range", "[1,10)"),
        ("'empty'::numrange", "empty"),
        ("'[2024-01-01,2024-02-01)'::daterange", "[2024-01-01,2024-02-01)"),
        ("'{[1,3), [5,7)}'::int4multirange", "{[1,3),[5,7)}"),
        ("ARRAY['[1,2)'::int8range]", ["[1,2)"]),
    ],
)
def test_bytea_and_ranges_load_as_postgres_text(conn: Conn, expression: str, expected: object) -> None:
    oid = oid_of(conn, f"pg_typeof({expression})")
    assert Catalog(conn).loader(oid)(output(conn, expression)) == expected


def test_a_custom_range_loads_as_its_text(conn: Conn) -> None:
    conn.execute("CREATE TYPE floatrange AS RANGE (subtype = float8, subtype_diff = float8mi)")
    oid = oid_of(conn, "'floatrange'::regtype")
    assert Catalog(conn).loader(oid)(output(conn, "'[1.5,2.5]'::floatrange")) == "[1.5,2.5]"


def test_a_partition_is_described_as_its_parent_as_sequin_reports_it(conn: Conn) -> None:
    conn.execute("CREATE TABLE events (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)")
    conn.execute("CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    conn.execute("CREATE SCHEMA plain")
    conn.execute("CREATE TABLE plain.t (id int PRIMARY KEY)")
    catalog = Catalog(conn)
    leaf = catalog.describe(relation_of(conn, "events_2024"))
    assert (leaf.schema, leaf.name, leaf.key_columns) == ("public", "events", ("id", "at"))
    plain = catalog.describe(relation_of(conn, "plain.t"))
    assert (plain.schema, plain.name) == ("plain", "t")


@pytest.mark.parametrize(
    ("text", "expected"),
    [(b"[1,2.5,-3e-05]", [1.0, 2.5, -3e-05]), (b"[]", []), (b"[0]", [0.0])],
)
def test_pgvector_values_load_as_lists_of_floats(text: bytes, expected: list[float]) -> None:
    """pgvector is not installed here: the loader alone, on its text output."""
    got = PgvectorLoader(0).load(text)
    assert got == expected and all(type(v) is float for v in got)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'{infinity,2024-01-01}'::date[]", ["infinity", dt.date(2024, 1, 1)]),
        ("'{{infinity,NULL},{2024-01-01,-infinity}}'::date[]", [["infinity", None], [dt.date(2024, 1, 1), "-infinity"]]),
        ("ARRAY['infinity'::timestamptz, '2024-01-01 00:00:00+00']",
         ["infinity", dt.datetime(2024, 1, 1, tzinfo=dt.UTC)]),
        ("ARRAY['0044-03-15 BC'::timestamp]", ["0044-03-15 00:00:00 BC"]),
    ],
)
def test_an_element_python_cannot_hold_stays_text_the_others_load(
    conn: Conn, expression: str, expected: object
) -> None:
    """Per element, as Sequin's value caster falls back."""
    oid = oid_of(conn, f"pg_typeof({expression})")
    assert Catalog(conn).loader(oid)(output(conn, expression)) == expected


# -- a table's loaders in another process ------------------------------------------------------


def test_a_table_pickled_to_another_process_converts_every_value_as_its_reader_does(conn: Conn) -> None:
    """Past the exchange a sink partition converts with loaders rebuilt from the table's
    TypeSpecs (no connection there): for built-in, custom and array types alike, the same
    values, and a custom array's registration travels with the table."""
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    conn.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    conn.execute("CREATE TYPE span AS RANGE (subtype = float8)")
    conn.execute("CREATE TYPE pair AS (a int, b text)")
    columns = {
        "id": "int PRIMARY KEY", "n": "numeric", "at": "timestamptz", "doc": "jsonb", "ints": "int[]",
        "gap": "interval", "raw": "bytea", "moods": "mood[]", "pos": "posint", "poss": "posint[]",
        "spans": "span[]", "pairs": "pair[]", "net": "inet", "d": "date",
    }
    conn.execute(f"CREATE TABLE typed ({', '.join(f'{c} {t}' for c, t in columns.items())})")
    values = ("1", "12.50", "'2026-11-30 04:00:00+00'", """'{"a": [1, 2.5, null]}'""", "'{1,NULL,3}'",
              "'1 year 2 days 00:00:01.5'", "'\\x0102'", "'{sad,ok}'", "5", "'{1,2}'", "'{\"[1,2)\"}'",
              "ARRAY[ROW(1, 'x')::pair]", "'::ffff:1.2.3.4'", "'infinity'")
    conn.execute(f"INSERT INTO typed VALUES ({', '.join(values)})")
    texts = [output(conn, f"{column} FROM typed") for column in columns]
    table = Catalog(conn, database="app").describe(relation_of(conn, "typed"))
    elsewhere = pickle.loads(pickle.dumps(table))
    assert elsewhere is not table and elsewhere.uid == table.uid and elsewhere.database == "app"
    assert (elsewhere.columns, elsewhere.key_columns, elsewhere.relid) == (table.columns, table.key_columns, table.relid)
    assert sorted(r.name for r in table.types.registrations) == ["mood[]", "pair[]", "posint[]", "span[]"]
    assert next(r for r in table.types.registrations if r.name == "posint[]").element == 23  # the domain's base
    for name, here, there, text in zip(table.columns, table.loaders, elsewhere.loaders, texts, strict=True):
        try:
            expected = here(text)
        except (psycopg.DataError, ValueError, OverflowError) as exc:  # 'infinity' date: convert falls back to text
            with pytest.raises(type(exc)):
                there(text)
            continue
        assert there(text) == expected, name
        assert type(there(text)) is type(expected), name


# -- json and jsonb of any depth ------------------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 254, 255, 256, 300, 1500])
@pytest.mark.parametrize("kind", ["json", "jsonb"])
def test_json_of_any_depth_the_server_accepts_loads_as_objects_or_its_exact_text(
    conn: Conn, kind: str, levels: int
) -> None:
    """The server's own text output (jsonb's canonical form, json's as written), through the
    catalog's loader and the one rebuilt past the exchange: Python objects up to MAX_JSON_DEPTH, its
    text beyond; either way the same JSON."""
    expression = f"""(repeat('[', {levels - 2}) || '{{"a" : 1, "a": [2, "x"]}}' || repeat(']', {levels - 2}))::{kind}"""
    text = output(conn, expression)
    oid = oid_of(conn, f"pg_typeof({expression})")
    for load in (Catalog(conn).loader(oid), loaders_for(TypeSpecs((oid,), ()))[0]):
        value = load(text)
        if levels <= MAX_JSON_DEPTH:
            with any_depth():
                assert value == json.loads(text)
        else:
            assert value == JsonText(text)
    if kind == "json":  # json keeps the text as written: spaces and both "a"
        assert b'{"a" : 1, "a": [2, "x"]}' in text
    else:
        assert b'{"a": [2, "x"]}' in text


def test_wide_json_and_what_python_would_read_inexactly(conn: Conn) -> None:
    wide = "(SELECT jsonb_agg(jsonb_build_object('id', g, 'tags', jsonb_build_array('a', g))) FROM generate_series(1, 500) g)"
    oid = oid_of(conn, f"pg_typeof({wide})")
    text = output(conn, wide)
    assert text.count(b"[") > MAX_JSON_DEPTH and Catalog(conn).loader(oid)(text) == json.loads(text)
    for expression in ("""'{"n": 1e400}'::json""", """'"\\ud800"'::json""", """'[1e400, 12345678901234567890]'::json"""):
        text = output(conn, expression)
        assert Catalog(conn).loader(oid_of(conn, f"pg_typeof({expression})"))(text) == JsonText(text), expression
    big = output(conn, "'1e400'::jsonb")  # jsonb prints the numeric's digits: an integer, exact
    assert Catalog(conn).loader(3802)(big) == 10**400


def test_an_array_of_deep_jsonb_loads_each_element(conn: Conn) -> None:
    expression = "ARRAY[(repeat('[', 400) || repeat(']', 400))::jsonb, '{\"a\": 1}'::jsonb, NULL]"
    text = output(conn, expression)
    got = Catalog(conn).loader(oid_of(conn, f"pg_typeof({expression})"))(text)
    assert got == [JsonText(b"[" * 400 + b"]" * 400), {"a": 1}, None]
