"""Heartbeats and the health endpoint with the real pipeline."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from embedded import PostgresServer, wait_for
from embedded._process import free_port
from tests.harness import Database, Nats, Postgres, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, pipeline, write_config

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)


def _ready(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def test_heartbeats_move_an_idle_slot_and_readiness_follows_replication(
    pg: Postgres, database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    if not isinstance(pg, PostgresServer):
        pytest.skip("needs the embedded PostgreSQL")
    with database.connect() as conn:
        conn.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
    port = free_port()
    sink = {"name": "hb", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink],
                          health={"enabled": True, "port": port}, replication={"heartbeat_interval_ms": 500})
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _ready(port)[0] == 200 and bool(_ready(port)[1]["slots"]), timeout=60, what="readiness",
                 check=lambda: assert_running(proc))
        (slot,) = _ready(port)[1]["slots"]
        assert slot["slot"] == names.slot

        def heartbeat_round_trips() -> bool:
            # the first round trip may include the pipeline's own startup on a busy machine
            (slot,) = _ready(port)[1]["slots"]
            return bool(slot["connected"]) and (slot["heartbeat_rtt_ms"] or 10**9) < 1000

        wait_for(heartbeat_round_trips, timeout=30, what="a heartbeat round trip under 1 s",
                 check=lambda: assert_running(proc))
        first = _confirmed(database)
        wait_for(lambda: _confirmed(database) > first, timeout=30, what="heartbeats to move the idle slot")
        pg.stop()
        wait_for(lambda: _ready(port)[0] == 503, timeout=30, what="not ready while Postgres is down",
                 check=lambda: assert_running(proc))
        assert _ready(port)[1]["slots"][0]["connected"] is False
        pg.start()
        wait_for(lambda: _ready(port)[0] == 200, timeout=60, what="ready again", check=lambda: assert_running(proc))
        assert _slot_active(database)
