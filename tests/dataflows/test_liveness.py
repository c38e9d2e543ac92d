"""Liveness under the conditions that stalled Sequin: long catch-ups, long NATS outages, lost slots.

``WALFLOW_CATCHUP_MB`` (default 300) and ``WALFLOW_OUTAGE_SECONDS`` (default 15) stretch
them locally (1024 and 120 for the issue's figures).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import ReplicationSetupError
from embedded import PostgresServer, wait_for
from tests.harness import Database, Nats, TestNames, walsender
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, fatal_line, pipeline, run_to_exit, stored, write_config
from tests.replication import drain, partition
from tests.workload import OUTAGE, Inserter, setup_events

CATCHUP_MB = int(os.environ.get("WALFLOW_CATCHUP_MB", "300"))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_a_long_catch_up_is_not_mistaken_for_a_stall(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, payload text)")
        conn.execute("CREATE TABLE junk (id int, payload text)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE events")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
        start = database.current_lsn()
        rows = CATCHUP_MB * 1000  # ~1 kB of WAL each, most of it in one big transaction
        conn.execute("INSERT INTO junk SELECT g, repeat('j', 900) FROM generate_series(1, %s) g", [rows * 2 // 3])
        for _ in range(50):
            conn.execute("INSERT INTO junk SELECT g, repeat('j', 900) FROM generate_series(1, %s) g", [rows // 150])
        conn.execute("INSERT INTO events VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        end = database.current_lsn()
    sink = {"name": "c", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink],
                          replication={"wal_sender_timeout_ms": 2000, "status_interval_ms": 500})
    began = time.monotonic()
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _confirmed(database) >= end, timeout=600, what="the catch-up", check=lambda: assert_running(proc))
        took = time.monotonic() - began
        log = proc.log_tail(300)
    print(f"catch-up over {(end - start) / 1e6:.0f} MB of unpublished WAL: {took:.1f}s, no reconnect")
    assert "interrupted" not in log and "reconnecting" not in log
    assert sorted(e.event["record"]["id"] for e in stored(nats_srv.url, names.stream)) == [1, 2, 3]


@pytest.mark.slow
def test_nats_away_with_a_small_memory_bound(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    config.write_text(config.read_text().replace(
        "walflow:\n", "walflow:\n  max_memory_mb: 8\n  replication: {buffer_mb: 4, wal_sender_timeout_ms: 5000,"
        " status_interval_ms: 1000}\n"))
    with pipeline(config, "-s", "1") as proc:
        assert proc.pid is not None
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        writer = Inserter(database.dsn, rate=3000)
        writer.start()
        wait_for(lambda: writer.count > 3000, timeout=30, what="load")
        holder = walsender(database)
        baseline = _rss_mb(proc.pid)
        nats_srv.stop()
        peak = baseline
        deadline = time.monotonic() + OUTAGE
        while time.monotonic() < deadline:
            peak = max(peak, _rss_mb(proc.pid))
            assert_running(proc)
            time.sleep(0.25)  # sampling memory during the outage
        backlog = writer.count
        nats_srv.start()
        writer.stop.set()
        writer.join(10)
        assert walsender(database) == holder  # the walsender was kept alive all along
        end = database.current_lsn()
        wait_for(lambda: _confirmed(database) >= end, timeout=180, what="the backlog", check=lambda: assert_running(proc))
    print(f"NATS away {OUTAGE:.0f}s at 3000 rows/s ({backlog} rows): RSS {baseline:.0f} MB -> peak {peak:.0f} MB "
          "(bounds: max_memory_mb 8 + buffer_mb 4)")
    assert peak - baseline < 8 + 4 + 40  # the bounds plus a fixed overhead, whatever the outage's length
    assert sorted(e.event["record"]["id"] for e in stored(nats_srv.url, names.stream)) == list(
        range(1, writer.count + 1)
    )


@pytest.fixture(scope="module")
def small_wal_server() -> Iterator[PostgresServer]:
    settings = {"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"}
    with PostgresServer(settings=settings) as server:
        yield server


@pytest.mark.slow
def test_an_invalidated_slot_is_one_clear_error(
    small_wal_server: PostgresServer, nats_srv: Nats, names: TestNames, tmp_path: Path
) -> None:
    """Raised as itself by the source; the pipeline stops with that one line, exit status 2."""
    database = Database(small_wal_server, names)
    database.create()
    try:
        with database.connect() as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, payload text)")
            conn.execute(f"CREATE PUBLICATION {names.publication} FOR ALL TABLES")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
            for i in range(6):  # well past max_slot_wal_keep_size, then a checkpoint removes the WAL
                conn.execute("INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(%s::int, %s::int) g",
                             [i * 20000, i * 20000 + 19999])
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            row = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                               [names.slot]).fetchone()
        assert row == ("lost",)
        with partition(database.config(create=False)) as part, pytest.raises(ReplicationSetupError) as info:
            drain(part, lambda out: False, timeout=30)
        message = str(info.value)
        assert f"replication slot '{names.slot}' was invalidated by PostgreSQL (wal_status = lost)" in message
        assert f"SELECT pg_drop_replication_slot('{names.slot}')" in message and "backfill" in message
        sink = {"name": "events", "destination": {"subject_prefix": names.subject_prefix,
                                                  "stream": {"name": names.stream}}}
        line = fatal_line(run_to_exit(write_config(tmp_path, database, nats_srv, names, [sink], log_level="warning")))
        assert line == f"walflow: {message}"
    finally:
        database.drop()
