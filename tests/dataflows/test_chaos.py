"""Chaos: the pipeline is kill -9'ed again and again under a mixed write load.

Afterwards every committed change is in the stream exactly once (by idempotency key and
by content), each row's changes are in commit order, and the slot has caught up with the
server. The stream's duplicate window is one second, so JetStream's own deduplication
cannot hide a replay: walflow's must. Ground truth comes from a second slot on the same
publication, read after the fact.

Modes: one process without and with ``-r``, two worker threads (``-w 2``), and a
two-process cluster without and with ``-r`` (the split: the slot's process sends compact
items past the exchange, the other process converts and publishes its partitions' share).
``WALFLOW_CHAOS_KILLS`` (default 3 per mode, 15 in all) makes a longer run for local use.
"""

from __future__ import annotations

import base64
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from config.schema import ReplicationSettings
from core.ids import IdScheme
from embedded import wait_for
from embedded._process import ServerProcess, free_port
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import Stored, assert_running, pipeline, stored, write_config
from tests.replication import drain_snapshotting, partition

KILLS = int(os.environ.get("WALFLOW_CHAOS_KILLS", "3"))
TABLES = ("t1", "t2", "t3")


class Writer(threading.Thread):
    """Commits inserts, updates (v = v + 1, so order is visible) and deletes as fast as it can."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.big_done = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None
        self._rows: dict[str, list[int]] = {t: [] for t in TABLES}
        self._next = 1

    def run(self) -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    if self.commits == 300 and not self.big_done.is_set():
                        with conn.transaction():  # one large transaction, mid-run
                            conn.execute("INSERT INTO t2 SELECT g, 0 FROM generate_series(1000000, 1019999) g")
                        self.big_done.set()
                    elif rng.random() < 0.1:
                        with conn.transaction():
                            for _ in range(rng.randint(5, 30)):
                                self._one(conn, rng)
                    else:
                        self._one(conn, rng)
                    self.commits += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _one(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        table = rng.choice(TABLES)
        rows = self._rows[table]
        roll = rng.random()
        if roll < 0.5 or len(rows) < 10:
            conn.execute(f"INSERT INTO {table} (id, v) VALUES (%s, 0)", [self._next])
            rows.append(self._next)
            self._next += 1
        elif roll < 0.9:
            conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", [rng.choice(rows)])
        else:
            conn.execute(f"DELETE FROM {table} WHERE id = %s", [rows.pop(rng.randrange(len(rows)))])


@contextmanager
def _start(config: Path, mode: str, recovery: Path) -> Iterator[list[ServerProcess]]:
    """The pipeline in ``mode``: one process (with or without -r), two worker threads, or a
    two-process cluster (with or without -r), where the slot's process sends compact items
    and the other converts, envelopes and publishes its partitions' share."""
    args = ["-s", "1"]
    if mode.endswith("-r"):
        args += ["-r", str(recovery), "-b", "0"]
    if mode == "threads":
        args += ["-w", "2"]
    with ExitStack() as stack:
        if mode.startswith("cluster"):
            addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
            procs = [
                stack.enter_context(pipeline(config, *args, "-i", str(i), "-a", addresses, log_suffix=f".{i}"))
                for i in (0, 1)
            ]
        else:
            procs = [stack.enter_context(pipeline(config, *args))]
        yield procs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "single-r", "threads", "cluster", "cluster-r"])
def test_kill_9_under_load_loses_and_repeats_nothing(
    mode: str, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        for table in TABLES:
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute("ALTER TABLE t3 REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [f"{names.slot}_ref"])
    sink = {
        "name": "chaos",
        "destination": {
            "subject_prefix": names.subject_prefix,
            "stream": {"name": names.stream, "duplicate_window_ms": 1000},
        },
    }
    config = write_config(tmp_path, database, nats_srv, names, [sink])
    recovery = tmp_path / "recovery"
    rng = random.Random(mode)
    writer = Writer(database.dsn)
    writer.start()
    try:
        for _ in range(KILLS):
            with _start(config, mode, recovery) as procs:
                time.sleep(rng.uniform(1.5, 4.0))  # the chaos itself: a kill at a random moment
                assert_running(*procs)
                for p in procs:
                    p.kill()
        wait_for(writer.big_done.is_set, timeout=60, what="the large transaction")
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    end = database.current_lsn()
    with _start(config, mode, recovery) as procs:
        wait_for(lambda: _confirmed(database) >= end, timeout=180, what="the slot to catch up",
                 check=lambda: assert_running(*procs))

    expected = _reference(database, names, end)
    events = stored(nats_srv.url, names.stream)
    by_id: dict[str, list[Stored]] = defaultdict(list)
    for e in events:
        by_id[e.msg_id].append(e)
    duplicated = [i for i, copies in by_id.items() if len(copies) > 1]
    missing = [i for i in expected if i not in by_id]
    unexpected = [i for i in by_id if i not in expected]
    assert (len(missing), len(duplicated), len(unexpected)) == (0, 0, 0), (missing[:5], duplicated[:5])
    for msg_id, (action, table, row) in expected.items():
        e = by_id[msg_id][0]
        assert (e.event["action"], e.event["metadata"]["table_name"], e.event["record"]) == (action, table, row)
    rows: dict[tuple[str, object], list[tuple[int, int, int]]] = defaultdict(list)
    for e in events:
        meta = e.event["metadata"]
        rows[(meta["table_name"], e.event["record"]["id"])].append((e.seq, meta["commit_lsn"], meta["commit_idx"]))
    out_of_order = [k for k, seen in rows.items() if [p[1:] for p in sorted(seen)] != sorted(p[1:] for p in seen)]
    assert out_of_order == []
    print(f"chaos {mode}: {KILLS} kills, {writer.commits} transactions, {len(events)} events, "
          "0 lost, 0 duplicated, 0 out of order")


def _reference(db: Database, names: TestNames, end: int) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every committed change, read from the reference slot: msg id -> (action, table, record)."""
    cfg = db.config(create=False).model_copy(
        update={"slot": db.config().slot.model_copy(update={"name": f"{names.slot}_ref"})}
    )
    prefix = IdScheme("shop", "chaos").prefix
    out: dict[str, tuple[str, str, dict[str, Any]]] = {}
    with partition(cfg, ReplicationSettings(batch_size=5000)) as part:
        changes, _ = drain_snapshotting(part, lambda _, state: state["lsn"] >= end, timeout=180)
    for c in changes:
        msg_id = base64.b64encode(f"{prefix}{c.commit_lsn}:{c.commit_idx}".encode()).decode()
        record = c.old if c.action == "delete" else c.new
        assert record is not None
        out[msg_id] = (c.action, c.table, dict(record))
    return out
