from __future__ import annotations

from pathlib import Path

import pytest

from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.pipeline import assert_running, pipeline, stored, write_config

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)


def test_initial_backfill_smoke(database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str,
                                tmp_path: Path) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 2000) g")
    sink = {"name": f"bf-{names.stream}", "initial_backfill": True,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink], backfill={"initial_chunk_rows": 300})
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) >= 2000, timeout=60, what="reads",
                 check=lambda: assert_running(proc))
        print(proc.log_tail(50))
    events = stored(nats_srv.url, names.stream)
    assert sorted(e.event["record"]["id"] for e in events) == list(range(1, 2001))
    assert {e.event["action"] for e in events} == {"read"}
