"""The Postgres source against a real server: order, positions, resume, memory, liveness."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from config.schema import ReplicationSettings
from connectors.postgres.decoder import ResumePoint
from connectors.postgres.source import PostgresSource, Slot, SlotPartition
from core.errors import FatalError
from core.events import Commit, RawChange
from core.runtime import Runtime
from embedded import wait_for
from tests.harness import Database, TestNames
from tests.harness import slot_confirmed as _slot_confirmed
from tests.replication import drain, drain_snapshotting, partition, rows, run_flow
from tests.transforms.samples import make_sink
from transforms.convert import convert


@pytest.fixture
def orders(database: Database, names: TestNames) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, note text)")
        conn.execute("CREATE TABLE audit (id bigserial PRIMARY KEY, what text)")
        conn.execute("CREATE TABLE unpublished (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE orders, audit")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
    return database


def _walsenders(db: Database, application_name: str) -> int:
    with db.connect() as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE application_name = %s",
                           [application_name]).fetchone()
    return int(str(row[0])) if row else 0




def test_flow_delivers_changes_in_commit_order_with_positions(orders: Database) -> None:
    cfg = orders.config(create=False)
    with orders.connect() as conn:
        conn.execute("INSERT INTO orders VALUES (1, 'new', 'a'), (2, 'new', 'b')")
        conn.execute("INSERT INTO unpublished VALUES (1)")
        with conn.transaction():
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
            conn.execute("INSERT INTO audit (what) VALUES ('paid 1')")
            conn.execute("DELETE FROM orders WHERE id = 2")
        conn.execute("UPDATE orders SET id = 10 WHERE id = 1")
    out = run_flow(cfg, stop_at_lsn=orders.current_lsn())
    assert rows(out) == [
        ("insert", "orders", 1),
        ("insert", "orders", 2),
        ("update", "orders", 1),
        ("insert", "audit", 1),
        ("delete", "orders", 2),
        ("update", "orders", 10),
    ]
    first, second, third = out[0], out[2], out[5]
    assert first.new == {"id": 1, "status": "new", "note": "a"} and first.old is None
    assert out[1].commit_lsn == first.commit_lsn and (first.commit_idx, out[1].commit_idx) == (0, 1)
    assert [c.commit_idx for c in out[2:5]] == [0, 1, 2]
    assert len({c.commit_lsn for c in out[2:5]}) == 1 and first.commit_lsn < second.commit_lsn < third.commit_lsn
    assert len({c.xid for c in out[2:5]}) == 1
    assert out[4].old == {"id": 2, "status": None, "note": None}  # DEFAULT: the key; Sequin's nulls for the rest
    assert third.old == {"id": 1} and third.new == {"id": 10, "status": "paid", "note": "a"}
    assert all(c.schema == "public" and c.key_columns == ("id",) for c in out)
    assert first.commit_ts.tzinfo is not None and first.commit_ts <= third.commit_ts


def test_resume_from_snapshot_neither_loses_nor_repeats(orders: Database, tmp_path: Path) -> None:
    cfg = orders.config(create=False)
    recovery = tmp_path / "recovery"
    with orders.connect() as conn:
        for i in range(1, 21):
            conn.execute("INSERT INTO orders VALUES (%s, 'new', '')", [i])
    first = run_flow(cfg, stop_at_lsn=orders.current_lsn(), recovery=recovery)
    with orders.connect() as conn:
        for i in range(21, 41):
            conn.execute("INSERT INTO orders VALUES (%s, 'new', '')", [i])
    second = run_flow(cfg, stop_at_lsn=orders.current_lsn(), recovery=recovery)
    assert [c.new["id"] for c in first if c.new] == list(range(1, 21))
    assert [c.new["id"] for c in second if c.new] == list(range(21, 41))


def test_resume_inside_a_transaction(orders: Database) -> None:
    cfg = orders.config(create=False)
    settings = ReplicationSettings(batch_size=7)  # a batch stretches at most 70 items to reach a commit
    with partition(cfg, settings) as part:
        with orders.connect() as conn, conn.transaction():
            for i in range(200):
                conn.execute("INSERT INTO orders VALUES (%s, 'bulk', '')", [i])
        got = drain(part, lambda out: len(out) >= 20)
        state = part.snapshot()
    assert len(got) < 200
    assert state["commit_lsn"] == got[-1].commit_lsn and state["commit_idx"] == got[-1].commit_idx
    with partition(cfg, settings, resume=state) as part:
        rest = drain(part, lambda out: len(out) >= 200 - len(got))
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (1000, 'after', '')")
        rest += drain(part, lambda out: bool(out and out[-1].new and out[-1].new["id"] == 1000))
    ids = [c.new["id"] for c in got + rest if c.new]
    assert ids == [*range(200), 1000]


def test_resume_point_skips_what_was_emitted() -> None:
    """PG15 can move confirmed_flush_lsn back after a crash: walflow also dedupes by its own position."""

    def skips(point: ResumePoint, commit_lsn: int, idx: int) -> bool:
        return idx <= point.emitted_up_to(commit_lsn)

    done = ResumePoint(lsn=1000)
    assert skips(done, 999, 0) and not skips(done, 1000, 0) and not skips(done, 5000, 0)
    partial = ResumePoint(lsn=1000, commit_lsn=2000, commit_idx=4)
    assert skips(partial, 999, 7) and skips(partial, 2000, 4) and not skips(partial, 2000, 5)
    assert not skips(partial, 3000, 0)


def test_starts_at_the_stored_position_not_the_slots(orders: Database) -> None:
    cfg = orders.config(create=False)
    with partition(cfg) as part:
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (1, 'a', '')")
        first, state = drain_snapshotting(part, lambda out, state: bool(out) and state["lsn"] > out[0].commit_lsn)
    # that last snapshot was never confirmed: no call followed it
    assert _slot_confirmed(orders) < first[0].commit_lsn  # the server would send row 1 again
    with orders.connect() as conn:
        conn.execute("INSERT INTO orders VALUES (2, 'b', '')")
    with partition(cfg, resume=state) as part:
        again = drain(part, lambda out: len(out) >= 1)
        assert drain(part, lambda out: part.snapshot()["lsn"] >= orders.current_lsn()) == []
    assert [c.new["id"] for c in again if c.new] == [2]


def test_resumed_mid_transaction_snapshots_keep_their_place(orders: Database) -> None:
    """Every snapshot after a mid-transaction resume still points inside that transaction."""
    cfg = orders.config(create=False)
    with partition(cfg, ReplicationSettings(batch_size=5)) as part:
        with orders.connect() as conn, conn.transaction():
            for i in range(300):
                conn.execute("INSERT INTO orders VALUES (%s, 'bulk', '')", [i])
        got = drain(part, lambda out: len(out) >= 10)
        state = part.snapshot()
    seen = [c.new["id"] for c in got if c.new]
    for _ in range(3):  # resume, take one change at a time with a snapshot after each, stop, resume again
        with partition(cfg, ReplicationSettings(batch_size=1), resume=state) as part:
            more, state = drain_snapshotting(part, lambda out, _: len(out) >= 3)
        seen += [c.new["id"] for c in more if c.new]
        assert state["commit_lsn"] == more[-1].commit_lsn and state["commit_idx"] == more[-1].commit_idx
    assert seen == list(range(len(seen))) and len(seen) < 300  # contiguous: nothing twice, nothing skipped


def test_confirmed_position_never_passes_an_unsnapshotted_change(orders: Database) -> None:
    """Only a snapshot followed by another call confirms; an epoch that ends inside a
    transaction confirms nothing; idle WAL keeps the slot moving."""
    cfg = orders.config(create=False)
    # no heartbeats here: their transactions would move the position between the exact checks below
    with partition(cfg, ReplicationSettings(status_interval_ms=1000, batch_size=3, heartbeat_interval_ms=0)) as part:
        reader = part._reader
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (1, 'a', '')")
        first = drain(part, lambda out: bool(out))
        state = part.snapshot()  # a batch ends at a commit when it can: this epoch ends cleanly
        assert state["commit_lsn"] is None and state["lsn"] > first[0].commit_lsn
        assert reader.position.confirmed < first[0].commit_lsn  # snapshot() alone confirms nothing new
        part.next_batch()  # the next epoch's call: the snapshot's position is now confirmed
        assert reader.position.confirmed >= state["lsn"]  # (or later: other databases' WAL moves walEnd)
        wait_for(lambda: _slot_confirmed(orders) >= state["lsn"], timeout=10, what="status update")
        with orders.connect() as conn, conn.transaction():
            for i in range(2, 102):
                conn.execute("INSERT INTO orders VALUES (%s, 'b', '')", [i])
        got = drain(part, lambda out: len(out) >= 10)  # part of the big transaction
        inside = part.snapshot()
        assert inside["commit_lsn"] == got[-1].commit_lsn and inside["lsn"] < inside["commit_lsn"]
        got += [convert(c) for c in part.next_batch() if isinstance(c, RawChange)]
        # the epoch ended inside a transaction: nothing inside it is confirmed
        assert reader.position.confirmed <= inside["lsn"] < got[-1].commit_lsn
        got += drain(part, lambda out: len(got) + len(out) >= 100)
        assert [c.new["id"] for c in got if c.new] == list(range(2, 102))
        with orders.connect() as conn:
            for i in range(200):
                conn.execute("INSERT INTO unpublished VALUES (%s)", [i])
        target = orders.current_lsn()
        # epochs go by: each snapshot is confirmed by the next call; idle walEnd keeps the slot moving
        drain(part, lambda out: part.snapshot()["lsn"] >= target and _slot_confirmed(orders) >= target)
    assert _slot_confirmed(orders) >= target


def test_truncate_and_full_identity_keys(orders: Database) -> None:
    cfg = orders.config(create=False)
    with partition(cfg) as part:
        with orders.connect() as conn:
            conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO orders VALUES (1, 'a', 'n')")
            conn.execute("UPDATE orders SET status = 'b' WHERE id = 1")
            conn.execute("TRUNCATE orders, audit")
        insert, update, *truncates = drain(part, lambda out: len(out) >= 4)
    assert insert.key_columns == ("id",) and update.key_columns == ("id",)  # the primary key, not every column
    assert update.old == {"id": 1, "status": "a", "note": "n"}
    assert [(t.action, t.table, t.new, t.old) for t in truncates] == [
        ("truncate", "orders", None, None),
        ("truncate", "audit", None, None),
    ]
    assert truncates[0].commit_lsn == truncates[1].commit_lsn and [t.commit_idx for t in truncates] == [0, 0]  # one message, one index


@pytest.mark.slow
def test_million_row_transaction_streams_in_bounded_memory(orders: Database) -> None:
    cfg = orders.config(create=False)
    settings = ReplicationSettings(buffer_mb=4, batch_size=5000)
    with partition(cfg, settings) as part:
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders SELECT g, 'bulk', repeat('x', 40) FROM generate_series(1, 1000000) g")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        count, last_id = 0, 0
        while count < 1_000_000:
            batch = drain(part, bool, timeout=300)
            part.snapshot()  # an epoch per batch: the per-epoch budget starts over
            count += len(batch)
            last_id = batch[-1].new["id"] if batch[-1].new else last_id
        rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        high_water = part._reader.buffer.high_water
    assert (count, last_id) == (1_000_000, 1_000_000)
    assert high_water <= settings.buffer_mb * 1024 * 1024 + 64 * 1024  # the bound plus one message
    assert rss_growth_mb < 150, f"RSS grew {rss_growth_mb:.0f} MB"


@pytest.mark.slow
def test_full_buffer_keeps_the_connection_alive(orders: Database) -> None:
    """Not consuming for 3x wal_sender_timeout: status updates keep the walsender from timing out."""
    cfg = orders.config(create=False)
    settings = ReplicationSettings(buffer_mb=1, wal_sender_timeout_ms=2000, status_interval_ms=500)
    with partition(cfg, settings) as part:
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders SELECT g, 'x', repeat('y', 200) FROM generate_series(1, 50000) g")
        reader = part._reader
        out = drain(part, lambda out: reader.buffer.full, timeout=30)
        with orders.connect() as conn:  # the walsender waits on us, it is not gone
            deadline_reached = conn.execute(
                "SELECT pg_sleep(6), count(*) FROM pg_stat_replication WHERE application_name = %s",
                [reader.application_name],
            ).fetchone()
        assert deadline_reached is not None and deadline_reached[1] == 1
        out += drain(part, lambda more: bool(more) and more[-1].new is not None and more[-1].new["id"] == 50000)
    assert reader.error is None
    assert [c.new["id"] for c in out if c.new] == list(range(1, 50001))


def test_a_terminated_walsender_is_replaced_mid_transaction(orders: Database) -> None:
    """pg_terminate_backend in the middle of a big transaction: the reader reconnects by
    itself and resumes right after the last change it handed on — nothing twice, nothing lost."""
    cfg = orders.config(create=False)
    settings = ReplicationSettings(batch_size=50, buffer_mb=1)
    with partition(cfg, settings) as part:
        reader = part._reader
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders SELECT g, 'x', repeat('z', 300) FROM generate_series(1, 20000) g")
        got = drain(part, lambda out: len(out) >= 1000)
        first_pid = _walsender_pid(orders, reader.application_name)
        with orders.connect() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [first_pid])
        got += drain(part, lambda out: len(got) + len(out) >= 20000, timeout=120)
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (20001, 'after', '')")
        got += drain(part, lambda out: bool(out))
        assert reader.error is None
        assert _walsender_pid(orders, reader.application_name) not in (None, first_pid)
    assert [c.new["id"] for c in got if c.new] == list(range(1, 20002))


def test_a_dropped_publication_stops_with_a_clear_error(orders: Database, names: TestNames) -> None:
    cfg = orders.config(create=False)
    with partition(cfg) as part:
        drain(part, lambda out: part._reader.slot_state is not None)
        with orders.connect() as conn:
            conn.execute(f"DROP PUBLICATION {names.publication}")
            conn.execute("INSERT INTO orders VALUES (1, 'a', '')")
        with pytest.raises(FatalError) as info:
            drain(part, lambda out: False, timeout=30)
    message = str(info.value)
    assert "The publication was dropped (or never existed) while walflow was reading" in message
    assert f'publication "{names.publication}" does not exist' in message


def _walsender_pid(db: Database, application_name: str) -> int | None:
    with db.connect() as conn:
        row = conn.execute("SELECT pid FROM pg_stat_replication WHERE application_name = %s",
                           [application_name]).fetchone()
    return int(str(row[0])) if row else None


def test_nothing_up_to_the_replay_horizon_is_confirmed(orders: Database) -> None:
    """A previous run may have published changes up to the sinks' replay horizon: the slot
    stays before it until the source has passed it (connectors/nats/replay.py)."""
    cfg = orders.config(create=False)
    horizon = orders.current_lsn() + 2_000_000  # as if an earlier run had published up to here
    source = PostgresSource([Slot(cfg, confirm_after=horizon)], ReplicationSettings(), Runtime())
    part = source.build_part("pg", cfg.slot.name, None)
    try:
        with orders.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (1, 'a', '')")
        drain(part, lambda out: len(out) >= 1)
        for _ in range(5):  # epochs go by: each snapshot is before the horizon, none is confirmed
            state = part.snapshot()
            part.next_batch()
        assert state["lsn"] < horizon and part._reader.position.confirmed < horizon
        with orders.connect() as conn:  # WAL moves past the horizon: now the slot may follow
            conn.execute("INSERT INTO unpublished SELECT g FROM generate_series(1, 40000) g")
        drain(part, lambda out: part.snapshot()["lsn"] > horizon and part._reader.position.confirmed > horizon)
    finally:
        part.close()


def _raw(part: SlotPartition, commits: int, timeout: float = 60.0) -> list[RawChange | Commit]:
    """What the partition emits, unconverted, until ``commits`` Commits came."""
    out: list[RawChange | Commit] = []
    deadline = time.monotonic() + timeout
    while sum(1 for item in out if type(item) is Commit) < commits:
        assert time.monotonic() < deadline, f"timed out with {len(out)} items"
        batch = part.next_batch()
        out += batch
        if not batch:
            time.sleep(0.005)
    return out


def test_a_slot_with_a_sink_in_commit_order_marks_each_transactions_end(orders: Database) -> None:
    cfg = orders.config(create=False)
    sinks = (make_sink(database=cfg.name, transactions="atomic"),)
    with partition(cfg, ReplicationSettings(batch_size=7), sinks=sinks) as part:  # the transaction spans batches
        with orders.connect() as conn:
            with conn.transaction():
                for i in range(30):
                    conn.execute("INSERT INTO orders VALUES (%s, 'bulk', '')", [i])
            conn.execute("INSERT INTO unpublished VALUES (1)")  # a transaction with no change in the slot's output
            conn.execute("INSERT INTO orders VALUES (100, 'alone', '')")
        items = _raw(part, 2)
    first, second = items[:30], items[31]
    assert all(type(c) is RawChange and c.commit_lsn == first[0].commit_lsn for c in first)
    assert items[30] == Commit(cfg.name, first[0].commit_lsn, first[0].xid, first[0].commit_ts)
    assert type(second) is RawChange and items[32:] == [Commit(cfg.name, second.commit_lsn, second.xid,
                                                               second.commit_ts)]


def test_a_slot_with_a_sink_in_commit_order_resumes_an_open_transaction_from_its_start(orders: Database) -> None:
    """Its snapshot never points inside a transaction: the sink's unsent part of one is in no snapshot."""
    cfg = orders.config(create=False)
    sinks = (make_sink(database=cfg.name, transaction_markers=True),)
    with partition(cfg, ReplicationSettings(batch_size=7), sinks=sinks) as part:
        with orders.connect() as conn, conn.transaction():
            for i in range(200):
                conn.execute("INSERT INTO orders VALUES (%s, 'bulk', '')", [i])
        got = drain(part, lambda out: len(out) >= 20)
        state = part.snapshot()
    assert 20 <= len(got) < 200 and state["commit_lsn"] is None and state["lsn"] < got[0].commit_lsn
    with partition(cfg, ReplicationSettings(batch_size=7), resume=state, sinks=sinks) as part:
        again = _raw(part, 1)
    changes = [convert(c) for c in again if isinstance(c, RawChange)]
    assert [c.new["id"] for c in changes if c.new] == list(range(200))
