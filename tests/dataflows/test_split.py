"""The split in a real two-process cluster: the slot's process sends compact items, the
other converts and publishes them. Table versions reach the far side before their first
change, across DDL and a reconnect (a new session describes every table again), and the
far side converts custom types exactly as the reader's process would."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from embedded._process import free_port, wait_for
from tests.harness import Database, Nats, TestNames, slot_confirmed, walsender
from tests.pipeline import assert_running, pipeline, stored, write_config


@pytest.mark.slow
def test_ddl_and_a_reconnect_reach_the_publishing_process_in_order(
    tmp_path: Path, database: Database, nats_srv: Nats, names: TestNames, stream_cleanup: str
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
        conn.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, moods mood[], n posint, at timestamptz)")
    sink = {"name": "split", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink])
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        procs = [stack.enter_context(pipeline(config, "-s", "1", "-i", str(i), "-a", addresses, log_suffix=f".{i}"))
                 for i in (0, 1)]
        wait_for(lambda: walsender(database) is not None, timeout=60, what="the slot to be read",
                 check=lambda: assert_running(*procs))
        with database.connect() as conn:
            for i in range(1, 21):
                conn.execute("INSERT INTO items VALUES (%s, '{sad,ok}', %s, '2026-12-01 10:00:00.5+00')", [i, i])
            conn.execute("ALTER TABLE items ADD COLUMN note text DEFAULT 'new'")
            for i in range(21, 41):
                conn.execute("INSERT INTO items (id, moods, n) VALUES (%s, '{ok}', %s)", [i, i])
        held = walsender(database)
        assert held is not None
        with database.connect() as conn:  # a new session: every table is described again
            conn.execute("SELECT pg_terminate_backend(%s)", [held[0]])
        wait_for(lambda: (w := walsender(database)) is not None and w[0] != held[0], timeout=60,
                 what="the reader to reconnect", check=lambda: assert_running(*procs))
        with database.connect() as conn:
            for i in range(41, 61):
                conn.execute("UPDATE items SET note = 'after' WHERE id = %s", [i - 40])
        end = database.current_lsn()
        wait_for(lambda: slot_confirmed(database) >= end, timeout=120, what="the slot to pass the writes",
                 check=lambda: assert_running(*procs))
        logs = "".join(p.log_tail(300) for p in procs)
    assert "takes no sink partitions" in logs  # the slot's process only read; the other published
    events = stored(nats_srv.url, names.stream)
    records = [(e.event["action"], e.event["record"]) for e in events]
    assert len(records) == 60 and len({e.msg_id for e in events}) == 60
    before = [r for a, r in records if a == "insert" and r["id"] <= 20]
    after = [r for a, r in records if a == "insert" and r["id"] > 20]
    updates = [r for a, r in records if a == "update"]
    assert all(r == {"id": r["id"], "moods": ["sad", "ok"], "n": r["id"], "at": "2026-12-01T10:00:00.500000Z"}
               for r in before)
    assert all(r["note"] == "new" and r["moods"] == ["ok"] and r["at"] is None for r in after)
    assert sorted(r["id"] for r in updates) == list(range(1, 21)) and all(r["note"] == "after" for r in updates)
    for i in range(1, 21):  # a row's insert before its update
        assert [a for a, r in records if r["id"] == i] == ["insert", "update"]
