"""Delivery guarantees with the real pipeline: NATS outages, idle slots, replays past the duplicate window.

``WALFLOW_OUTAGE_SECONDS`` (default 15) and ``WALFLOW_IDLE_SECONDS`` (default 15) make the
long versions (60 s each) for local runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats
import pytest

from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, pipeline, stored
from tests.workload import OUTAGE, Inserter, setup_events

IDLE = float(os.environ.get("WALFLOW_IDLE_SECONDS", "15"))


def _last_seq(url: str, stream: str) -> int:
    async def read() -> int:
        nc = await nats.connect(url)
        try:
            return int((await nc.jetstream().stream_info(stream)).state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_nats_outage_under_load_holds_the_slot_and_loses_nothing(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        writer = Inserter(database.dsn, rate=500)
        writer.start()
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) > 500, timeout=60, what="traffic",
                 check=lambda: assert_running(proc))
        last_before = _last_seq(nats_srv.url, names.stream)  # taken just before the stop: nothing can land after
        nats_srv.stop()
        samples = []
        deadline = time.monotonic() + OUTAGE
        while time.monotonic() < deadline:
            samples.append(_confirmed(database))
            assert_running(proc)
            time.sleep(0.5)  # sampling the slot during the outage
        nats_srv.start()
        writer.stop.set()
        writer.join(10)
        end = database.current_lsn()
        wait_for(lambda: _confirmed(database) >= end, timeout=120, what="the slot to catch up",
                 check=lambda: assert_running(proc))
    events = stored(nats_srv.url, names.stream)
    ids = [e.event["record"]["id"] for e in events]
    assert sorted(ids) == list(range(1, writer.count + 1))  # all of them, each once
    after = [e for e in events if e.seq > last_before]
    assert after, "nothing was published after the outage"
    # while NATS was away the slot never moved past a change it had not acknowledged
    held = max(samples)
    assert all(e.event["metadata"]["commit_lsn"] >= held for e in after)
    assert samples[-1] == samples[len(samples) // 2]  # and it stood still


@pytest.mark.slow
def test_idle_publication_on_a_busy_server_keeps_the_slot_close(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        lags = []
        with database.connect() as conn:
            started = time.monotonic()
            next_sample = started + 3  # warm-up
            statements = 0
            while time.monotonic() - started < IDLE:
                conn.execute("INSERT INTO busy (payload) SELECT repeat('y', 200) FROM generate_series(1, 50)")
                statements += 1
                ahead = statements / 100 - (time.monotonic() - started)  # ~100 statements, ~2 MB of WAL a second
                if ahead > 0:
                    time.sleep(ahead)  # a load generator's pacing, not synchronisation
                if time.monotonic() >= next_sample:
                    row = conn.execute(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), pg_current_wal_lsn() "
                        "FROM pg_replication_slots WHERE slot_name = %s", [names.slot]
                    ).fetchone()
                    assert row is not None
                    lags.append(int(str(row[0])))
                    next_sample += 1
        assert_running(proc)
    written_mb = database.current_lsn() / 1e6
    assert len(lags) >= 5
    print(f"idle publication: slot lag max {max(lags) / 1e6:.2f} MB, median {sorted(lags)[len(lags) // 2] / 1e6:.2f} MB"
          f" with the busy table writing ~2 MB of WAL a second (server WAL at {written_mb:.0f} MB)")
    assert max(lags) < 4 * 1024 * 1024, f"slot lag reached {max(lags)} bytes (of ~{written_mb:.0f} MB WAL)"


@pytest.mark.slow
def test_a_replay_after_the_duplicate_window_publishes_nothing_twice(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path, duplicate_window_ms=100)
    with pipeline(config, "-s", "10") as proc:  # long epochs: stored in JetStream long before confirmed
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        with database.connect() as conn:
            for i in range(1, 51):
                conn.execute("INSERT INTO events VALUES (%s, 'x')", [i])
        end = database.current_lsn()
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) == 50, timeout=60, what="the 50 events",
                 check=lambda: assert_running(proc))
        assert _confirmed(database) < end  # not confirmed yet: a restart will replay them
        proc.kill()
    time.sleep(0.3)  # let the stream's 100 ms duplicate window pass: JetStream will not dedupe
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _confirmed(database) >= end, timeout=60, what="the replay", check=lambda: assert_running(proc))
        log = proc.log_tail(100)
    events = stored(nats_srv.url, names.stream)
    assert sorted(e.event["record"]["id"] for e in events) == list(range(1, 51))
    assert "50 change(s) to be replayed are already in the stream" in log
