"""A masked key never reaches the WAL through a backfill's watermarks.

The watermarks are logical messages: whoever may read a slot (or the WAL files) reads them,
whatever the sink publishes. A second slot, with ``test_decoding``, is that reader here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from embedded import wait_for
from tests.backfill.helpers import sink
from tests.harness import Database, Nats, TestNames
from tests.pipeline import assert_running, pipeline, stored, write_config

pytestmark = pytest.mark.slow  # it runs the pipeline (python -m bytewax.run)

CANARY = "canary-4111"
ROWS = 60


def test_a_backfill_of_a_masked_key_writes_no_key_value_into_any_logical_message(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    reader = f"{names.slot}_reader"
    with database.connect() as conn:
        conn.execute("CREATE TABLE cards (number text PRIMARY KEY, holder text)")
        conn.execute("INSERT INTO cards SELECT %s || '-' || lpad(g::text, 4, '0'), 'holder ' || g "
                     "FROM generate_series(1, %s) g", [CANARY, ROWS])
        # from here on it sees every logical message, as a role reading the WAL would
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [reader])
    masked = sink(names, initial_backfill=True,
                  tables=[{"name": "public.cards", "columns": {"mask": {"number": "redact"}}}])
    config = write_config(tmp_path, database, nats_srv, names, [masked], backfill={"initial_chunk_rows": 7},
                          mask_secret="read-id-key")  # read ids hide a masked key behind a keyed hash
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) >= ROWS, timeout=90, what="the backfill's reads",
                 check=lambda: assert_running(proc))
    events = stored(nats_srv.url, names.stream)
    assert sorted(e.event["record"]["holder"] for e in events) == sorted(f"holder {i}" for i in range(1, ROWS + 1))
    assert {e.event["record"]["number"] for e in events} == {"[redacted]"}
    with database.connect() as conn:
        decoded = [str(data) for (data,) in conn.execute(
            "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", [reader]).fetchall()]
    watermarks = [line for line in decoded if "prefix: walflow.backfill" in line]
    # several chunks, each low watermark after the first one carrying where its chunk starts
    assert sum('"kind":"low"' in line and '"sealed":"' in line for line in watermarks) >= 2, watermarks
    assert [line for line in decoded if CANARY in line] == []
