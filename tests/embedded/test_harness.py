"""The embedded servers: real PostgreSQL with logical decoding, real JetStream, clean teardown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import nats
import psycopg
import pytest
from nats.js.api import StreamConfig

from embedded import NatsServer, PostgresNotFound, PostgresServer, ServerError, wait_for
from embedded._process import sweep_stale_dirs
from tests.harness import Database, Nats, Postgres, TestNames, alive, children_of
from tests.pipeline import ROOT


def test_postgres_slot_streams_pgoutput(database: Database, names: TestNames) -> None:
    with database.connect() as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE orders")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
        conn.execute("INSERT INTO orders VALUES (1, 'new')")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s)",
            [names.slot, names.publication],
        ).fetchall()
    messages = [bytes(data) for (data,) in rows]  # type: ignore[call-overload]
    assert [m[:1] for m in messages] == [b"B", b"R", b"I", b"C"]
    assert b"new" in messages[2]


def test_replication_connection_is_accepted(database: Database) -> None:
    with psycopg.connect(database.dsn, autocommit=True, replication="database") as conn:
        _, _, xlogpos, dbname = conn.execute("IDENTIFY_SYSTEM").fetchone()  # type: ignore[misc]
    assert dbname == database.names.database
    assert "/" in xlogpos


async def _publish_and_read(url: str, stream: str, subject: str) -> tuple[int, bytes, str | None]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{subject.split('.')[0]}.>"]))
        ack = await js.publish(subject, b'{"id": 1}', headers={"Nats-Msg-Id": "k1"})
        msg = await js.get_msg(stream, ack.seq)
        return ack.seq, msg.data or b"", (msg.headers or {}).get("Nats-Msg-Id")
    finally:
        await nc.close()


def test_jetstream_stream_accepts_publishes(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> None:
    seq, data, msg_id = asyncio.run(_publish_and_read(nats_srv.url, stream_cleanup, f"{names.subject_prefix}.a.b"))
    assert (seq, data, msg_id) == (1, b'{"id": 1}', "k1")


def test_postgres_restart_keeps_data_and_port(pg: Postgres, database: Database) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (42)")
    old_dsn = database.dsn
    pg.kill()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(old_dsn, connect_timeout=2)
    pg.start()  # crash recovery after SIGKILL
    assert database.dsn == old_dsn
    with database.connect() as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(42,)]
    pg.restart()
    with database.connect() as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)


async def _across_restart(server: NatsServer, names: TestNames) -> tuple[int, int]:
    """A client publishes, the server restarts under it, the client reconnects by itself: (the
    stream's messages it then reads, its reconnects)."""
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await nats.connect(server.url, reconnected_cb=on_reconnect, reconnect_time_wait=0.1,
                            max_reconnect_attempts=-1)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=names.stream, subjects=[f"{names.subject_prefix}.>"]))
        await js.publish(f"{names.subject_prefix}.x", b'{"id": 1}')
        await asyncio.to_thread(server.restart)
        await asyncio.wait_for(reconnected.wait(), 30)
        return (await js.stream_info(names.stream)).state.messages, nc.stats["reconnects"]
    finally:
        await nc.close()


@pytest.mark.servers
def test_nats_restart_keeps_stream(names: TestNames) -> None:
    """restart (SIGTERM, then the same ports and store) keeps the stream, with a client connected
    throughout. On a server of its own: the session's also holds what every earlier test of the
    worker left on it (their streams, a client one left open), which this test is not about."""
    with NatsServer() as server:
        before = (server.port, server.http_port, server.base, server.pid)
        assert asyncio.run(_across_restart(server, names)) == (1, 1)
        assert (server.port, server.http_port, server.base) == before[:3] and server.pid != before[3]


@pytest.mark.servers
def test_a_nats_server_that_never_becomes_ready_says_why() -> None:
    """A stream directory JetStream cannot recover (here one without its meta.inf) keeps /healthz at
    503 for good: the timeout names the probe's last answer and the log's warning about it, not
    the lines the probe itself makes the server log."""
    with NatsServer() as server:
        assert server.base is not None
        server.stop()
        (server.base / "jetstream" / "jetstream" / "$G" / "streams" / "BROKEN").mkdir(parents=True)
        with pytest.raises(ServerError) as info:
            server.start(timeout=3)
        assert not server.running  # killed, not left behind
    message = str(info.value)
    assert message.startswith("timed out after 3s waiting for nats to become ready (PID ")
    assert "/healthz answered 503: " in message and "BROKEN' could not be recovered" in message
    assert "Missing stream metafile" in message and "Healthcheck failed" not in message


@pytest.mark.servers
def test_close_leaves_no_process_or_directory() -> None:
    pg, nc = PostgresServer().start(), NatsServer().start()
    assert pg.pid is not None and nc.pid is not None and pg.base is not None and nc.base is not None
    with psycopg.connect(pg.dsn()):  # a backend process exists while connected
        processes = {pg.pid, nc.pid, *children_of(pg.pid)}
    assert len(processes) > 2  # the postmaster has its background workers
    dirs = [pg.base, nc.base]
    pg.close()
    nc.close()
    assert [pid for pid in processes if alive(pid)] == []
    assert [d for d in dirs if d.exists()] == []


_HOLDER = textwrap.dedent(
    """
    import json, signal, sys, time
    # Ctrl-C as a terminal delivers it, even when the test process inherited SIGINT ignored
    # (a child keeps an ignored signal ignored across exec: the suite's parallel workers)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from embedded import NatsServer, PostgresServer
    with PostgresServer() as pg, NatsServer() as nc:
        print(json.dumps({"pids": [pg.pid, nc.pid], "dirs": [str(pg.base), str(nc.base)]}), flush=True)
        time.sleep(600)
    """
)


def _start_holder() -> tuple[subprocess.Popen[str], list[int], list[Path]]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    return proc, info["pids"], [Path(d) for d in info["dirs"]]


@pytest.mark.servers
def test_ctrl_c_stops_servers_and_removes_directories() -> None:
    proc, pids, dirs = _start_holder()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert [pid for pid in pids if alive(pid)] == []
    assert [d for d in dirs if d.exists()] == []


@pytest.mark.servers
def test_killed_parent_takes_servers_with_it() -> None:
    """kill -9 of the test process: the kernel kills the servers; the next run sweeps the dirs."""
    proc, pids, dirs = _start_holder()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=30, what="servers to die with their parent")
    assert all(d.exists() for d in dirs)  # nobody could clean up...
    sweep_stale_dirs()
    assert [d for d in dirs if d.exists()] == []  # ...until the next run swept them


def test_missing_postgres_binaries_say_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("WALFLOW_PG_BINDIR", raising=False)
    monkeypatch.setattr("embedded.postgres.glob.glob", lambda pattern: [])
    with pytest.raises(PostgresNotFound) as info:
        PostgresServer()
    assert "apt-get install postgresql" in str(info.value)
    assert "WALFLOW_PG_BINDIR" in str(info.value)
