"""Logical messages are input: nothing a database role writes with ``pg_logical_emit_message``
stops walflow, holds its slot back, or publishes a table a sink does not read (issue 23).

Every role may call ``pg_logical_emit_message``, and pgoutput hands every message to the
slot. Each test writes its poison while changes flow, through the real pipeline
(``python -m bytewax.run dataflows.cdc``), and asserts on what reached the stream, where the
slot stands and what ``walflow_ignored_messages_total`` counted.
"""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from connectors.postgres.signals import BackfillRequest, Signal, emit
from embedded import wait_for
from embedded._process import free_port
from tests.backfill.helpers import log_lines, walflow
from tests.harness import Database, Nats, TestNames, slot_active, slot_confirmed
from tests.pipeline import assert_running, pipeline, stored, write_config
from tests.workload import Inserter

pytestmark = pytest.mark.slow

CANARY = "canary-7f3e9b1d"


def _ignored(port: int) -> dict[tuple[str, str], float]:
    """``walflow_ignored_messages_total`` by (prefix, reason)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.labels["prefix"], s.labels["reason"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "walflow_ignored_messages_total"}


def _config(database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path, port: int,
            backfill: dict[str, Any] | None = None, **sink: Any) -> Path:
    """``events`` and ``json_web_tokens`` (holding the canary) in the publication; one sink ``g``
    that reads ``events`` only (the docs' own example of an excluded table)."""
    with database.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, payload text)")
        conn.execute("CREATE TABLE json_web_tokens (id int PRIMARY KEY, token text)")
        conn.execute("INSERT INTO json_web_tokens VALUES (1, %s)", [CANARY])
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE events, json_web_tokens")
    entry = {"name": "g", "source": {"exclude_tables": ["public.json_web_tokens"]}, **sink,
             "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    return write_config(tmp_path, database, nats_srv, names, [entry],
                        health={"enabled": True, "host": "127.0.0.1", "port": port}, backfill=backfill or {})


def _emit(conn: psycopg.Connection[Any], prefix: str, content: bytes | str, transactional: bool = True) -> None:
    conn.execute("SELECT pg_logical_emit_message(%s, %s, %s::bytea)",
                 [transactional, prefix, content.encode() if isinstance(content, str) else content])


def _poisons(slot: str) -> list[tuple[str, bytes, bool]]:
    """The issue's poisons and a few hundred random ones under walflow's prefixes (seeded)."""
    # for a sink the config lacks: a random change that leaves it valid is refused, not run
    good = json.loads(Signal("request", slot, BackfillRequest("b0", "nobody", "public.events")).encode())
    poisons: list[tuple[str, bytes, bool]] = [
        ("walflow.heartbeat", b"[]", False),  # the reproduction: exited 1 and never came back
        ("walflow.heartbeat", b"[]", True),
        ("walflow.heartbeat", b'{"slot": "%s", "sent_us": "soon"}' % slot.encode(), True),
        ("walflow.heartbeat", b"[" * 510 + b"]" * 510, True),  # deep, within its size limit
        ("walflow.heartbeat", b"x" * 5000, True),  # over its size limit
        ("walflow.backfill", json.dumps({**good, "request": {**good["request"], "id": [1]}}).encode(), True),
        ("walflow.backfill", json.dumps({**good, "rows": "x"}).encode(), True),
        ("walflow.backfill", json.dumps(good).encode(), False),  # not in a transaction
        ("walflow.backfill", b"\xff" * 100_000, True),
        ("sequin:transaction_annotations.set", b"{" * 70_000, True),
        ("walflow.heartbeat\x01", b"[]", True),  # not walflow's: passed over
    ]
    rng = random.Random(23)
    for _ in range(300):
        prefix = rng.choice(["walflow.heartbeat", "walflow.backfill"])
        if rng.random() < 0.5:
            content = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
        else:  # a valid signal with one field replaced by something else
            field = rng.choice(["v", "kind", "slot", "request", "run", "chunk", "after", "rows", "estimate", "last"])
            other = rng.choice([None, -1, 2**70, 1.5, "x", [], {}, [None], {"a": 1}, True, "\u0000", "\x1b[2J"])
            content = json.dumps({**good, field: other}).encode()
        poisons.append((prefix, content, rng.random() < 0.8))
    return poisons


