"""``walflow status`` against real servers: healthy, stopped, a hung foreign holder, an invalidated
slot, NATS down — the verdict, the exit status and the operator's line, as text and as JSON."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from cli.status import STUCK_AFTER
from embedded import PostgresServer, wait_for
from embedded._process import free_port
from tests.backfill.helpers import WALFLOW, walflow
from tests.cli.helpers import add_stream, edit, health_on, run_both, status, stream_exists, verdict
from tests.harness import Database, Nats, TestNames, hung_pg_recvlogical, slot_active, slot_confirmed
from tests.pipeline import assert_running, pipeline, write_config
from tests.workload import Inserter, setup_events


def _create_slot(database: Database, names: TestNames) -> None:
    with database.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])


def _insert(database: Database, ids: range) -> None:
    with database.connect() as conn:
        for i in ids:
            conn.execute("INSERT INTO events VALUES (%s, 'x')", [i])


@pytest.mark.slow
def test_a_healthy_pipeline(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    port = free_port()
    config = health_on(setup_events(database, names, nats_srv, tmp_path), port)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: verdict(config) == "healthy", timeout=60, interval=1,
                 what="a healthy status", check=lambda: assert_running(proc))
        _insert(database, range(1, 4))
        end = database.current_lsn()
        wait_for(lambda: slot_confirmed(database) >= end, timeout=30, what="delivery", check=lambda: assert_running(proc))
        out = status(config)
    assert out.code == 0 and out.data["verdict"] == "healthy" and out.data["reasons"] == []
    assert out.text.startswith("walflow status: HEALTHY — changes flow from every slot to JetStream\n")
    assert "\x1b[" not in out.text  # not a terminal: no colour
    assert not out.levels("down") and not out.levels("degraded")
    read = out.finding("ok", "read by walflow: PID ")
    assert f"walflow:{names.slot}" in read["text"]
    out.finding("ok", f"running and ready at http://127.0.0.1:{port}/readyz: slot {names.slot} connected")
    out.finding("ok", f"stream {names.stream}: 3 messages")
    (db,) = out.data["databases"]
    assert db["slot"]["holder"]["application_name"] == f"walflow:{names.slot}" and db["slot"]["active"]
    assert db["slot"]["wal_status"] == "reserved" and db["slot"]["lag_bytes"] < 1_000_000
    assert db["publication"] == {"name": names.publication, "exists": True, "tables": ["public.events"],
                                 "actions": ["delete", "insert", "truncate", "update"]}
    (sink,) = out.data["sinks"]
    assert sink["nats_reachable"] and sink["stream"]["messages"] == 3 and sink["stream"]["last_sequence"] == 3
    assert sink["stream"]["duplicate_window_s"] == 120
    assert out.data["pipeline"]["answering"] and out.data["pipeline"]["ready"]


@pytest.mark.parametrize("health", [True, False])
def test_a_stopped_pipeline_is_down(
    health: bool, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """What a pipeline leaves behind when it stops: its slot, inactive, keeping WAL; its stream."""
    port = free_port()
    config = setup_events(database, names, nats_srv, tmp_path)
    if health:
        health_on(config, port)
    _create_slot(database, names)
    add_stream(nats_srv.url, names.stream, [f"{names.subject_prefix}.shop.>"])
    _insert(database, range(1, 4))
    out = status(config)
    assert out.code == 2 and out.data["verdict"] == "down"
    inactive = out.finding("down", f"slot {names.slot} is inactive: no walflow reads it")
    if health:
        url = f"http://127.0.0.1:{port}/readyz"
        assert out.data["reasons"][0].startswith(f"pipeline not running (health endpoint not answering at {url}: ")
        assert out.text.startswith(f"walflow status: DOWN — pipeline not running (health endpoint not answering at {url}")
        assert out.finding("down", "pipeline not running")["fix"] == f"start it: ./run.sh run {config}"
        assert inactive["fix"] is None  # said once, on the pipeline's line
    else:
        assert out.data["reasons"] == [inactive["text"]]
        assert inactive["fix"] == f"start walflow: ./run.sh run {config}"
        out.finding("info", "health endpoint off (walflow.health.enabled: false)")
    assert "lag " in " ".join(out.levels("ok") + out.levels("info"))
    out.finding("ok", f"stream {names.stream}: 0 messages")  # NATS and the stream are fine
    assert out.data["databases"][0]["slot"]["holder"] is None
    assert out.data["databases"][0]["slot"]["lag_bytes"] > 0


@pytest.mark.slow
def test_status_and_check_change_nothing(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """Before the first start nothing exists; both commands say so and leave it so."""
    config = write_config(tmp_path, database, nats_srv, names, [
        {"name": "fresh", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}])
    out = status(config)
    assert out.code == 2
    out.finding("down", f"slot {names.slot} does not exist: PostgreSQL keeps no changes for walflow")
    out.finding("down", f"publication {names.publication} does not exist: nothing is published")
    out.finding("degraded", f"stream {names.stream} does not exist: walflow creates it when it starts")
    checked = run_both("check", config)
    assert checked.code == 0, checked.text
    checked.finding("pass", f"slot {names.slot} does not exist: walflow creates it at start")
    checked.finding("pass", f"stream {names.stream} does not exist: walflow creates it at start")
    with database.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s",
                            [names.database]).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
    assert not stream_exists(nats_srv.url, names.stream)


@contextlib.contextmanager
def _hung_recvlogical(database: Database, names: TestNames) -> Iterator[int]:
    """A stopped ``pg_recvlogical`` on the test's slot, which the server never times out: its walsender's PID."""
    _create_slot(database, names)
    with hung_pg_recvlogical(database, "0") as pid:
        yield pid


@pytest.mark.slow
def test_a_slot_held_by_a_hung_pg_recvlogical(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = health_on(setup_events(database, names, nats_srv, tmp_path), free_port())  # and walflow not running
    with _hung_recvlogical(database, names) as pid:
        out = status(config)
        checked = run_both("check", config)
    assert out.code == 2 and out.data["verdict"] == "down"
    held = out.finding("down", f"slot held by PID {pid} (pg_recvlogical, 127.0.0.1, last reply ")
    assert held["text"].endswith("ago): not walflow, so walflow cannot read the slot; it retries until the slot is "
                                 "released")
    assert held["fix"] == (f"if pg_recvlogical should not read slot {names.slot}: SELECT pg_terminate_backend({pid}); "
                           "(walflow takes the slot at its next attempt)")
    stopped = out.finding("down", "pipeline not running")
    assert out.data["reasons"] == [held["text"], stopped["text"]]  # the cause first: walflow could not read it anyway
    assert out.text.startswith(f"walflow status: DOWN — slot held by PID {pid} (pg_recvlogical, ")
    holder = out.data["databases"][0]["slot"]["holder"]
    assert holder["pid"] == pid and holder["application_name"] == "pg_recvlogical" and holder["walsender"]
    assert checked.code == 0  # a holder is no misconfiguration: walflow would wait for it
    checked.finding("warn", f"slot {names.slot} is held by PID {pid} (pg_recvlogical")


@pytest.fixture(scope="module")
def small_wal_server() -> Iterator[PostgresServer]:
    settings = {"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"}
    with PostgresServer(settings=settings) as server:
        yield server


@pytest.mark.slow
def test_an_invalidated_slot(small_wal_server: PostgresServer, nats_srv: Nats, names: TestNames, tmp_path: Path) -> None:
    database = Database(small_wal_server, names)
    database.create()
    try:
        with database.connect() as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, payload text)")
            conn.execute(f"CREATE PUBLICATION {names.publication} FOR ALL TABLES")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
            _lose_the_slot(conn, names.slot)
        sink = {"name": "events", "destination": {"subject_prefix": names.subject_prefix,
                                                  "stream": {"name": names.stream}}}
        config = write_config(tmp_path, database, nats_srv, names, [sink])
        out = status(config)
        checked = run_both("check", config)
    finally:
        database.drop()
    fix = (f"SELECT pg_drop_replication_slot('{names.slot}'); then start walflow (./run.sh run {config}), which "
           f"creates the slot again; then backfill what the slot lost: walflow backfill {config} --sink events "
           "--table public.t")
    assert out.code == 2 and out.data["verdict"] == "down"
    lost = out.finding("down", f"wal_status lost: PostgreSQL invalidated slot {names.slot} (the WAL it needed is "
                               "removed), so the changes after its confirmed LSN ")
    assert lost["fix"] == fix
    assert out.data["databases"][0]["slot"]["wal_status"] == "lost"
    assert checked.code == 1 and checked.data["verdict"] == "fail"
    assert checked.finding("fail", f"slot {names.slot} was invalidated by PostgreSQL (wal_status lost)")["fix"] == fix


def _lose_the_slot(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> None:
    """Write well past max_slot_wal_keep_size; a checkpoint then removes the WAL the slot needs."""
    for i in range(6):
        conn.execute("INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(%s::int, %s::int) g",
                     [i * 20000, i * 20000 + 19999])
        conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
    assert conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone() == (
        "lost",)


@pytest.mark.slow
def test_nats_down_under_a_running_pipeline_then_the_slot_stuck(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """At once: NATS unreachable is the one reason. Half a minute on, with changes waiting, the slot
    says since when its confirmed LSN has stood still (the first seed's question)."""
    config = setup_events(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        nats_srv.stop()
        writer = Inserter(database.dsn, rate=50)
        try:
            writer.start()
            out = status(config)
            wait_for(lambda: _flush_lag(database) > STUCK_AFTER + 1, timeout=120, interval=1,
                     what="the confirmed LSN to stand still for long", check=lambda: assert_running(proc))
            stuck = status(config)
        finally:
            writer.stop.set()
            writer.join(10)
            nats_srv.start()
    assert out.code == 2 and out.data["verdict"] == "down"
    unreachable = out.finding("down", f"NATS unreachable at {nats_srv.address}: ")
    assert out.data["reasons"] == [unreachable["text"]]  # the one thing wrong
    assert "Connect call failed" in unreachable["text"] or "refused" in unreachable["text"].lower()
    assert unreachable["fix"].startswith("start NATS there, or correct the sink's destination")
    out.finding("ok", "read by walflow: PID ")  # replication itself is fine
    assert out.data["sinks"][0]["nats_reachable"] is False

    assert stuck.code == 2  # still down: NATS
    stall = stuck.finding("degraded", " and growing, confirmed LSN ")
    assert stall["text"].startswith("slot lag ") and " stuck since " in stall["text"]
    assert stall["text"].endswith("walflow reads but JetStream does not acknowledge (see the sinks)")
    slot = stuck.data["databases"][0]["slot"]
    assert slot["trend"]["stuck"] and slot["trend"]["stuck_for_s"] > STUCK_AFTER
    assert slot["trend"]["lag_change_bytes_per_s"] > 0


def _flush_lag(database: Database) -> float:
    with database.connect() as conn:
        row = conn.execute("SELECT extract(epoch FROM flush_lag)::float8 FROM pg_stat_replication "
                           "WHERE application_name LIKE 'walflow:%'").fetchone()
    return float(str(row[0])) if row and row[0] is not None else 0.0


def test_a_database_that_does_not_answer(names: TestNames, nats_srv: Nats, tmp_path: Path, database: Database) -> None:
    config = edit(setup_events(database, names, nats_srv, tmp_path),
                  lambda data: data["databases"][0].update(port=free_port()))
    out = status(config, "--sample", "0")
    assert out.code == 2
    down = out.finding("down", "cannot reach database 'shop' at 127.0.0.1:")
    assert down["fix"].startswith("check that PostgreSQL runs there")


def _on_a_terminal(*args: str | Path, env: dict[str, str]) -> tuple[int, str]:
    """``walflow ARGS`` with its stdout on a pseudo-terminal: the exit status and what it showed."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([str(WALFLOW), *map(str, args)], stdout=follower, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env}, timeout=60, check=False)
    finally:
        os.close(follower)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once everything written is read
        while chunk := os.read(leader, 65536):
            shown += chunk
    os.close(leader)
    assert done.stderr == ""
    return done.returncode, shown.decode()


def test_colour_on_a_terminal_unless_no_color(tmp_path: Path) -> None:
    config = tmp_path / "walflow.yaml"  # nothing answers: quick, and down
    config.write_text(yaml.safe_dump({
        "databases": [{"name": "app", "hostname": "127.0.0.1", "port": free_port(), "database": "app",
                       "slot": {"name": "s"}, "publication": {"name": "p"}}],
        "sinks": [{"name": "out", "database": "app",
                   "destination": {"type": "nats", "host": "127.0.0.1", "port": free_port()}}]}))
    code, shown = _on_a_terminal("status", config, "--sample", "0", env={"NO_COLOR": ""})
    assert code == 2 and shown.startswith("walflow status: \x1b[1;31mDOWN\x1b[0m — ")
    assert "\x1b[1;31mDOWN    \x1b[0m  cannot reach database 'app'" in shown
    code, plain = _on_a_terminal("status", config, "--sample", "0", env={"NO_COLOR": "1"})
    assert code == 2 and "\x1b[" not in plain and plain.startswith("walflow status: DOWN — ")


@pytest.mark.slow
def test_a_running_backfill_shows_with_its_progress(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = health_on(setup_events(database, names, nats_srv, tmp_path), free_port())
    with database.connect() as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
        conn.execute("INSERT INTO big SELECT g, repeat('b', 200) FROM generate_series(1, 400000) g")
        conn.execute("ANALYZE big")  # the estimate
        conn.execute(f"ALTER PUBLICATION {names.publication} ADD TABLE big")
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: verdict(config) == "healthy", timeout=60, interval=1, what="a healthy status",
                 check=lambda: assert_running(proc))
        requested = walflow("backfill", config, "--sink", "g", "--table", "public.big")
        assert requested.returncode == 0, requested.stderr
        backfill = requested.stdout.strip()
        shown: list[str] = []

        def running() -> bool:
            out = run_both("status", config, "--sample", "0")
            shown[:] = [f["text"] for f in out.findings if f["text"].startswith(f"backfill {backfill} (running)")]
            return bool(shown)

        wait_for(running, timeout=60, interval=0.2, what="the backfill in the status", check=lambda: assert_running(proc))
    assert shown[0].startswith(f"backfill {backfill} (running): public.big → g: "), shown
    assert "/~400,000 rows, " in shown[0] and " rows/s" in shown[0]
