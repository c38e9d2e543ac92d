"""The benchmark's workloads, written into their own database each.

- **mixed** (Sequin's method): table ``benchmark_records``, 60 % inserts, 30 % updates and
  10 % deletes, each its own transaction, from several concurrent clients. For catch-up
  runs the rows come from a server-side procedure that commits after every row: Python
  clients round-tripping each statement would measure psycopg, not the WAL consumers.
  ``pad`` sets the length of ``string_field``: 32 characters make the ~100 B rows, 1,500
  the ~1.6 KB ones.
- **bulk**: one transaction inserting N rows, then one updating and one deleting a tenth
  of them each: a few large transactions, the first of them N rows long.
- **rows** (for backfills): N rows of the mixed workload's shape in one transaction, then
  vacuumed, *before* the slot exists: a backfill reads the table, and its consumer must
  not find the same rows in the WAL as well.

Every statement changes exactly one row (mixed) or a known count (bulk, from the row
count), so the number of changes a consumer must deliver is known without reading the WAL.
A client only touches its own ids (``id % clients == client``); within them, updates and
deletes pick rows it inserted and has not deleted, so none of them misses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from connectors.postgres.protocol import str_to_lsn

PUBLICATION = "bench_pub"

SCHEMA = """
CREATE TABLE benchmark_records (
    id int PRIMARY KEY,
    string_field text,
    numeric_field numeric,
    timestamp_field timestamptz,
    json_field jsonb,
    inserted_at timestamp DEFAULT now(),
    updated_at timestamp DEFAULT now()
)
"""

#: One client's share of the mixed workload: ``n`` single-row transactions, op ``i`` an
#: insert when ``i % 10 < 6``, an update when ``< 9``, else a delete of its oldest live row.
#: Its live rows are always the ids ``lo..hi-1`` (times ``clients``, plus ``client``).
MIXED_PROCEDURE = """
CREATE PROCEDURE bench_mixed(client int, clients int, n int, pad int) LANGUAGE plpgsql AS $$
DECLARE
    lo int := 0;
    hi int := 0;
    k int;
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        IF i % 10 < 6 OR hi = lo THEN
            INSERT INTO benchmark_records (id, string_field, numeric_field, timestamp_field, json_field)
            VALUES (hi * clients + client, rpad(md5(random()::text), pad, md5(i::text)), round((random() * 1e6)::numeric, 2),
                    now(), jsonb_build_object('client', client, 'seq', i, 'tag', 'bench'));
            hi := hi + 1;
        ELSIF i % 10 < 9 THEN
            k := lo + floor(random() * (hi - lo))::int;
            UPDATE benchmark_records
               SET string_field = rpad(md5(random()::text), pad, md5(i::text)),
                   numeric_field = numeric_field + 1, updated_at = now()
             WHERE id = k * clients + client;
        ELSE
            DELETE FROM benchmark_records WHERE id = lo * clients + client;
            lo := lo + 1;
        END IF;
        COMMIT;
    END LOOP;
END $$
"""


@dataclass(frozen=True)
class Written:
    """What a workload left in the WAL for the consumers to read."""

    database: str
    changes: int
    transactions: int
    start_lsn: int
    end_lsn: int
    seconds: float
    avg_row_bytes: float

    @property
    def wal_bytes(self) -> int:
        return self.end_lsn - self.start_lsn


def current_lsn(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The WAL insert position: every transaction committed so far ends at or before it."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str_to_lsn(str(row[0]))


def prepare_database(
    admin_dsn: str, database: str, database_dsn: str, slots: list[str], publication: str = PUBLICATION
) -> None:
    """A fresh database with the table, a publication for it, and one pgoutput slot per
    consumer, all made before any row is written: every consumer then reads the same WAL."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(MIXED_PROCEDURE)
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE benchmark_records").format(sql.Identifier(publication)))
    create_slots(database_dsn, slots)


def create_slots(database_dsn: str, slots: list[str]) -> None:
    """One pgoutput slot per name: each streams what is committed from now on."""
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])


def drop_database(admin_dsn: str, database: str) -> None:
    """Drop the database and its slots, so the server stops keeping WAL for them."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", [database]):
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


def _avg_row_bytes(conn: psycopg.Connection[tuple[object, ...]]) -> float:
    row = conn.execute("SELECT coalesce(avg(pg_column_size(r.*)), 0)::float8 FROM benchmark_records r").fetchone()
    assert row is not None
    return float(str(row[0]))


def _timed(dsn: str, database: str, write: Callable[[], tuple[int, int]]) -> Written:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = current_lsn(conn)
        began = time.monotonic()
        changes, transactions = write()
        seconds = time.monotonic() - began
        end = current_lsn(conn)
        size = _avg_row_bytes(conn)
    return Written(database, changes, transactions, start, end, seconds, size)


def write_mixed(dsn: str, database: str, *, changes: int, clients: int, pad: int) -> Written:
    """``changes`` single-row transactions, split over ``clients`` concurrent sessions."""
    shares = [changes // clients + (1 if c < changes % clients else 0) for c in range(clients)]
    errors: list[BaseException] = []

    def client(c: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CALL bench_mixed(%s, %s, %s, %s)", [c, clients, shares[c], pad])
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    def write() -> tuple[int, int]:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return changes, changes

    return _timed(dsn, database, write)


def _insert(conn: psycopg.Connection[tuple[object, ...]], select: str, params: list[object]) -> int:
    """The rows of ``select`` (id, then the four columns the workloads write; the two
    timestamps keep their defaults) inserted in one statement; how many."""
    return conn.execute(
        "INSERT INTO benchmark_records (id, string_field, numeric_field, timestamp_field, json_field) " + select,
        params,
    ).rowcount


def write_bulk(dsn: str, database: str, *, rows: int) -> Written:
    """``rows`` inserted in one transaction, then a tenth updated and a tenth deleted in one each."""

    def write() -> tuple[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            inserted = _insert(
                conn,
                "SELECT g, md5(g::text), g * 1.5, now(), jsonb_build_object('seq', g, 'tag', 'bench') "
                "FROM generate_series(1, %s) g",
                [rows],
            )
            updated = conn.execute(
                "UPDATE benchmark_records SET numeric_field = numeric_field + 1, updated_at = now() WHERE id % 10 = 0"
            ).rowcount
            deleted = conn.execute("DELETE FROM benchmark_records WHERE id % 10 = 1").rowcount
        return inserted + updated + deleted, 3

    return _timed(dsn, database, write)


def write_rows(dsn: str, database: str, *, rows: int, clients: int, pad: int) -> Written:
    """``rows`` rows as the mixed workload inserts them (the same columns and values, in one
    statement: a table to backfill, not a WAL to read), then ``VACUUM (FREEZE, ANALYZE)``:
    whoever reads the table first would otherwise set every row's hint bits and pay for
    it, and the planner and the backfill's progress want its row count."""

    def write() -> tuple[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            select = ("SELECT g, rpad(md5(random()::text), %s, md5(g::text)), round((random() * 1e6)::numeric, 2), "
                      "now(), jsonb_build_object('client', g %% %s, 'seq', g / %s, 'tag', 'bench') "
                      "FROM generate_series(0, %s - 1) g")
            return _insert(conn, select, [pad, clients, clients, rows]), 1

    written = _timed(dsn, database, write)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (FREEZE, ANALYZE) benchmark_records")
    return written
