"""Schema events through the real pipeline, PostgreSQL and NATS: ``ALTER TABLE`` under load, each
reported once and stored before every change of the new shape in any of the sink's partitions;
nothing for a table the sink does not read, nor for a reconnect or a restart that changed nothing;
a change made while walflow was stopped reported when it starts, and shown by ``walflow status``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from embedded import wait_for
from tests.cli.helpers import status
from tests.harness import Database, Nats, TestNames, slot_active, slot_confirmed, walsender
from tests.pipeline import Stored, assert_running, pipeline, stored, write_config

ROWS = 20


class Writer(threading.Thread):
    """Keeps updating rows of ``items`` and of ``other``, one transaction each, until stopped:
    the load a schema change lands in. ``count``: transactions committed so far."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.count = 0
        self.failed: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    row = self.count % ROWS + 1
                    conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [row])
                    conn.execute("UPDATE other SET v = v + 1 WHERE id = %s", [row])
                    self.count += 1
                    time.sleep(0.002)  # a load generator's pacing (~300 transactions/s), not synchronisation
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.failed = exc

    def advance(self, by: int, check: Any) -> None:
        """Wait until ``by`` more transactions are committed."""
        goal = self.count + by
        wait_for(lambda: self.count >= goal or self.failed is not None, timeout=60, what=f"{by} more writes",
                 check=check)
        assert self.failed is None, self.failed


@contextmanager
def writing(database: Database, proc: Any) -> Iterator[Writer]:
    """A :class:`Writer` on ``database`` once the pipeline ``proc`` reads its slot (the slot keeps
    nothing from before it exists)."""
    wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
    writer = Writer(database.dsn)
    writer.start()
    try:
        yield writer
    finally:
        writer.stop.set()
        writer.join(timeout=30)
    assert writer.failed is None, writer.failed


def setup(database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path, **stream: Any) -> Path:
    """``items`` and ``other`` read by the sink, ``hidden`` published but not read by it; four partitions;
    ``stream``: the stream's settings."""
    with database.connect() as conn:
        for table in ("items", "other", "hidden"):
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, note text, n int)")
            conn.execute(f"INSERT INTO {table} (id, note, n) SELECT i, 'note', i FROM generate_series(1, {ROWS}) i")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE items, other, hidden")
    sink = {"name": "g", "schema_events": True, "partition_count": 4,
            "source": {"include_tables": ["public.items", "public.other"]},
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream, **stream}}}
    return write_config(tmp_path, database, nats_srv, names, [sink])


def schema_events(events: list[Stored]) -> list[Stored]:
    return [e for e in events if e.subject.endswith(".schema")]


def changes_of(events: list[Stored], table: str) -> list[Stored]:
    return [e for e in events if not e.subject.endswith(".schema") and e.event["metadata"]["table_name"] == table]


def position(event: Stored) -> tuple[int, int]:
    return event.event["metadata"]["commit_lsn"], event.event["metadata"]["commit_idx"]


def columns(shape: dict[str, Any]) -> list[tuple[str, str, bool]]:
    return [(c["name"], c["type"], c["key"]) for c in shape["columns"]]


def catch_up(database: Database, proc: Any) -> None:
    end = database.current_lsn()
    wait_for(lambda: slot_confirmed(database) >= end, timeout=120, what="the slot to pass the writes",
             check=lambda: assert_running(proc))


BEFORE = [("id", "integer", True), ("v", "integer", False), ("note", "text", False), ("n", "integer", False)]
#: Each DDL, the columns after it, and a test of a change's record: of the new shape?
DDLS: list[tuple[str, list[tuple[str, str, bool]], Any]] = [
    ("ALTER TABLE items ADD COLUMN extra int DEFAULT 5", [*BEFORE, ("extra", "integer", False)],
     lambda record: "extra" in record),
    ("ALTER TABLE items DROP COLUMN note", [BEFORE[0], BEFORE[1], BEFORE[3], ("extra", "integer", False)],
     lambda record: "note" not in record),
    ("ALTER TABLE items ALTER COLUMN n TYPE text USING n::text",
     [BEFORE[0], BEFORE[1], ("n", "text", False), ("extra", "integer", False)],
     lambda record: isinstance(record["n"], str)),
    ("ALTER TABLE items REPLICA IDENTITY FULL",
     [BEFORE[0], BEFORE[1], ("n", "text", False), ("extra", "integer", False)], None),
]


