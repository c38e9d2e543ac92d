"""``/metrics`` of the real pipeline: the counters after a known workload, the slot's gauges as it moves."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from embedded import wait_for
from embedded._process import free_port
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.harness import walsender as _walsender
from tests.pipeline import assert_running, by_labels, pipeline, scrape, write_config


def _slot_gauge(port: int, name: str, slot: str) -> float | None:
    return scrape(port).get(name, {}).get((("slot", slot),))


def _lag_is_small(port: int, slot: str) -> bool:
    """The slot follows closely: a few heartbeats' WAL behind at most."""
    lag = _slot_gauge(port, "walflow_slot_lag_bytes", slot)
    return lag is not None and lag < 64 * 1024


@pytest.fixture
def tables(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE t3 (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t2 SELECT g, 'before' FROM generate_series(1, 3) g")  # before the slot: not streamed
    return database


@pytest.mark.slow
def test_counters_read_exactly_the_workload_and_the_slot_gauges_follow_the_slot(
    tables: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    port = free_port()
    dest = {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}
    sinks = [
        {"name": "everything", "source": {"exclude_tables": ["public.t3"]}, "destination": dest},
        {"name": "t1-inserts", "actions": ["insert"], "source": {"include_tables": ["public.t1"]},
         "destination": dest},
    ]
    config = write_config(tmp_path, tables, nats_srv, names, sinks, health={"enabled": True, "port": port},
                          replication={"heartbeat_interval_ms": 500})
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(tables) and _slot_gauge(port, "walflow_confirmed_lsn", names.slot) is not None,
                 timeout=60, what="the pipeline to read its slot and sample it", check=lambda: assert_running(proc))
        before = _slot_gauge(port, "walflow_confirmed_lsn", names.slot)
        assert before is not None
        with tables.connect() as conn:
            for i in range(1, 8):
                conn.execute("INSERT INTO t1 VALUES (%s, 'x')", [i])
            conn.execute("UPDATE t2 SET v = 'after'")  # 3 rows, one transaction
            conn.execute("DELETE FROM t1 WHERE id > 5")  # 2 rows
            conn.execute("INSERT INTO t3 SELECT generate_series(1, 4)")  # no sink publishes t3
        end = tables.current_lsn()
        wait_for(lambda: _confirmed(tables) >= end, timeout=60, what="the slot to pass the workload",
                 check=lambda: assert_running(proc))
        # the server's confirmed position, sampled every heartbeat: past the workload, and the lag small again
        wait_for(lambda: (_slot_gauge(port, "walflow_confirmed_lsn", names.slot) or 0) >= end, timeout=30,
                 what="the sampled confirmed LSN to pass the workload", check=lambda: assert_running(proc))
        wait_for(lambda: _lag_is_small(port, names.slot),
                 timeout=30, what="the lag to be small after catch-up", check=lambda: assert_running(proc))
        metrics = scrape(port)
        # a restarted walsender is a reconnect, classified
        pid = _walsender(tables)
        assert pid is not None
        with tables.connect() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid[0]])
        wait_for(lambda: sum(scrape(port).get("walflow_reconnects_total", {}).values()) >= 1, timeout=30,
                 what="the reconnect to be counted", check=lambda: assert_running(proc))
        reconnects = by_labels(scrape(port)["walflow_reconnects_total"], "component", "cause")

    assert by_labels(metrics["walflow_changes_received_total"], "slot", "table", "action") == {
        (tables.names.slot, table, action): n
        for (table, action), n in {("public.t1", "insert"): 7, ("public.t2", "update"): 3, ("public.t1", "delete"): 2,
                                   ("public.t3", "insert"): 4}.items()
    }
    assert by_labels(metrics["walflow_changes_filtered_total"], "sink", "table", "action") == {
        ("everything", "public.t3", "insert"): 4,
        ("t1-inserts", "public.t2", "update"): 3,
        ("t1-inserts", "public.t1", "delete"): 2,
        ("t1-inserts", "public.t3", "insert"): 4,
    }
    assert by_labels(metrics["walflow_changes_published_total"], "sink", "table", "action") == {
        ("everything", "public.t1", "insert"): 7,
        ("everything", "public.t2", "update"): 3,
        ("everything", "public.t1", "delete"): 2,
        ("t1-inserts", "public.t1", "insert"): 7,
    }
    assert by_labels(metrics["walflow_commit_to_ack_seconds_count"], "sink") == {("everything",): 12, ("t1-inserts",): 7}
    assert all(0 < v < 60 for v in by_labels(metrics["walflow_commit_to_ack_seconds_sum"], "sink").values())

    slot = (("slot", names.slot),)
    confirmed = metrics["walflow_confirmed_lsn"][slot]
    assert before < end <= confirmed  # confirmed_lsn increased past the writes
    assert metrics["walflow_received_lsn"][slot] >= confirmed
    assert by_labels(metrics["walflow_slot_wal_status"], "status") == {
        ("reserved",): 1, ("extended",): 0, ("unreserved",): 0, ("lost",): 0}
    assert metrics["walflow_slot_safe_wal_size_bytes"][slot] > 0  # +Inf unless max_slot_wal_keep_size is set
    assert metrics["walflow_heartbeat_round_trip_seconds_count"][slot] >= 1

    assert by_labels(metrics["walflow_inflight_limit_bytes"], "bound") == {
        ("reader_buffer",): 32 * 1024 * 1024, ("epoch_budget",): 128 * 1024 * 1024}  # the defaults
    assert set(by_labels(metrics["walflow_backpressure_seconds_total"], "bound")) == {
        ("reader_buffer",), ("epoch_budget",), ("sink_window",)}
    assert by_labels(metrics["walflow_sink_window_messages"], "sink") == {("everything",): 0, ("t1-inserts",): 0}
    assert "walflow_process_resident_memory_bytes" in metrics
    assert "walflow_publish_retries_total" not in metrics and "walflow_publish_failures_total" not in metrics
    assert set(reconnects) == {("postgres", "server_error")}, reconnects  # 57P01, terminated by an administrator


