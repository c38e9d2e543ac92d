"""Values too large to publish (core/sizes.py) through the real pipeline: each ends as the
policy says — published with the marker, published whole, or as its dead letter — is counted,
and the flow goes on: every other change arrives exactly once and the slot is confirmed past it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from embedded import NatsServer, wait_for
from embedded._process import ServerProcess, free_port
from tests.harness import Database, Nats, TestNames, slot_active, slot_confirmed
from tests.pipeline import Stored, assert_running, by_labels, pipeline, scrape, stored, write_config
from tests.workload import Inserter

#: What the process's peak resident memory (VmHWM) may grow by while a 50 MB value goes through:
#: libpq holds the message twice (its input buffer, and the copy PQgetCopyData hands over), and
#: walflow copies none of it (one copy more would pass the bound). Measured: +100 to +102 MB.
HUGE = 50 * 1024 * 1024
HUGE_PEAK_GROWTH = HUGE * 5 // 2


def _events(db: Database, names: TestNames, nats: Nats, tmp_path: Path, port: int, *, before: str = "",
            **walflow: Any) -> Path:
    """``events (id int PRIMARY KEY, payload text)`` published, rows ``before`` it (SQL), a config
    with sink ``g`` (its ``initial_backfill`` reads them), health on ``port``, ``walflow`` keys."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, payload text)")
        if before:
            conn.execute(before)
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE events")
    sink = {"name": "g", "initial_backfill": bool(before),
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    return write_config(tmp_path, db, nats, names, [sink], health={"enabled": True, "port": port}, **walflow)


def _oversized(port: int) -> dict[tuple[str, ...], float]:
    return by_labels(scrape(port).get("walflow_oversized_values_total", {}), "limit", "table", "column")


def _peak_rss(proc: ServerProcess) -> int:
    """The process's peak resident memory so far, in bytes (``VmHWM``)."""
    found = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{proc.pid}/status").read_text(), re.MULTILINE)
    assert found is not None
    return int(found.group(1)) * 1024


def _records(events: list[Stored]) -> dict[int, Any]:
    """Each stored change's record by its id; a second message of one id fails the test."""
    out: dict[int, Any] = {}
    for event in events:
        record = event.event["record"]
        assert record["id"] not in out, f"id {record['id']} stored twice"
        out[record["id"]] = record
    return out


def _pass_the_slot(db: Database, proc: ServerProcess) -> None:
    end = db.current_lsn()
    wait_for(lambda: slot_confirmed(db) >= end, timeout=120, what="the slot to pass the workload",
             check=lambda: assert_running(proc))


@pytest.mark.slow
def test_a_50_mb_value_and_one_over_max_payload_while_changes_flow(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Under the defaults (walflow.max_change_mb 8, NATS's max_payload 1 MB): the 50 MB value
    is replaced in the decoder, before it is copied; the 2 MB one is decoded whole and replaced
    where its message is rendered. Nothing else is touched, and the process's memory barely
    notices the 50 MB value."""
    port = free_port()
    config = _events(database, names, nats_srv, tmp_path, port)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        writer = Inserter(database.dsn, rate=100)
        writer.start()
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) >= 50, timeout=60, what="changes flowing",
                 check=lambda: assert_running(proc))
        before = _peak_rss(proc)
        with database.connect() as conn:
            conn.execute("INSERT INTO events VALUES (-1, repeat('x', %s))", [HUGE])
            conn.execute("INSERT INTO events VALUES (-2, repeat('y', 2000000))")
        wait_for(lambda: any(e.event["record"]["id"] == -2 for e in stored(nats_srv.url, names.stream)),
                 timeout=120, what="the large values", check=lambda: assert_running(proc))
        writer.stop.set()
        writer.join(10)
        _pass_the_slot(database, proc)
        peak = _peak_rss(proc)
        counted = _oversized(port)
    records = _records(stored(nats_srv.url, names.stream))
    assert sorted(records) == [-2, -1, *range(1, writer.count + 1)]  # every change once, the flow went on
    assert records[-1] == {"id": -1, "payload": f"__walflow_oversized_value:{HUGE}"}
    assert records[-2] == {"id": -2, "payload": "__walflow_oversized_value:2000000"}
    assert records[1] == {"id": 1, "payload": "x" * 100}
    assert counted == {("max_change", "public.events", "payload"): 1, ("max_payload", "public.events", "payload"): 1}
    growth = peak - before
    print(f"peak RSS {before / 2**20:.0f} MB before the 50 MB value, {peak / 2**20:.0f} MB after "
          f"(+{growth / 2**20:.0f} MB)")
    assert growth < HUGE_PEAK_GROWTH, (before, peak)
    log = proc.log_tail(400)
    assert log.count("walflow_oversized_values_total") == 2  # one warning per limit, table and column


@pytest.mark.slow
def test_a_row_at_max_change_is_published_whole_and_one_byte_past_it_with_the_marker(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """The limit is the row's WAL message (XLogData header, Insert, its tuple): for ``events`` 43
    bytes and the id's text besides the payload. A backfill's read follows the same limit, on the
    row's texts."""
    port, limit = free_port(), int(0.05 * 1024 * 1024)
    config = _events(database, names, nats_srv, tmp_path, port, max_change_mb=0.05,
                     before=f"INSERT INTO events VALUES (100, repeat('r', {limit})), (101, 'small')")
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) == 2, timeout=60, what="the backfill",
                 check=lambda: assert_running(proc))
        with database.connect() as conn:
            conn.execute("INSERT INTO events VALUES (1, repeat('a', %s))", [limit - 44])  # exactly the limit
            conn.execute("INSERT INTO events VALUES (2, repeat('b', %s))", [limit - 43])  # one byte past it
            conn.execute("INSERT INTO events VALUES (3, 'after')")
        _pass_the_slot(database, proc)
        counted = _oversized(port)
        log = proc.log_tail(400)
    records = _records(stored(nats_srv.url, names.stream))
    assert records == {
        100: {"id": 100, "payload": f"__walflow_oversized_value:{limit}"},  # 100 + its payload: past the limit
        101: {"id": 101, "payload": "small"},
        1: {"id": 1, "payload": "a" * (limit - 44)},
        2: {"id": 2, "payload": f"__walflow_oversized_value:{limit - 43}"},
        3: {"id": 3, "payload": "after"},
    }
    assert counted == {("max_change", "public.events", "payload"): 1}  # the change; the read is logged only:
    assert f"public.events.payload: a value of {limit} bytes in a read of backfill" in log  # (README, Known limits)
    assert "public.events.payload: a value of 52385 bytes in the insert at commit LSN" in log


@pytest.mark.slow
def test_a_row_that_cannot_fit_max_payload_is_its_dead_letter_and_the_flow_goes_on(
    database: Database, names: TestNames, tmp_path: Path
) -> None:
    """A NATS server with ``max_payload: 8192``: a 20 kB value is replaced to fit; a row of 300
    columns of 100 bytes is 8 kB of markers alone, so it is published as its dead letter (under
    ``on_error: stop``, the default: size never stops the pipeline)."""
    columns = ", ".join(f"c{i} text" for i in range(300))
    with database.connect() as conn:
        conn.execute(f"CREATE TABLE wide (id int PRIMARY KEY, {columns})")
    port = free_port()
    with NatsServer(extra_config="max_payload: 8192") as small:
        config = _events(database, names, small, tmp_path, port)
        with database.connect() as conn:
            conn.execute(f"ALTER PUBLICATION {names.publication} ADD TABLE wide")
        with pipeline(config, "-s", "1") as proc:
            wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
            with database.connect() as conn:
                conn.execute("INSERT INTO events VALUES (1, 'before')")
                conn.execute("INSERT INTO events VALUES (2, repeat('x', 20000))")
                conn.execute(f"INSERT INTO wide SELECT 7, {', '.join(['repeat(%s, 100)'] * 300)}", ["w"] * 300)
                conn.execute("INSERT INTO events VALUES (3, 'after')")
            _pass_the_slot(database, proc)
            counted = scrape(port)
            log = proc.log_tail(400)
        messages = stored(small.url, names.stream)
    dead = [m for m in messages if m.subject == f"{names.subject_prefix}.shop.dead_letter"]
    # three rows: the contract orders each row's changes, not different rows' (they may interleave)
    assert sorted((m.event["record"] for m in messages if m not in dead), key=lambda record: record["id"]) == [
        {"id": 1, "payload": "before"}, {"id": 2, "payload": "__walflow_oversized_value:20000"},
        {"id": 3, "payload": "after"}]
    (letter,) = dead
    assert letter.event["error"]["step"] == "size" and letter.event["metadata"]["record_pks"] == ["7"]
    assert letter.event["metadata"]["table_name"] == "wide" and b"www" not in letter.data
    assert by_labels(counted["walflow_dead_letters_total"], "sink", "table", "step") == {("g", "public.wide", "size"): 1}
    assert by_labels(counted["walflow_oversized_values_total"], "limit", "table", "column") == {
        ("max_payload", "public.events", "payload"): 1}
    assert "does not fit in sink 'g''s max_payload" in log