@pytest.mark.slow
def test_each_alter_table_under_load_is_one_event_stored_before_the_new_shape(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup(database, names, nats_srv, tmp_path)
    around: list[tuple[int, int]] = []  # each DDL's WAL position just before and just after it
    with pipeline(config, "-s", "1") as proc, writing(database, proc) as writer:
        writer.advance(100, lambda: assert_running(proc))
        with database.connect() as conn:
            conn.execute("ALTER TABLE hidden ADD COLUMN extra int")  # not read by the sink
            conn.execute("UPDATE hidden SET v = 1")
        for ddl, _, _ in DDLS:
            before = database.current_lsn()
            with database.connect() as conn:
                conn.execute(ddl)
            around.append((before, database.current_lsn()))
            writer.advance(150, lambda: assert_running(proc))
        held = walsender(database)  # a reconnect: every table described again, no shape changed
        assert held is not None
        with database.connect() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [held[0]])
        wait_for(lambda: (w := walsender(database)) is not None and w[0] != held[0], timeout=60,
                 what="the reader to reconnect", check=lambda: assert_running(proc))
        writer.advance(150, lambda: assert_running(proc))
        writer.stop.set()
        writer.join(timeout=30)
        catch_up(database, proc)
    events = stored(nats_srv.url, names.stream)
    reported = schema_events(events)
    assert [e.subject for e in reported] == [f"{names.subject_prefix}.shop.public.items.schema"] * len(DDLS)
    assert len({e.msg_id for e in reported}) == len(DDLS)
    items = changes_of(events, "items")
    assert len(changes_of(events, "other")) == writer.count  # the load went on throughout
    old = BEFORE
    for (ddl, new, of_new_shape), event, (before, after) in zip(DDLS, reported, around, strict=True):
        payload = event.event
        assert columns(payload["old"]) == old and columns(payload["new"]) == new, ddl
        identities = (payload["old"]["replica_identity"], payload["new"]["replica_identity"])
        assert identities == (("default", "full") if "REPLICA IDENTITY" in ddl else ("default", "default")), ddl
        at = position(event)
        assert before < at[0], ddl
        first = min(position(e) for e in items if position(e) >= at)
        assert first == at, f"{ddl}: the event is at {at}, the first change after it at {first}"
        assert at[0] <= min(position(e)[0] for e in items if position(e)[0] > after), ddl
        newer = [e for e in items if position(e) >= at]
        assert all(e.seq > event.seq for e in newer), f"{ddl}: a change of the new shape was stored before its event"
        if of_new_shape is not None:
            assert all(of_new_shape(e.event["record"]) for e in newer), ddl
            assert not any(of_new_shape(e.event["record"]) for e in items if position(e) < at), ddl
        old = new


@pytest.mark.slow
def test_restarts_report_what_changed_while_stopped_and_nothing_else(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup(database, names, nats_srv, tmp_path)
    subject = f"{names.subject_prefix}.shop.public.items.schema"
    for run in range(3):
        if run == 2:  # while walflow is stopped
            with database.connect() as conn:
                conn.execute("ALTER TABLE items ALTER COLUMN note TYPE varchar(40)")
        with pipeline(config, "-s", "1", log_suffix=f".{run}") as proc, writing(database, proc) as writer:
            writer.advance(100, lambda: assert_running(proc))
            writer.stop.set()
            writer.join(timeout=30)
            catch_up(database, proc)
        reported = schema_events(stored(nats_srv.url, names.stream))
        if run < 2:  # the first run records the shapes; a restart with no change publishes nothing
            assert reported == [], run
    assert [e.subject for e in reported] == [subject]
    event = reported[0].event
    assert columns(event["old"]) == BEFORE
    assert columns(event["new"]) == [BEFORE[0], BEFORE[1], ("note", "character varying(40)", False), BEFORE[3]]
    items = changes_of(stored(nats_srv.url, names.stream), "items")
    assert position(reported[0]) == min(position(e) for e in items if e.seq > reported[0].seq)
    assert all(e.seq < reported[0].seq for e in items if position(e) < position(reported[0]))
    out = status(config)
    (sink,) = out.data["sinks"]
    assert [c["table"] for c in sink["schema_changes"]] == ["public.items"]
    assert sink["schema_changes"][0]["last_change"].startswith("note text → character varying(40) (the first change")
    out.finding("info", "table public.items last changed shape: note text → character varying(40)")


@pytest.mark.slow
def test_a_partition_later_than_the_duplicate_window_stores_no_second_copy(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Row 1's partition publishes the event; the others get their first change of the new shape only
    after JetStream would have forgotten its id: they find it in the stream instead."""
    window = 1.0
    config = setup(database, names, nats_srv, tmp_path, duplicate_window_ms=int(window * 1000))
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        with database.connect() as conn:
            conn.execute("UPDATE items SET v = 1")  # every partition: the shape is recorded
            conn.execute("ALTER TABLE items ADD COLUMN extra int")
            conn.execute("UPDATE items SET v = 2 WHERE id = 1")
        wait_for(lambda: schema_events(stored(nats_srv.url, names.stream)) != [], timeout=60, what="the event",
                 check=lambda: assert_running(proc))
        time.sleep(window * 1.5)  # outlasting the duplicate window is what is tested, not a synchronisation
        with database.connect() as conn:
            conn.execute("UPDATE items SET v = 3 WHERE id > 1")
        catch_up(database, proc)
    events = stored(nats_srv.url, names.stream)
    (event,) = schema_events(events)
    later = [e for e in changes_of(events, "items") if position(e) >= position(event)]
    assert len(later) == ROWS and all(e.seq > event.seq and "extra" in e.event["record"] for e in later)
