"""Postgres crashes: the embedded server stopped with ``immediate`` (``pg_ctl stop -m immediate``:
every server process quits at once, recovery from the WAL on the next start) under a mixed
load, during a backfill racing writes, and while walflow streams a committed million-row
transaction or the server is still writing an uncommitted one.

The same walflow process reconnects by itself each time, and at the end the stream holds every
committed change exactly once (no message id twice, no change of a row twice) with each row's
changes in commit order, nothing of a transaction that never committed, and the slot, sampled
all along, was never confirmed past a change the stream did not hold yet. The stream's
duplicate window is one second, so JetStream's own deduplication cannot hide a replay. The
ground truth is a second slot on the publication, read after the fact, or the table itself.
Each test prints how long it took (``-s`` shows it), the big-transaction tests also walflow's
peak RSS.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest

from core.ids import IdScheme
from embedded import PostgresServer, wait_for
from embedded._process import ServerProcess
from tests.backfill.helpers import log_text, stored_count
from tests.crashes import (
    Msg,
    RowWriter,
    SlotSampler,
    check_changes,
    create_reference_slot,
    create_rows_table,
    highest_seq_by_commit,
    last_seq,
    messages,
    peak_rss,
    reference_changes,
    scan,
    slot_ahead,
)
from tests.harness import Database, Nats, Postgres, TestNames, slot_confirmed, walsender
from tests.pipeline import assert_running, pipeline, write_config

pytestmark = pytest.mark.slow

SINK = "crash"
BIG = 1_000_000
#: How far walflow's peak RSS may grow while a million-row transaction goes through it: the
#: reader's buffer (replication.buffer_mb, 32 MB) and the messages in flight, never the transaction.
BIG_PEAK_GROWTH = 150 * 1024 * 1024


def _embedded(pg: Postgres) -> PostgresServer:
    if not isinstance(pg, PostgresServer):
        pytest.skip("needs the embedded PostgreSQL")
    return pg


def _config(tmp_path: Path, db: Database, nats_srv: Nats, names: TestNames, **keys: Any) -> Path:
    sink = {"name": SINK, **keys, "destination": {"subject_prefix": names.subject_prefix,
                                                 "stream": {"name": names.stream, "duplicate_window_ms": 1000}}}
    return write_config(tmp_path, db, nats_srv, names, [sink],
                        backfill={"initial_chunk_rows": 1000, "max_chunk_rows": 5000})


def _streaming(db: Database) -> bool:
    """walflow's walsender holds the slot (after a crash every walsender is a new one)."""
    try:
        held = walsender(db)
    except psycopg.OperationalError:
        return False
    return held is not None and held[1].startswith("walflow")


def _crash(pg: PostgresServer, db: Database, proc: ServerProcess, *, reconnect: bool = True) -> float:
    """Stop Postgres with ``immediate`` and start it again; with ``reconnect``, wait for walflow
    to stream again and return how long that took after the server was back."""
    pg.restart("immediate")
    back = time.monotonic()
    if reconnect:
        wait_for(lambda: _streaming(db), timeout=60, what="walflow to stream again after the crash",
                 check=lambda: assert_running(proc))
    return time.monotonic() - back


def _grows(nats_srv: Nats, names: TestNames, proc: ServerProcess, by: int) -> None:
    """Wait until the stream holds ``by`` more messages: walflow is publishing."""
    target = last_seq(nats_srv.url, names.stream) + by
    wait_for(lambda: last_seq(nats_srv.url, names.stream) >= target, timeout=60,
             what=f"{by} more messages in the stream", check=lambda: assert_running(proc))


def _settle(db: Database, proc: ServerProcess, timeout: float = 120) -> int:
    """Wait until the slot passed everything committed so far (so JetStream holds it); returns that LSN."""
    end = db.current_lsn()
    wait_for(lambda: slot_confirmed(db) >= end, timeout=timeout, what="the slot to pass the last commit",
             check=lambda: assert_running(proc))
    return end


def _says_what_happened(proc: ServerProcess, crashes: int) -> list[str]:
    """The log tells each crash once: no traceback, every warning one line, at most one
    "interrupted" warning per crash and component (the reconnect attempts the recovering
    server refuses are not warnings), and a line when replication streams again. Returns the
    warnings."""
    log = log_text(proc)
    assert "Traceback" not in log, log[-4000:]
    lines = log.splitlines()
    warnings = [line for line in lines if "level=warning" in line or "level=error" in line]
    assert not [line for line in warnings if "\\n" in line], "a warning of several lines:\n" + "\n".join(warnings)
    replication = [line for line in warnings if "replication of slot" in line and "interrupted" in line]
    assert 1 <= len(replication) <= crashes, "\n".join(warnings)
    backfill = [line for line in warnings if "backfill" in line and "interrupted" in line]
    assert len(backfill) <= crashes, "\n".join(warnings)
    assert len(warnings) <= 3 * crashes, "\n".join(warnings)  # replication, heartbeat, backfill
    again = [line for line in lines if "streams again after" in line]
    assert len(again) == len(replication), "\n".join(again)
    return warnings


