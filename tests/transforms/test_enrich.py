"""Enrichment queries against a real PostgreSQL: parameters, matching, limits, failures, a restart."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from config.shaping import Enrichment
from core.events import Table
from tests.harness import Database, Postgres
from transforms.enrich import Enricher, EnrichmentError

LABEL = "sink 'orders'"

MakeEnricher = Callable[..., Enricher]


def table(name: str, columns: tuple[str, ...], key: tuple[str, ...]) -> Table:
    """A table as the source describes it. The enricher reads its key columns' names and
    positions only (keys are matched as text, values load by the result's own types)."""
    return Table("public", name, columns, key, key, tuple(bytes.decode for _ in columns))


ORDERS = table("orders", ("id", "customer_id", "status"), ("id",))


@pytest.fixture
def enricher(database: Database) -> Iterator[MakeEnricher]:
    """Enrichers on the test's database (``sql`` and the limits as keywords), closed afterwards."""
    made: list[Enricher] = []

    def make(sql: str, **limits: Any) -> Enricher:
        made.append(Enricher(Enrichment(sql=sql, **limits), database.config(), LABEL))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def shop(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text)")
        conn.execute("INSERT INTO customers VALUES (1, 'Ada'), (2, 'Grace')")
        conn.execute("INSERT INTO orders VALUES (10, 1, 'paid'), (11, 2, 'new'), (12, 1, 'new')")
    return database


def test_int_key_gives_the_whole_row_and_none_for_a_key_without_one(shop: Database, enricher: MakeEnricher) -> None:
    enrich = enricher("SELECT o.id, c.name AS customer FROM orders o JOIN customers c ON c.id = o.customer_id "
                      "WHERE o.id = ANY($1)")
    assert enrich.lookup(ORDERS, [("10",), ("11",), ("99",)]) == {
        ("10",): {"id": 10, "customer": "Ada"},
        ("11",): {"id": 11, "customer": "Grace"},
        ("99",): None,
    }


def test_uuid_key(database: Database, enricher: MakeEnricher) -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    with database.connect() as conn:
        conn.execute("CREATE TABLE users (id uuid PRIMARY KEY, name text, meta jsonb)")
        conn.execute("INSERT INTO users VALUES (%s, 'Ada', '{\"n\": 1}'), (%s, 'Grace', NULL)", ids)
    users = table("users", ("id", "name", "meta"), ("id",))
    enrich = enricher("SELECT id, name, meta FROM users WHERE id = ANY($1)")
    assert enrich.lookup(users, [(str(ids[0]),), (str(ids[1]),)]) == {
        (str(ids[0]),): {"id": ids[0], "name": "Ada", "meta": {"n": 1}},
        (str(ids[1]),): {"id": ids[1], "name": "Grace", "meta": None},
    }


def test_text_keys_pass_whatever_they_hold(database: Database, enricher: MakeEnricher) -> None:
    names = ['a"b', "c\\d", "e,f", "{g}", "NULL", "", " spaced ", "café"]
    with database.connect() as conn:
        conn.execute("CREATE TABLE tags (name text PRIMARY KEY)")
        for name in names:
            conn.execute("INSERT INTO tags VALUES (%s)", [name])
    tags = table("tags", ("name",), ("name",))
    enrich = enricher("SELECT name, length(name) AS size FROM tags WHERE name = ANY($1)")
    assert enrich.lookup(tags, [(name,) for name in names]) == {(name,): {"name": name, "size": len(name)}
                                                               for name in names}


def test_composite_key_one_array_per_column_in_alphabetical_order(database: Database,
                                                                   enricher: MakeEnricher) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE items (region text, id int, note text, PRIMARY KEY (id, region))")
        conn.execute("INSERT INTO items VALUES ('eu', 1, 'a'), ('us', 1, 'b'), ('eu', 2, 'c')")
    items = table("items", ("region", "id", "note"), ("id", "region"))  # keys in column order: (region, id)
    # $1 holds the ids and $2 the regions (alphabetical): swapped, the casts would fail
    enrich = enricher("SELECT i.* FROM items i JOIN unnest($1::int[], $2::text[]) AS k(id, region) USING (id, region)")
    assert enrich.lookup(items, [("eu", "1"), ("us", "1"), ("us", "2")]) == {
        ("eu", "1"): {"region": "eu", "id": 1, "note": "a"},
        ("us", "1"): {"region": "us", "id": 1, "note": "b"},
        ("us", "2"): None,
    }
    # Sequin's docs write unnest($1, $2): Postgres cannot tell which unnest untyped arrays are for
    untyped = enricher("SELECT i.* FROM items i JOIN unnest($1, $2) AS k(id, region) USING (id, region)")
    with pytest.raises(EnrichmentError, match=r"sink 'orders': .*unnest.* is not unique"):
        untyped.lookup(items, [("eu", "1")])


def test_duplicate_keys_are_queried_once(shop: Database, enricher: MakeEnricher) -> None:
    # one row per array element: a key passed twice would come back twice, an error
    enrich = enricher("SELECT id, id * 2 AS double FROM unnest($1::int[]) AS id")
    assert enrich.lookup(ORDERS, [("10",), ("10",), ("11",), ("10",)]) == {
        ("10",): {"id": 10, "double": 20},
        ("11",): {"id": 11, "double": 22},
    }


def test_more_keys_than_max_keys_run_several_queries(shop: Database, enricher: MakeEnricher) -> None:
    enrich = enricher("SELECT id, cardinality($1::int[]) AS batch FROM unnest($1::int[]) AS id", max_keys=2)
    found = enrich.lookup(ORDERS, [(str(i),) for i in range(5)])
    assert list(found) == [(str(i),) for i in range(5)]
    assert [row["id"] if row else None for row in found.values()] == [0, 1, 2, 3, 4]
    assert [row["batch"] if row else None for row in found.values()] == [2, 2, 2, 2, 1]


def test_a_query_must_select_every_key_column(database: Database, enricher: MakeEnricher) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE items (region text, id int, PRIMARY KEY (region, id))")
    items = table("items", ("region", "id"), ("region", "id"))
    enrich = enricher("SELECT id FROM unnest($1::int[], $2::text[]) AS k(id, region)")
    with pytest.raises(EnrichmentError, match=r"^sink 'orders': .* every primary-key column of public\.items "
                                              r"\(region, id\) .* does not select region$"):
        enrich.lookup(items, [("eu", "1")])


def test_a_query_without_rows_must_still_select_the_key(shop: Database, enricher: MakeEnricher) -> None:
    enrich = enricher("SELECT status FROM orders WHERE id = ANY($1)")
    with pytest.raises(EnrichmentError, match=r"does not select id$"):
        enrich.lookup(ORDERS, [("99",)])


def test_two_rows_for_one_key_fail(shop: Database, enricher: MakeEnricher) -> None:
    enrich = enricher("SELECT o.id, c.name FROM orders o CROSS JOIN customers c WHERE o.id = ANY($1)")
    with pytest.raises(EnrichmentError, match=r"returned 2 rows for one key of public\.orders \(id\): .* at most one "
                                              "row") as info:
        enrich.lookup(ORDERS, [("10",)])
    assert "10" not in str(info.value)  # the key is the dead letter's record_pks, masked where a mask applies


def test_a_sql_error_fails_at_once_and_the_connection_stays(shop: Database, enricher: MakeEnricher,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    missing = enricher("SELECT id FROM nowhere WHERE id = ANY($1)")
    started = time.monotonic()
    with pytest.raises(EnrichmentError, match=r'^sink \'orders\': .*relation "nowhere" does not exist \(SQLSTATE 42P01\)'):
        missing.lookup(ORDERS, [("10",)])
    with pytest.raises(EnrichmentError, match=r"syntax error"):
        enricher("SELEC id FROM orders WHERE id = ANY($1)").lookup(ORDERS, [("10",)])
    with pytest.raises(EnrichmentError, match=r"failed: InvalidTextRepresentation \(the server's text is not shown: "
                                              r"it may hold the row's values\) \(SQLSTATE 22P02\)$"):
        enricher("SELECT id FROM orders WHERE id = ANY($1)").lookup(ORDERS, [("ten-canary",)])  # its text quotes the key
    assert time.monotonic() - started < 2
    assert not [r for r in caplog.records if r.name == "walflow.enrichment"]  # nothing retried


def test_statement_timeout(shop: Database, enricher: MakeEnricher) -> None:
    enrich = enricher("SELECT id, pg_sleep(5) FROM unnest($1::int[]) AS id", timeout_ms=200)
    started = time.monotonic()
    with pytest.raises(EnrichmentError, match=r"statement timeout .*timeout_ms is 200"):
        enrich.lookup(ORDERS, [("10",)])
    assert time.monotonic() - started < 3


def test_the_query_cannot_write(shop: Database, enricher: MakeEnricher) -> None:
    enrich = enricher("WITH changed AS (UPDATE orders SET status = 'hacked' WHERE id = ANY($1) RETURNING id) "
                      "SELECT id FROM changed")
    with pytest.raises(EnrichmentError, match=r"read-only transaction"):
        enrich.lookup(ORDERS, [("10",)])
    with shop.connect() as conn:
        assert conn.execute("SELECT status FROM orders WHERE id = 10").fetchone() == ("paid",)


def test_a_table_without_a_key_is_refused(shop: Database, enricher: MakeEnricher) -> None:
    keyless = table("events", ("id", "body"), ())
    with pytest.raises(EnrichmentError, match=r"public\.events has no primary key"):
        enricher("SELECT id FROM orders WHERE id = ANY($1)").lookup(keyless, [()])


def test_values_load_as_record_values(database: Database, enricher: MakeEnricher) -> None:
    """As the source loads them: an interval as Sequin's fields, bytea as its text, a date
    Python cannot hold as its text, a domain as its base type."""
    with database.connect() as conn:
        conn.execute("CREATE DOMAIN positive AS int CHECK (VALUE > 0)")
        conn.execute("CREATE TABLE things (id positive PRIMARY KEY)")
        conn.execute("INSERT INTO things VALUES (3)")
    things = table("things", ("id",), ("id",))
    enrich = enricher("SELECT id, interval '1 mon 2 days' AS span, '\\x0102'::bytea AS raw, "
                      "'infinity'::date AS forever FROM things WHERE id = ANY($1)")
    assert enrich.lookup(things, [("3",)]) == {("3",): {
        "id": 3, "span": {"months": 1, "days": 2, "microseconds": 0}, "raw": "\\x0102", "forever": "infinity"}}


def test_postgres_down_blocks_the_lookup_until_it_is_back(pg: Postgres, shop: Database, enricher: MakeEnricher,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    enrich = enricher("SELECT id, status FROM orders WHERE id = ANY($1)")
    assert enrich.lookup(ORDERS, [("10",)]) == {("10",): {"id": 10, "status": "paid"}}
    pg.stop()  # ends the enricher's connection too
    results: list[dict[tuple[str, ...], dict[str, Any] | None]] = []
    waiting = threading.Thread(target=lambda: results.append(enrich.lookup(ORDERS, [("11",)])), daemon=True)
    caplog.set_level(logging.INFO, logger="walflow.enrichment")
    waiting.start()
    time.sleep(1.0)  # several attempts while the server is down
    assert waiting.is_alive() and not results
    pg.start()
    waiting.join(30)
    assert results == [{("11",): {"id": 11, "status": "new"}}]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "walflow.enrichment"]
    assert [level for level, _ in logged] == [logging.WARNING, logging.INFO], logged
    assert "sink 'orders'" in logged[0][1] and "unreachable" in logged[0][1]


def test_a_restart_between_lookups_is_transient(pg: Postgres, shop: Database, enricher: MakeEnricher,
                                                caplog: pytest.LogCaptureFixture) -> None:
    enrich = enricher("SELECT id, status FROM orders WHERE id = ANY($1)")
    assert enrich.lookup(ORDERS, [("10",)]) == {("10",): {"id": 10, "status": "paid"}}
    pg.restart()
    assert enrich.lookup(ORDERS, [("12",)]) == {("12",): {"id": 12, "status": "new"}}
    # the old connection failed first: the lookup ran again on a new one
    assert [r.levelno for r in caplog.records if r.name == "walflow.enrichment" and r.levelno >= logging.WARNING] == [
        logging.WARNING]


def test_a_value_its_loader_cannot_convert_is_its_text_with_one_warning(
    shop: Database, enricher: MakeEnricher, caplog: pytest.LogCaptureFixture
) -> None:
    enrich = enricher("SELECT id, 'infinity'::date AS until FROM orders WHERE id = ANY($1)")
    with caplog.at_level(logging.WARNING, "walflow.transforms.convert"):
        assert enrich.lookup(ORDERS, [("10",)])[("10",)] == {"id": 10, "until": "infinity"}
        enrich.lookup(ORDERS, [("10",)])
    assert [r.getMessage() for r in caplog.records] == [
        "sink 'orders': the enrichment query's column until: a value could not be converted (DataError): published as "
        "its Postgres text"]
