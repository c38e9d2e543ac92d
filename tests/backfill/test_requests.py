"""Backfills end to end: how they are asked for (``initial_backfill``, ``walflow backfill``)
and what they put into the stream, against the suite's real PostgreSQL and NATS.

``shared/CONTRACT.md``, "Backfills" and "The walflow command".
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.postgres import signals
from connectors.postgres.signals import BackfillRequest
from embedded import wait_for
from embedded._process import ServerProcess
from tests.backfill.helpers import (
    decode_id,
    log_lines,
    log_text,
    set_publication_sql,
    sink,
    subject_counts,
    walflow,
    walflow_together,
)
from tests.harness import Database, Nats, TestNames, slot_active, slot_confirmed
from tests.pipeline import Stored, assert_running, fatal_line, pipeline, run_to_exit, stored, write_config

#: Chunks of a few rows: many chunks, each a watermark window of its own.
TINY = {"initial_chunk_rows": 7, "max_chunk_rows": 7}
#: Chunks small enough that ten thousand rows take a few seconds: a backfill still running.
SLOW = {"initial_chunk_rows": 50, "max_chunk_rows": 50}


def _started(database: Database, proc: ServerProcess) -> None:
    wait_for(lambda: slot_active(database), timeout=30, what="the pipeline to open its slot",
             check=lambda: assert_running(proc))


def _settled(database: Database, proc: ServerProcess, timeout: float = 20) -> None:
    """Wait until the slot is confirmed past everything committed so far: every change and
    read emitted before now is acknowledged by JetStream (the slot moves only past those)."""
    end = database.current_lsn()
    wait_for(lambda: slot_confirmed(database) >= end, timeout=timeout, what="the slot to pass everything committed",
             check=lambda: assert_running(proc))


def _done(proc: ServerProcess, backfill: str | None = None, *, timeout: float = 20) -> list[str]:
    """Wait for the "done" line of ``backfill`` (of any backfill if None); those lines."""
    fragments = ("walflow.backfill", ": done, ") + (() if backfill is None else (f"backfill {backfill} ",))
    wait_for(lambda: bool(log_lines(proc, *fragments)), timeout=timeout, what=f"backfill {backfill or ''} to finish",
             check=lambda: assert_running(proc))
    return log_lines(proc, *fragments)


def _reads(events: list[Stored], table: str = "t") -> list[Stored]:
    return [e for e in events if e.event["action"] == "read" and e.event["metadata"]["table_name"] == table]


def _count(nats_srv: Nats, names: TestNames, table: str, action: str) -> int:
    return subject_counts(nats_srv.url, names.stream).get(f"{names.subject_prefix}.shop.public.{table}.{action}", 0)


def _until(condition: Callable[[], bool], proc: ServerProcess, what: str, timeout: float = 20) -> None:
    wait_for(condition, timeout=timeout, what=what, check=lambda: assert_running(proc))


def _rows(database: Database, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with database.connect() as conn:
        return conn.execute(query, list(params)).fetchall()


# -- 1. partial -----------------------------------------------------------------------------


@pytest.mark.slow
def test_partial_backfill_reads_exactly_the_rows_from_the_start_position_on(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text, updated_at timestamptz)")
        # id % 10 = 0: no sort value; id % 3 = 0: exactly the start position (many equal
        # values, so chunk boundaries fall inside a run of them); else a minute apart around it
        conn.execute("""
            INSERT INTO t SELECT g, 'row ' || g,
                CASE WHEN g % 10 = 0 THEN NULL
                     WHEN g % 3 = 0 THEN timestamptz '2025-01-01 00:00:00+00'
                     ELSE timestamptz '2024-12-31 22:00:00+00' + g * interval '1 minute' END
            FROM generate_series(1, 300) g""")
        conn.execute("""INSERT INTO t VALUES (1001, 'a microsecond early', '2024-12-31 23:59:59.999999+00'),
                                             (1002, 'the start, written in +02', '2025-01-01 02:00:00+02'),
                                             (1003, 'an hour early, written in +02', '2025-01-01 01:00:00+02')""")
    start = "2025-01-01T00:00:00Z"
    backfill = [{"table": "public.t", "type": "partial", "sort_column": "updated_at", "start_position": start}]
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=backfill)], backfill=TINY)
    expected = {
        row[0]: {"id": row[0], "name": row[1], "updated_at": row[2]}
        for row in _rows(database, "SELECT id, name, updated_at FROM t WHERE updated_at >= %s::timestamptz", start)
    }
    nulls = {row[0] for row in _rows(database, "SELECT id FROM t WHERE updated_at IS NULL")}
    assert len(expected) > 20 and 1002 in expected and 1001 not in expected and len(nulls) == 30
    with pipeline(config, "-s", "1") as proc:
        done = _done(proc)
        _settled(database, proc)
    assert done[0].endswith(f"done, {len(expected)} row(s)\"")
    events = stored(nats_srv.url, names.stream)
    reads = _reads(events)
    assert len(reads) == len(events) == len(expected)
    got = {e.event["record"]["id"]: {**e.event["record"], "updated_at": datetime.fromisoformat(e.event["record"]["updated_at"])}
           for e in reads}
    assert got == expected
    assert not nulls & set(got)  # a NULL sort value is not at or after any position: such rows are not read
    for e in reads:
        assert e.subject == f"{names.subject_prefix}.shop.public.t.read"
        assert e.event["changes"] is None
        assert e.event["metadata"]["table_schema"] == "public"


# -- 2. composite key -----------------------------------------------------------------------


@pytest.mark.slow
def test_composite_key_table_in_many_chunks_reads_every_row_once(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (tenant int, id int, label text, PRIMARY KEY (tenant, id))")
        # inserted out of key order; ids repeat across tenants and tenant 10 sorts after 9 as a number
        conn.execute("""INSERT INTO t SELECT tenant, id, tenant || '/' || id
                        FROM generate_series(1, 12) tenant, generate_series(1, 40) id
                        WHERE (tenant * 7 + id) % 5 <> 0 ORDER BY md5(tenant || '/' || id)""")
    table = {(tenant, id_) for tenant, id_ in _rows(database, "SELECT tenant, id FROM t")}
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=True)], backfill=TINY)
    with pipeline(config, "-s", "1") as proc:
        _done(proc)
        _settled(database, proc)
    reads = _reads(stored(nats_srv.url, names.stream))
    got = [(e.event["record"]["tenant"], e.event["record"]["id"]) for e in reads]
    assert len(table) > 7 * 40
    assert len(got) == len(table) and set(got) == table
    assert all(e.event["record"]["label"] == f"{t}/{i}" for e, (t, i) in zip(reads, got, strict=True))
    assert len({e.msg_id for e in reads}) == len(reads)


# -- 3. on demand ---------------------------------------------------------------------------


@pytest.mark.slow
def test_walflow_backfill_on_a_running_pipeline(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO t SELECT g, 'item ' || g FROM generate_series(1, 500) g")
    other = f"{names.subject_prefix}other"
    stream = {"name": names.stream, "subjects": [f"{names.subject_prefix}.>", f"{other}.>"]}
    sinks = [{**sink(names, "on-demand"), "destination": {"subject_prefix": names.subject_prefix, "stream": stream}},
             {**sink(names, "bystander"), "destination": {"subject_prefix": other, "stream": stream}}]
    config = write_config(tmp_path, database, nats_srv, names, sinks, backfill={"initial_chunk_rows": 64})
    with pipeline(config, "-s", "1") as proc:
        _started(database, proc)
        with database.connect() as conn:
            conn.execute("INSERT INTO t VALUES (501, 'live')")
        _until(lambda: _count(nats_srv, names, "t", "insert") == 1, proc, "the live insert")
        _until(lambda: subject_counts(nats_srv.url, names.stream).get(f"{other}.shop.public.t.insert") == 1, proc,
               "the live insert of the other sink")
        done = walflow("backfill", config, "--sink", "on-demand", "--table", "public.t")
        assert (done.returncode, done.stderr) == (0, "")
        backfill = done.stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{16}", backfill), done.stdout
        _until(lambda: _count(nats_srv, names, "t", "read") >= 501, proc, "the reads")
        _done(proc, backfill)
        _settled(database, proc)
        assert proc.running
    assert len(log_lines(proc, "streaming slot")) == 1  # no restart
    events = stored(nats_srv.url, names.stream)
    assert [e.subject for e in events if e.subject.startswith(f"{other}.")] == [f"{other}.shop.public.t.insert"]
    reads = _reads(events)
    assert sorted(e.event["record"]["id"] for e in reads) == list(range(1, 502))
    for e in reads:
        assert e.subject == f"{names.subject_prefix}.shop.public.t.read"
        key = json.dumps([str(e.event["record"]["id"])], separators=(",", ":"))
        assert decode_id(e.msg_id) == f"shop/on-demand/read/{backfill}/{key}"
        assert e.msg_id == e.event["metadata"]["idempotency_key"]


@pytest.mark.slow
def test_walflow_backfill_before_the_pipeline_starts_is_run_by_the_next_one(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO t SELECT g, 'item ' || g FROM generate_series(1, 300) g")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names)])
    # CONFIG from $WALFLOW_CONFIG, the command as a module: the slot does not exist yet
    done = walflow("backfill", "--sink", "shop-sink", "--table", "public.t", env={"WALFLOW_CONFIG": str(config)},
                   module=True)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    backfill = done.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{16}", backfill), done.stdout
    assert _requests_in_slot(database) == 1
    with database.connect() as conn:
        conn.execute("UPDATE t SET name = 'changed before the start' WHERE id = 7")
    with pipeline(config, "-s", "1") as proc:
        _done(proc, backfill)
        _settled(database, proc)
    events = stored(nats_srv.url, names.stream)
    assert [(e.event["action"], e.event["record"]["id"]) for e in events if e.event["action"] != "read"] == [
        ("update", 7)]
    reads = {e.event["record"]["id"]: e.event["record"]["name"] for e in _reads(events)}
    assert len(_reads(events)) == 300 and reads == {i: f"item {i}" if i != 7 else "changed before the start"
                                                     for i in range(1, 301)}


# -- 4. the same table asked for twice ------------------------------------------------------


@pytest.mark.slow
def test_a_second_request_while_the_first_runs_is_a_backfill_of_its_own(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    rows = 20000
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        conn.execute(f"INSERT INTO t SELECT g, 'item ' || g FROM generate_series(1, {rows}) g")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, "twice")], backfill=SLOW)
    with pipeline(config, "-s", "1") as proc:
        _started(database, proc)
        # two users at once: each request is what was asked for (it may be another range, or
        # follow one that is about to end), so both run, and each reads every row once
        argv: list[str | Path] = ["backfill", config, "--sink", "twice", "--table", "public.t"]
        both = walflow_together(argv, argv)
        assert [(d.returncode, d.stderr) for d in both] == [(0, "")] * 2
        ids = {d.stdout.strip() for d in both}
        assert len(ids) == 2
        for backfill in ids:
            _done(proc, backfill)
        _settled(database, proc)
    reads = _reads(stored(nats_srv.url, names.stream))
    for backfill in ids:
        mine = [e for e in reads if decode_id(e.msg_id).split("/")[3] == backfill]
        assert sorted(e.event["record"]["id"] for e in mine) == list(range(1, rows + 1))
    assert len(reads) == 2 * rows


# -- 5. a table dropped during its backfill -------------------------------------------------


@pytest.mark.slow
def test_a_table_dropped_mid_backfill_stops_only_its_backfill(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE doomed (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO doomed SELECT g, 'item ' || g FROM generate_series(1, 50000) g")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO other SELECT g, 'item ' || g FROM generate_series(1, 3000) g")
        conn.execute("CREATE TABLE live (id int PRIMARY KEY, name text)")
    backfill = [{"table": "public.doomed"}, {"table": "public.other"}]
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=backfill)],
                          backfill={**SLOW, "max_concurrent": 2})
    with pipeline(config, "-s", "1") as proc:
        _until(lambda: _count(nats_srv, names, "doomed", "read") >= 500, proc, "reads of public.doomed")
        with database.connect() as conn:
            conn.execute("DROP TABLE doomed")
        error = ("level=error", "of public.doomed for sink shop-sink stopped: table public.doomed")
        _until(lambda: bool(log_lines(proc, *error)), proc, "the error naming the dropped table")
        with database.connect() as conn:
            conn.execute("INSERT INTO live VALUES (1, 'after the drop')")
        _until(lambda: _count(nats_srv, names, "live", "insert") == 1, proc, "the live insert after the drop")
        done = _done(proc)
        _settled(database, proc)
        assert proc.running
    line = log_lines(proc, *error)[0]
    assert line.endswith("stopped: table public.doomed was dropped\"") or "does not exist" in line, line
    assert len(done) == 1 and "of public.other " in done[0] and done[0].endswith("done, 3,000 row(s)\"")
    events = stored(nats_srv.url, names.stream)
    assert sorted(e.event["record"]["id"] for e in _reads(events, "other")) == list(range(1, 3001))
    assert len(_reads(events, "doomed")) < 50000
    assert [e.event["record"] for e in events if e.event["metadata"]["table_name"] == "live"] == [
        {"id": 1, "name": "after the drop"}]


# -- 6. a table without a primary key -------------------------------------------------------


def test_walflow_backfill_refuses_a_table_without_a_primary_key(
    database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE nopk (id int, name text)")
        conn.execute("INSERT INTO nopk VALUES (1, 'one')")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names)])
    done = walflow("backfill", config, "--sink", "shop-sink", "--table", "public.nopk")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("walflow: ") and "public.nopk" in done.stderr
    assert "primary key" in done.stderr


@pytest.mark.slow
def test_initial_backfill_of_all_tables_skips_those_without_a_primary_key_with_a_warning(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE nopk (id int, name text)")
        conn.execute("CREATE TABLE fullid (id int, name text)")  # REPLICA IDENTITY FULL is not a key
        conn.execute("ALTER TABLE fullid REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE byindex (code text NOT NULL, name text)")  # a replica identity index is one
        conn.execute("CREATE UNIQUE INDEX byindex_code ON byindex (code)")
        conn.execute("ALTER TABLE byindex REPLICA IDENTITY USING INDEX byindex_code")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        for table in ("nopk", "fullid", "t"):
            conn.execute(f"INSERT INTO {table} SELECT g, 'item ' || g FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO byindex SELECT 'c' || g, 'item ' || g FROM generate_series(1, 50) g")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=True)])

    def refusal(table: str) -> tuple[str, ...]:
        return "level=warning", f"sink shop-sink: initial backfill skips public.{table}: table public.{table} has no primary key"

    with pipeline(config, "-s", "1") as proc:
        _until(lambda: bool(log_lines(proc, *refusal("nopk")) and log_lines(proc, *refusal("fullid"))), proc,
               "the refusals")
        _until(lambda: len(log_lines(proc, "walflow.backfill", "done,")) == 2, proc, "the other backfills")
        with database.connect() as conn:
            conn.execute("INSERT INTO nopk VALUES (51, 'live')")
        _until(lambda: _count(nats_srv, names, "nopk", "insert") == 1, proc, "the live insert")
        _settled(database, proc)
    assert "Add a primary key" in log_lines(proc, *refusal("nopk"))[0]
    events = stored(nats_srv.url, names.stream)
    assert _reads(events, "nopk") == [] and _reads(events, "fullid") == []
    assert sorted(e.event["record"]["id"] for e in _reads(events, "t")) == list(range(1, 51))
    assert sorted(e.event["record"]["code"] for e in _reads(events, "byindex")) == sorted(f"c{g}" for g in range(1, 51))


# -- a backfill that cannot work --------------------------------------------------------------


def test_walflow_backfill_refuses_a_start_position_the_column_cannot_hold(
    database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, updated_at timestamptz)")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names)])
    done = walflow("backfill", config, "--sink", "shop-sink", "--table", "public.t", "--sort-column", "updated_at",
                   "--start-position", "last tuesday")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("walflow: ") and "last tuesday" in done.stderr and "updated_at" in done.stderr
    assert _requests_in_slot(database) == 0


@pytest.mark.slow
def test_a_backfill_that_cannot_work_ends_and_does_not_block_a_corrected_one(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, updated_at timestamptz)")
        conn.execute("INSERT INTO t SELECT g, timestamptz '2025-06-01 00:00+00' FROM generate_series(1, 20) g")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names)])
    with pipeline(config, "-s", "1") as proc:
        _started(database, proc)
        # the request as it lands in the slot, whoever wrote it (walflow backfill writes it so today)
        bad = BackfillRequest.new("shop-sink", "public.t", "updated_at", "last tuesday")
        with database.connect() as conn:
            signals.emit(conn, signals.Signal("request", names.slot, bad))
        _until(lambda: bool(log_lines(proc, f"backfill {bad.id} ", "last tuesday")), proc, "the failure")
        done = walflow("backfill", config, "--sink", "shop-sink", "--table", "public.t", "--sort-column", "updated_at",
                       "--start-position", "2025-01-01")
        assert done.returncode == 0, done.stderr
        good = done.stdout.strip()
        _until(lambda: bool(log_lines(proc, f"backfill {good} ", "done,")), proc, "the corrected backfill")
        _settled(database, proc)
    assert log_lines(proc, "level=error", f"backfill {bad.id} ", "stopped:", "last tuesday")
    assert sorted(e.event["record"]["id"] for e in _reads(stored(nats_srv.url, names.stream))) == list(
        range(1, 21))


# -- 7. walflow backfill's refusals ---------------------------------------------------------


def _requests_in_slot(database: Database) -> int:
    """How many backfill signals the test's slot holds (0 if there is no slot)."""
    if not _rows(database, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", database.names.slot):
        return 0
    found = _rows(database, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                  "'proto_version', '1', 'publication_names', %s, 'messages', 'true') "
                  "WHERE position('walflow.backfill' in encode(data, 'escape')) > 0",
                  database.names.slot, database.names.publication)
    return int(found[0][0])


def _tables_ab(database: Database) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, updated_at timestamptz)")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sink", "nope", "--table", "public.a"], "walflow: no sink named 'nope' (sinks: all-tables, only-a, off)"),
        (["--sink", "off", "--table", "public.a"], "walflow: sink 'off' is disabled"),
        (["--sink", "only-a", "--table", "public.b"], "walflow: sink 'only-a' does not read public.b"),
        (["--sink", "all-tables", "--table", "public.b"], "walflow: table public.b is not in publication {pub}"),
        (["--sink", "all-tables", "--table", "public.a", "--sort-column", "updated_at"],
         "walflow: a partial backfill needs both --sort-column and --start-position"),
        (["--sink", "all-tables", "--table", "public.a", "--start-position", "2025-01-01"],
         "walflow: a partial backfill needs both --sort-column and --start-position"),
        (["--sink", "all-tables", "--table", "public.a", "--sort-column", "nope", "--start-position", "1"],
         "walflow: table public.a has no column nope"),
        (["--sink", "all-tables", "--table", "a"], "walflow: 'a' is not a qualified table name"),
    ],
    ids=["unknown-sink", "disabled-sink", "not-read-by-the-sink", "not-in-the-publication", "sort-column-alone",
         "start-position-alone", "unknown-sort-column", "unqualified"],
)
def test_walflow_backfill_refuses_with_one_line(
    database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path, args: list[str], message: str
) -> None:
    _tables_ab(database)
    sinks = [sink(names, "all-tables"), sink(names, "only-a", source={"include_tables": ["public.a"]}),
             sink(names, "off", status="disabled")]
    config = write_config(tmp_path, database, nats_srv, names, sinks)
    set_publication_sql(config, f"CREATE PUBLICATION {names.publication} FOR TABLE public.a")
    done = walflow("backfill", config, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(message.format(pub=names.publication)), done.stderr
    assert _requests_in_slot(database) == 0  # nothing was asked for


def test_walflow_backfill_says_in_one_line_that_the_database_is_unreachable(
    database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path
) -> None:
    config = write_config(tmp_path, database, nats_srv, names, [sink(names)])
    data = yaml.safe_load(config.read_text())
    data["databases"][0]["port"] = 1  # nothing listens there
    config.write_text(yaml.safe_dump(data))
    done = walflow("backfill", config, "--sink", "shop-sink", "--table", "public.t")
    assert done.returncode != 0 and done.stdout == ""
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("walflow: "), done.stderr


# -- initial_backfill lists that cannot work ------------------------------------------------


@pytest.mark.slow
def test_initial_backfill_of_a_table_not_in_the_publication_stops_with_one_line(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    _tables_ab(database)
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=[{"table": "public.b"}])])
    set_publication_sql(config, f"CREATE PUBLICATION {names.publication} FOR TABLE public.a")
    line = fatal_line(run_to_exit(config, timeout=30))
    assert line.startswith(f"walflow: table public.b is not in publication {names.publication}"), line