def test_poisoned_logical_messages_are_ignored_counted_and_passed(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    port = free_port()
    config = _config(database, names, nats_srv, tmp_path, port)
    poisons = _poisons(names.slot)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        inserter = Inserter(database.dsn, rate=200)
        inserter.start()
        try:
            with database.connect() as conn:
                for prefix, content, transactional in poisons:
                    _emit(conn, prefix, content, transactional)
            poisoned_at = database.current_lsn()
            wait_for(lambda: inserter.count > 300, timeout=60, what="changes after the poison",
                     check=lambda: assert_running(proc))
        finally:
            inserter.stop.set()
            inserter.join()
        end = database.current_lsn()
        wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot to pass the poison",
                 check=lambda: assert_running(proc))
        ignored = _ignored(port)
        log = proc.log_tail(400)
    assert slot_confirmed(database) > poisoned_at
    events = stored(nats_srv.url, names.stream)
    assert sorted(e.event["record"]["id"] for e in events) == list(range(1, inserter.count + 1)), "exactly once"
    assert {e.event["action"] for e in events} == {"insert"}
    assert ignored[("walflow.heartbeat", "malformed")] >= 4
    assert ignored[("walflow.heartbeat", "too_large")] == 1
    assert ignored[("walflow.backfill", "malformed")] >= 4
    assert ignored[("walflow.backfill", "too_large")] == 1
    assert ignored[("sequin:transaction_annotations.set", "too_large")] == 1
    assert sum(ignored.values()) >= 150  # the random ones: about half are malformed under each prefix
    warnings = [line for line in log.splitlines() if "ignored a logical message" in line]
    assert 0 < len(warnings) <= len(ignored), "one warning per prefix and reason, not one per message"
    assert "Traceback" not in log


def test_a_forged_backfill_request_cannot_read_a_table_the_sink_does_not_read(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """The request is well-formed, so only the config can refuse it: the canary never reaches the stream."""
    port = free_port()
    config = _config(database, names, nats_srv, tmp_path, port, backfill={"max_pending": 1})
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        forged = BackfillRequest.new("g", "public.json_web_tokens")
        with database.connect() as conn:
            emit(conn, Signal("request", names.slot, forged))
            emit(conn, Signal("request", names.slot, BackfillRequest.new("nobody", "public.events")))
            conn.execute("INSERT INTO events VALUES (1, 'after')")
        end = database.current_lsn()
        wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot to pass the requests",
                 check=lambda: assert_running(proc))
        ignored = _ignored(port)
    events = stored(nats_srv.url, names.stream)
    assert [e.event["record"]["id"] for e in events] == [1]
    assert all(CANARY.encode() not in e.data and "json_web_tokens" not in e.subject for e in events)
    assert ignored[("walflow.backfill", "refused")] == 2
    assert log_lines(proc, "does not read 'public.json_web_tokens'")


def test_a_sinks_pending_backfills_are_capped(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    port = free_port()
    config = _config(database, names, nats_srv, tmp_path, port, backfill={"max_pending": 2, "max_concurrent": 1})
    with database.connect() as conn:
        conn.execute("INSERT INTO events SELECT g, 'x' FROM generate_series(1, 5) g")
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        with database.connect() as conn:
            for _ in range(5):
                emit(conn, Signal("request", names.slot, BackfillRequest.new("g", "public.events")))
        wait_for(lambda: len(log_lines(proc, "backfill", "done,")) == 2, timeout=60, what="the two backfills",
                 check=lambda: assert_running(proc))
        end = database.current_lsn()
        wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot to pass the backfills",
                 check=lambda: assert_running(proc))
        ignored = _ignored(port)
    reads = [e for e in stored(nats_srv.url, names.stream) if e.event["action"] == "read"]
    assert len(reads) == 10 and ignored[("walflow.backfill", "too_many")] == 3


def test_with_a_secret_only_signed_signals_start_backfills(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """``walflow.backfill.secret``: `walflow backfill` with the config signs its request and the
    runner its watermarks (the backfill runs through); an unsigned request is refused."""
    port = free_port()
    config = _config(database, names, nats_srv, tmp_path, port, backfill={"secret": "s3cret-key"})
    with database.connect() as conn:
        conn.execute("INSERT INTO events SELECT g, 'x' FROM generate_series(1, 3) g")
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        with database.connect() as conn:
            emit(conn, Signal("request", names.slot, BackfillRequest.new("g", "public.events")))  # unsigned
        done = walflow("backfill", config, "--sink", "g", "--table", "public.events")
        assert done.returncode == 0, done.stderr
        signed = done.stdout.strip()
        wait_for(lambda: bool(log_lines(proc, f"backfill {signed} ", "done,")), timeout=60, what="the signed backfill",
                 check=lambda: assert_running(proc))
        end = database.current_lsn()
        wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot", check=lambda: assert_running(proc))
        ignored = _ignored(port)
    reads = [e for e in stored(nats_srv.url, names.stream) if e.event["action"] == "read"]
    assert sorted(e.event["record"]["id"] for e in reads) == [1, 2, 3]
    assert ignored == {("walflow.backfill", "unauthenticated"): 1.0}