@pytest.mark.slow
def test_a_backfill_counts_its_rows_and_chunks(
    tables: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """t2's three rows, in chunks of two: two chunks, the second one short and so the last."""
    port = free_port()
    sink = {"name": "t2-backfill", "initial_backfill": True, "source": {"include_tables": ["public.t2"]},
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, tables, nats_srv, names, [sink], health={"enabled": True, "port": port},
                          backfill={"initial_chunk_rows": 2, "max_chunk_rows": 2})

    def published_reads() -> float:
        try:
            series = scrape(port).get("walflow_changes_published_total", {})
        except OSError:  # not serving yet
            return 0.0
        return series.get((("action", "read"), ("sink", "t2-backfill"), ("table", "public.t2")), 0.0)

    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: published_reads() == 3, timeout=60, what="the reads to be acknowledged",
                 check=lambda: assert_running(proc))
        metrics = scrape(port)
    assert by_labels(metrics["walflow_backfill_rows_total"], "sink", "table") == {("t2-backfill", "public.t2"): 3}
    assert by_labels(metrics["walflow_backfill_chunks_total"], "sink", "table") == {("t2-backfill", "public.t2"): 2}
    assert "walflow_commit_to_ack_seconds_count" not in metrics  # reads have no commit to measure from


@pytest.mark.slow
def test_each_process_of_a_cluster_serves_its_own_figures(
    tables: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Two processes, one config: each its own port (through the config's ``${…}``), its own
    counts: the slot's process those of reading, the other those of publishing."""
    ports = [free_port(), free_port()]
    sink = {"name": "everything", "partition_count": 4,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, tables, nats_srv, names, [sink],
                          health={"enabled": True, "port": "${WALFLOW_HEALTH_PORT}"})
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        procs = [
            stack.enter_context(pipeline(config, "-s", "1", "-i", str(i), "-a", addresses, log_suffix=f".{i}",
                                         env={"WALFLOW_HEALTH_PORT": str(ports[i])}))
            for i in (0, 1)
        ]
        wait_for(lambda: _slot_active(tables), timeout=60, what="the cluster to read its slot",
                 check=lambda: assert_running(*procs))
        with tables.connect() as conn:
            for i in range(1, 41):
                conn.execute("INSERT INTO t1 VALUES (%s, 'x')", [i])
        end = tables.current_lsn()
        wait_for(lambda: _confirmed(tables) >= end, timeout=60, what="the slot to pass the workload",
                 check=lambda: assert_running(*procs))
        scraped = [scrape(port) for port in ports]
    received = [sum(m.get("walflow_changes_received_total", {}).values()) for m in scraped]
    published = [by_labels(m.get("walflow_changes_published_total", {}), "table", "action") for m in scraped]
    assert sorted(received) == [0, 40]  # the slot is read by one process only
    reader = received.index(40)
    # the slot's process leaves publishing to the other (dataflows/engine.py): it publishes nothing
    assert not published[reader] and published[1 - reader].get(("public.t1", "insert"), 0) == 40
    slot_gauges = [m.get("walflow_received_lsn", {}) for m in scraped]
    assert sorted(len(g) for g in slot_gauges) == [0, 1]  # the slot's figures come from its reader's process
