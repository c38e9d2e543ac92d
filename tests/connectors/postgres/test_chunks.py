"""Which columns a backfill pages by and matches changes by (:class:`connectors.postgres.chunks.TableReader`)."""

from __future__ import annotations

import pytest

from config.schema import BackfillSettings
from connectors.postgres.chunks import BackfillRefused, TableReader
from connectors.postgres.signals import BackfillRequest
from tests.harness import Database


@pytest.mark.parametrize(
    ("ddl", "key", "first_rows"),
    [
        # INCLUDE columns are not part of the key pgoutput sends
        ("CREATE TABLE t (id int, payload text, PRIMARY KEY (id) INCLUDE (payload))", ("id",), ["1", "2"]),
        # a replica identity index beside the primary key: changes carry the index's columns
        ("CREATE TABLE t (id int PRIMARY KEY, email text NOT NULL, payload text);"
         "CREATE UNIQUE INDEX t_email ON t (email); ALTER TABLE t REPLICA IDENTITY USING INDEX t_email",
         ("email",), ["1", "2"]),
        ("CREATE TABLE t (id int PRIMARY KEY, payload text); ALTER TABLE t REPLICA IDENTITY FULL", ("id",), ["1", "2"]),
    ],
    ids=["include", "identity-index", "full"],
)
def test_the_key_is_what_changes_carry_and_pages_follow_the_primary_key(
    database: Database, ddl: str, key: tuple[str, ...], first_rows: list[str]
) -> None:
    with database.connect() as conn:
        conn.execute(ddl)
        columns = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 't'::regclass AND attnum > 0 ORDER BY attnum").fetchall()]
        values = ", ".join("g" if c == "id" else f"'{c}' || (3 - g)" for c in columns)
        conn.execute(f"INSERT INTO t SELECT {values} FROM generate_series(1, 2) g")
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        reader = TableReader(conn, "p", BackfillRequest("b", "s", "public.t"), BackfillSettings())
        assert reader.key_columns == key and reader.table.key_columns == key
        chunk = reader.read(None)
    ids = [row[reader.table.positions["id"]] for row in chunk.rows]
    assert ids == [v.encode() for v in first_rows]


def test_a_table_with_replica_identity_nothing_is_refused(database: Database) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY); ALTER TABLE t REPLICA IDENTITY NOTHING")
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        with pytest.raises(BackfillRefused, match="REPLICA IDENTITY NOTHING"):
            TableReader(conn, "p", BackfillRequest("b", "s", "public.t"), BackfillSettings())


def test_a_chunk_waits_for_the_transactions_running_at_its_low_watermark(database: Database) -> None:
    import threading
    import time

    from connectors.postgres.chunks import wait_for_commits_in_flight

    never = threading.Event()  # the runner's stop event: never set here
    with database.connect() as conn, database.connect() as writer:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        assert wait_for_commits_in_flight(conn, 1.0, never.wait)  # nothing running
        writer.autocommit = False
        writer.execute("INSERT INTO t VALUES (1)")  # holds an xid until it commits
        started = time.monotonic()
        assert not wait_for_commits_in_flight(conn, 0.2, never.wait)
        assert time.monotonic() - started >= 0.2
        threading.Timer(0.1, writer.commit).start()
        assert wait_for_commits_in_flight(conn, 5.0, never.wait)


def test_a_row_over_max_change_is_read_with_its_largest_values_replaced(
        database: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A backfill's read follows the policy of changes (core/sizes.py): the row's largest values
    replaced until it fits, its key and sort column never; its chunk counted at what it keeps."""
    from config.schema import WalflowSettings
    from core.events import OversizedValue

    settings = WalflowSettings.model_validate({"max_change_mb": 0.01}).backfill  # 10485 bytes
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id text PRIMARY KEY, tag text, body text, note text)")
        conn.execute("INSERT INTO t VALUES (repeat('k', 2000), repeat('t', 2000), repeat('b', 9000), 'n'), "
                     "('small', 't', 'b', 'n'), ('exact', repeat('t', 10485 - 5 - 2), 'b', 'n'), "
                     "('q', repeat('u', 11000), repeat('c', 500), 'n')")
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        request = BackfillRequest("b", "s", "public.t", sort_column="tag", start_position="")
        reader = TableReader(conn, "p", request, settings)
        chunk = reader.read(None)
    rows = {row[0]: row for row in chunk.rows}
    assert rows[b"k" * 2000] == (b"k" * 2000, b"t" * 2000, OversizedValue.of(b"b" * 9000), b"n")  # 13001 bytes
    assert rows[b"small"] == (b"small", b"t", b"b", b"n")
    assert rows[b"exact"][1] == b"t" * 10478  # 10485 bytes: at the limit, whole
    assert rows[b"q"] == (b"q", b"u" * 11000, OversizedValue.of(b"c" * 500), b"n")  # the sort column kept
    assert chunk.end == ["u" * 11000, "q"]
    assert chunk.row_memory < 2 * 10485 + 512 + 4 * 120  # the marked row counted at what it keeps
    assert "public.t.body: a value of 9000 bytes in a read of backfill b" in caplog.text
