"""Faults from the seeds, injected for real: restarts, hung and foreign slot holders.

Each test measures how long recovery took and prints it (``-s`` shows the figures).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from embedded import PostgresServer, wait_for
from tests.harness import Database, Nats, Postgres, TestNames, hung_pg_recvlogical, walsender
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, pipeline, stored
from tests.workload import Inserter, setup_events


def _exactly_once(nats_url: str, stream: str, count: int) -> None:
    ids = sorted(e.event["record"]["id"] for e in stored(nats_url, stream))
    assert ids == list(range(1, count + 1))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restart_under_load(
    mode: str, pg: Postgres, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str,
    tmp_path: Path,
) -> None:
    if not isinstance(pg, PostgresServer):
        pytest.skip("needs the embedded PostgreSQL")
    config = setup_events(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        writer = Inserter(database.dsn, rate=300)
        writer.start()
        wait_for(lambda: writer.count > 300, timeout=30, what="load")
        pg.restart(mode)
        restarted = time.monotonic()
        wait_for(lambda: _slot_active(database), timeout=60, what="the pipeline to reconnect",
                 check=lambda: assert_running(proc))
        print(f"postgres {mode} restart: pipeline streaming again {time.monotonic() - restarted:.1f}s after")
        wait_for(lambda: writer.count > 900, timeout=60, what="more load")
        writer.stop.set()
        writer.join(10)
        end = database.current_lsn()
        wait_for(lambda: _confirmed(database) >= end, timeout=60, what="the slot to catch up",
                 check=lambda: assert_running(proc))
    _exactly_once(nats_srv.url, names.stream, writer.count)


@pytest.mark.slow
def test_a_hung_walflow_is_replaced_by_a_new_one(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    writer = Inserter(database.dsn, rate=200)
    with pipeline(config, "-s", "1", log_suffix=".a") as first:
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(first))
        writer.start()
        wait_for(lambda: writer.count > 200, timeout=30, what="load")
        held = walsender(database)
        assert held is not None
        assert first.pid is not None
        os.kill(first.pid, signal.SIGSTOP)  # hung: alive, socket open, silent
        stopped = time.monotonic()
        with pipeline(config, "-s", "1", log_suffix=".b") as second:
            wait_for(lambda: (w := walsender(database)) is not None and w[0] != held[0], timeout=60,
                     what="the second walflow to take the slot", check=lambda: assert_running(second))
            took = time.monotonic() - stopped
            print(f"hung walflow: replaced after {took:.1f}s")
            os.kill(first.pid, signal.SIGCONT)  # the first one wakes up: it must not take the slot back
            wait_for(lambda: "waiting for it to be released" in first.log_tail(200), timeout=60,
                     what="the first walflow to wait", check=lambda: assert_running(first))
            assert (w := walsender(database)) is not None and w[0] != held[0]
            writer.stop.set()
            writer.join(10)
            end = database.current_lsn()
            wait_for(lambda: _confirmed(database) >= end, timeout=60, what="the slot to catch up",
                     check=lambda: assert_running(second))
            assert (w := walsender(database)) is not None and w[0] != held[0]
    assert took < 20
    _exactly_once(nats_srv.url, names.stream, writer.count)


@pytest.mark.slow
def test_a_hung_foreign_holder_is_waited_for_then_the_slot_taken(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    with database.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
    with hung_pg_recvlogical(database, "5s"):
        stopped = time.monotonic()
        with pipeline(config, "-s", "1") as proc:
            wait_for(lambda: (w := walsender(database)) is not None and w[1].startswith("walflow"), timeout=60,
                     what="walflow to take the slot once Postgres frees it", check=lambda: assert_running(proc))
            took = time.monotonic() - stopped
            log = proc.log_tail(200)
            with database.connect() as conn:
                for i in range(1, 11):
                    conn.execute("INSERT INTO events VALUES (%s, 'x')", [i])
            end = database.current_lsn()
            wait_for(lambda: _confirmed(database) >= end, timeout=60, what="delivery", check=lambda: assert_running(proc))
    print(f"foreign holder: slot taken {took:.1f}s after the holder hung (its wal_sender_timeout: 5s)")
    assert "application_name 'pg_recvlogical'" in log and "waiting for it to be released" in log
    assert log.count("reconnecting in") <= 8  # backoff, not a storm
    _exactly_once(nats_srv.url, names.stream, 10)