def test_immediate_stops_under_a_mixed_load(
    pg: Postgres, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Three crashes: one, then two back to back (the second while walflow is reconnecting)."""
    server = _embedded(pg)
    began = time.monotonic()
    with database.connect() as conn:
        create_rows_table(conn, "items")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE items")
    create_reference_slot(database, names)
    config = _config(tmp_path, database, nats_srv, names)
    sampler = SlotSampler(database, nats_srv.url, names.stream)
    writer = RowWriter(database.dsn, "items", ids=200, rate=400, seed=1)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _streaming(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        sampler.start()
        writer.start()
        try:
            _grows(nats_srv, names, proc, 1500)
            first = _crash(server, database, proc)
            _grows(nats_srv, names, proc, 1500)
            _crash(server, database, proc, reconnect=False)
            second = _crash(server, database, proc)
            _grows(nats_srv, names, proc, 1500)
        finally:
            writer.finish()
        end = _settle(database, proc)
        samples = sampler.finish()
        warnings = _says_what_happened(proc, 3)
    stored = messages(nats_srv.url, names.stream)
    counts = check_changes(stored, reference_changes(database, names, SINK, end))
    assert slot_ahead(samples, highest_seq_by_commit(stored)) == []
    assert len({confirmed for confirmed, _ in samples}) > 10, "the slot hardly moved while sampled"
    # the two back to back may come within one of its reconnect pauses
    assert writer.failures >= 2, f"the writer saw {writer.failures} lost connections for 3 crashes"
    print(f"mixed load, 3 immediate stops: {counts['changes']} changes of {counts['rows']} rows "
          f"(up to {counts['most_per_row']} a row), {dict(writer.ops)}; streaming again {first:.1f}s and "
          f"{second:.1f}s after the server was back; {len(samples)} slot samples, never ahead; "
          f"{len(warnings)} warnings; {time.monotonic() - began:.0f}s")


ROWS = 200_000


def _reads_done(proc: ServerProcess) -> bool:
    return re.search(rf"backfill \w+ of public\.accounts for sink {SINK}: done", log_text(proc)) is not None


def _table(db: Database) -> dict[int, dict[str, Any]]:
    with db.connect() as conn:
        rows: list[tuple[Any, ...]] = conn.execute("SELECT id, v, w, note FROM accounts").fetchall()
    return {r[0]: {"id": r[0], "v": r[1], "w": r[2], "note": r[3]} for r in rows}


def _replay(msgs: list[Msg]) -> dict[int, dict[str, Any]]:
    """The table a consumer that applies every message in stream order ends with."""
    rows: dict[int, dict[str, Any]] = {}
    for m in msgs:
        if m.action == "delete":
            rows.pop(m.record["id"], None)
        else:
            rows[m.record["id"]] = m.record
    return rows


def test_immediate_stop_during_a_backfill_racing_writes(
    pg: Postgres, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    server = _embedded(pg)
    began = time.monotonic()
    with database.connect() as conn:
        create_rows_table(conn, "accounts", ROWS)
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE accounts")
    create_reference_slot(database, names)
    config = _config(tmp_path, database, nats_srv, names, initial_backfill=True)
    sampler = SlotSampler(database, nats_srv.url, names.stream)
    writer = RowWriter(database.dsn, "accounts", ids=ROWS, rate=300, seed=2)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _streaming(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        sampler.start()
        writer.start()
        try:
            wait_for(lambda: stored_count(nats_srv.url, names.stream) > ROWS // 3, timeout=120, interval=0.05,
                     what="a third of the reads", check=lambda: assert_running(proc))
            assert not _reads_done(proc), "the backfill ended before the crash"
            reconnected = _crash(server, database, proc)
            wait_for(lambda: _reads_done(proc), timeout=240, what="the backfill to finish",
                     check=lambda: assert_running(proc))
        finally:
            writer.finish()
        end = _settle(database, proc)
        samples = sampler.finish()
        warnings = _says_what_happened(proc, 1)
        log = log_text(proc)
    stored = messages(nats_srv.url, names.stream)
    counts = check_changes(stored, reference_changes(database, names, SINK, end))
    reads: dict[int, int] = defaultdict(int)
    for m in stored:
        if m.action == "read":
            reads[m.record["id"]] += 1
    assert max(reads.values()) == 1, f"rows read twice: {[k for k, n in reads.items() if n > 1][:10]}"
    assert 0.9 * ROWS < len(reads) <= ROWS + writer.ops["insert"]
    got, want = _replay(stored), _table(database)
    assert got.keys() == want.keys(), (f"rows only in the stream: {sorted(got.keys() - want.keys())[:10]}, "
                                       f"only in the table: {sorted(want.keys() - got.keys())[:10]}")
    stale = [k for k in want if got[k] != want[k]]
    assert not stale, f"{len(stale)} rows end stale, e.g. {[(got[k], want[k]) for k in stale[:3]]}"
    assert slot_ahead(samples, highest_seq_by_commit(stored)) == []
    again = [line for line in log.splitlines() if "is read again" in line]
    print(f"backfill of {ROWS} rows, an immediate stop a third in: {len(reads)} reads once each, "
          f"{counts['changes']} changes, {dict(writer.ops)}; streaming again {reconnected:.1f}s after; "
          f"{len(samples)} slot samples, never ahead; {len(warnings)} warnings; "
          f"{len(again)} chunk(s) read again; {time.monotonic() - began:.0f}s")


def _big_table(db: Database, names: TestNames) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE big")


def _warmed_up(db: Database, nats_srv: Nats, names: TestNames, proc: ServerProcess) -> int:
    """Commit row 0 and wait until it is in the stream; returns walflow's peak RSS then."""
    wait_for(lambda: _streaming(db), timeout=60, what="the slot", check=lambda: assert_running(proc))
    with db.connect() as conn:
        conn.execute("INSERT INTO big VALUES (0, 'before')")
    wait_for(lambda: last_seq(nats_srv.url, names.stream) >= 1, timeout=60, what="the first message",
             check=lambda: assert_running(proc))
    assert proc.pid is not None
    return peak_rss(proc.pid)


class BigCheck:
    """Looks at each stored message of the big-transaction test without keeping it: every id a
    row's, each message id the one its position names, and what each row got, in stream order."""

    #: The rows that change again after the big transaction, and their changes in commit order.
    SPECIAL: ClassVar[dict[int, list[tuple[str, str | None]]]] = {
        0: [("insert", "before"), ("update", "after")], 1: [("insert", "x"), ("update", "after")],
        2: [("insert", "x"), ("delete", None)], BIG: [("insert", "x"), ("update", "after")]}

    def __init__(self) -> None:
        self.ids = IdScheme("shop", SINK)
        self.seen = bytearray(BIG + 1)
        self.positions: set[tuple[int, int]] = set()
        self.by_commit: dict[int, int] = {}
        self.special: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
        self.problems: list[str] = []

    def __call__(self, seq: int, msg_id: str, event: dict[str, Any]) -> None:
        meta, record, action = event["metadata"], event["record"], event["action"]
        lsn, idx = int(meta["commit_lsn"]), int(meta["commit_idx"])
        if msg_id != self.ids.encode(lsn, idx).decode():
            self.problems.append(f"seq {seq}: message id {msg_id} is not that of {lsn}:{idx}")
        if (lsn, idx) in self.positions:
            self.problems.append(f"seq {seq}: the change at {lsn}:{idx} stored twice")
        self.positions.add((lsn, idx))
        self.by_commit[lsn] = max(self.by_commit.get(lsn, 0), seq)
        row = record["id"]
        if row in self.SPECIAL:
            self.special[row].append((action, record["v"]))
        elif action != "insert" or record["v"] != "x" or not 0 < row <= BIG:
            self.problems.append(f"seq {seq}: unexpected {action} of {record}")
        elif self.seen[row]:
            self.problems.append(f"seq {seq}: row {row} inserted twice")
        if 0 <= row <= BIG:
            self.seen[row] = 1


@pytest.mark.timeout(600)  # 75-95 s on a quiet machine, 153 s beside other suites (load 14): room for worse
def test_immediate_stop_while_a_committed_million_row_transaction_streams(
    pg: Postgres, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Committed before the crash: row 0, then a million rows in one transaction, then changes of
    rows 0, 1, 2 and the last one; the crash comes once part of the big transaction is stored."""
    server = _embedded(pg)
    began = time.monotonic()
    _big_table(database, names)
    config = _config(tmp_path, database, nats_srv, names)
    sampler = SlotSampler(database, nats_srv.url, names.stream)
    with pipeline(config, "-s", "1") as proc:
        assert proc.pid is not None
        baseline = _warmed_up(database, nats_srv, names, proc)
        sampler.start()
        with database.connect() as conn:
            conn.execute(f"INSERT INTO big SELECT g, 'x' FROM generate_series(1, {BIG}) g")
            conn.execute(f"UPDATE big SET v = 'after' WHERE id IN (0, 1, {BIG})")
            conn.execute("DELETE FROM big WHERE id = 2")
        committed = time.monotonic()
        wait_for(lambda: stored_count(nats_srv.url, names.stream) > BIG // 5, timeout=180, interval=0.05,
                 what="a fifth of the big transaction in the stream", check=lambda: assert_running(proc))
        before_crash = stored_count(nats_srv.url, names.stream)
        assert before_crash < BIG * 9 // 10, f"{before_crash} messages stored before the crash: too late"
        reconnected = _crash(server, database, proc)
        _settle(database, proc, timeout=300)
        streamed = time.monotonic() - committed
        samples = sampler.finish()
        warnings = _says_what_happened(proc, 1)
        peak = peak_rss(proc.pid)
    reading = time.monotonic()
    check = BigCheck()
    total = scan(nats_srv.url, names.stream, check)
    read_for = time.monotonic() - reading
    assert check.problems == [], check.problems[:10]
    missing = [row for row in range(BIG + 1) if not check.seen[row]]
    assert not missing, f"{len(missing)} rows never stored, e.g. {missing[:10]}"
    assert dict(check.special) == BigCheck.SPECIAL
    assert total == BIG + 1 + 4
    assert slot_ahead(samples, check.by_commit) == []
    assert peak - baseline < BIG_PEAK_GROWTH, f"peak RSS grew {(peak - baseline) / 2**20:.0f} MB"
    print(f"a committed {BIG}-row transaction, an immediate stop after {before_crash} of its messages: "
          f"{total} messages, each once; streaming again {reconnected:.1f}s after, all stored {streamed:.0f}s "
          f"after the commit; peak RSS {baseline / 2**20:.0f} MB before, {peak / 2**20:.0f} MB after; "
          f"{len(samples)} slot samples, never ahead; {len(warnings)} warnings; stream read in {read_for:.0f}s; "
          f"{time.monotonic() - began:.0f}s")


def test_immediate_stop_while_a_million_row_transaction_is_written_publishes_none_of_it(
    pg: Postgres, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    server = _embedded(pg)
    began = time.monotonic()
    _big_table(database, names)
    config = _config(tmp_path, database, nats_srv, names)
    with pipeline(config, "-s", "1") as proc:
        assert proc.pid is not None
        baseline = _warmed_up(database, nats_srv, names, proc)
        start = database.current_lsn()
        written, lost = threading.Event(), threading.Event()

        def write() -> None:
            try:
                with psycopg.connect(database.dsn) as conn:  # one transaction, never committed
                    conn.execute(f"INSERT INTO big SELECT g, 'x' FROM generate_series(1, {BIG}) g")
                    written.set()
                    conn.execute("SELECT pg_sleep(300)")
            except psycopg.OperationalError:
                lost.set()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        wait_for(lambda: database.current_lsn() - start > 16 * 2**20 or written.is_set(), timeout=60,
                 interval=0.02, what="16 MB of the big transaction in the WAL")
        assert not written.is_set(), "the INSERT ended before the crash: it was not crashed mid-write"
        reconnected = _crash(server, database, proc)
        writer.join(30)
        assert lost.is_set() and not written.is_set()
        with database.connect() as conn:
            conn.execute("INSERT INTO big VALUES (-1, 'after')")
        _settle(database, proc)
        warnings = _says_what_happened(proc, 1)
        peak = peak_rss(proc.pid)
    stored: list[Msg] = messages(nats_srv.url, names.stream)
    assert [(m.action, m.record) for m in stored] == [("insert", {"id": 0, "v": "before"}),
                                                      ("insert", {"id": -1, "v": "after"})]
    with database.connect() as conn:
        assert conn.execute("SELECT count(*) FROM big").fetchone() == (2,)
    assert peak - baseline < BIG_PEAK_GROWTH, f"peak RSS grew {(peak - baseline) / 2**20:.0f} MB"
    print(f"an uncommitted {BIG}-row transaction, an immediate stop mid-INSERT: nothing of it published; "
          f"streaming again {reconnected:.1f}s after; peak RSS {baseline / 2**20:.0f} MB before, "
          f"{peak / 2**20:.0f} MB after; {len(warnings)} warnings; {time.monotonic() - began:.0f}s")