@pytest.mark.slow
def test_initial_backfill_of_a_table_the_sink_does_not_read_is_refused(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    _tables_ab(database)
    with database.connect() as conn:
        conn.execute("INSERT INTO b SELECT generate_series(1, 5)")
    only_a = sink(names, source={"include_tables": ["public.a"]}, initial_backfill=[{"table": "public.b"}])
    config = write_config(tmp_path, database, nats_srv, names, [only_a])
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: not proc.running or bool(log_lines(proc, "public.b", "done,"))
                 or bool(log_lines(proc, "public.b", "level=error")), timeout=20, what="the backfill to end")
        if proc.running:
            _settled(database, proc)
    assert _count(nats_srv, names, "b", "read") == 0
    refusal = [line for line in log_text(proc).splitlines()
               if "public.b" in line and ("level=error" in line or line.startswith("walflow: "))]
    assert refusal, log_text(proc)


# -- 8. initial_backfill once ---------------------------------------------------------------


def _hundred_rows(database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path) -> Path:
    """Table t with 100 rows and a sink that backfills it first: the config."""
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO t SELECT g, 'item ' || g FROM generate_series(1, 100) g")
    return write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=True)])


@pytest.mark.slow
def test_initial_backfill_is_not_repeated_on_the_next_start(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = _hundred_rows(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as first:
        _done(first)
        _settled(database, first)
    assert log_lines(first, "initial backfill of 1 table(s) requested: public.t")
    with database.connect() as conn:
        conn.execute("INSERT INTO t VALUES (101, 'after the restart')")
    with pipeline(config, "-s", "1", log_suffix="-2") as second:
        _until(lambda: _count(nats_srv, names, "t", "insert") == 1, second, "the insert")
        _settled(database, second)
    assert second.log_path != first.log_path and log_lines(second, "streaming slot")
    assert not log_lines(second, "initial backfill")
    assert not log_lines(second, "walflow.backfill")
    events = stored(nats_srv.url, names.stream)
    assert len(_reads(events)) == 100
    assert [(e.event["action"], e.event["record"]["id"]) for e in events[100:]] == [("insert", 101)]


@pytest.mark.slow
def test_a_restart_right_after_a_backfill_keeps_every_row_read_once(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = _hundred_rows(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as first:
        _done(first)  # and stopped at once: the slot may still be short of the backfill's end
    with database.connect() as conn:
        conn.execute("INSERT INTO t VALUES (101, 'after the restart')")
    with pipeline(config, "-s", "1", log_suffix="-2") as second:
        _until(lambda: _count(nats_srv, names, "t", "insert") == 1, second, "the insert")
        _settled(database, second)
        if log_lines(second, "walflow.backfill", "starting"):  # the replay passed its request or a watermark again
            _done(second)
            _settled(database, second)
    assert not log_lines(second, "initial backfill")
    events = stored(nats_srv.url, names.stream)
    reads = [e.event["record"]["id"] for e in _reads(events)]
    assert sorted(set(reads)) == list(range(1, 102 if 101 in reads else 101))
    assert len(reads) == len(set(reads))
    assert next(e.event["action"] for e in events if e.event["record"]["id"] == 101) == "insert"


# -- 9. reads never overwrite newer changes -------------------------------------------------


@pytest.mark.slow
def test_the_last_message_of_every_row_is_its_current_state(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    rows = 5000
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute(f"INSERT INTO t SELECT g, 0, 'original' FROM generate_series(1, {rows}) g")
    config = write_config(tmp_path, database, nats_srv, names, [sink(names, initial_backfill=True)],
                          backfill={"initial_chunk_rows": 20, "max_chunk_rows": 20})
    rng = random.Random(7)
    writes = 0
    with pipeline(config, "-s", "1") as proc:
        _until(lambda: _count(nats_srv, names, "t", "read") > 0, proc, "the first reads")
        with database.connect() as conn:
            # every transaction touches a few rows anywhere in the table: ahead of the chunk
            # being read, inside it, and behind it; some rows are deleted, some inserted
            while not log_lines(proc, "walflow.backfill", "done,"):
                assert_running(proc)
                for _ in range(20):
                    writes += 1
                    with conn.transaction():
                        for id_ in rng.sample(range(1, rows + 1), 3):
                            conn.execute("UPDATE t SET v = v + 1, note = %s WHERE id = %s", [f"write {writes}", id_])
                        if writes % 7 == 0:
                            conn.execute("DELETE FROM t WHERE id = %s", [rng.randrange(1, rows + 1)])
                        if writes % 11 == 0:
                            conn.execute("INSERT INTO t VALUES (%s, 0, 'inserted') ON CONFLICT DO NOTHING",
                                         [rows + writes])
                assert writes < 100_000, "the backfill did not finish"
        _settled(database, proc)
    assert writes >= 100  # the backfill ran during all of these (160–400 seen, with the machine's load)
    current = {id_: {"id": id_, "v": v, "note": note} for id_, v, note in _rows(database, "SELECT id, v, note FROM t")}
    events = stored(nats_srv.url, names.stream)
    last: dict[int, Stored] = {}
    for e in events:
        last[e.event["record"]["id"]] = e
    assert {i for i, e in last.items() if e.event["action"] != "delete"} == set(current)
    stale = {i: (e.event["action"], e.event["record"], current[i]) for i, e in last.items()
             if i in current and e.event["record"] != current[i]}
    assert stale == {}
    assert len(log_lines(proc, "walflow.backfill", "done,")) == 1
