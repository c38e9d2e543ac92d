"""Bad data and configuration that changes under a running pipeline: each has a policy, none loses silently
(values too large to publish: ``test_sizes.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, pipeline, stored
from tests.workload import setup_events

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)


def test_a_stream_deleted_while_running_is_created_again(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
        with database.connect() as conn:
            conn.execute("INSERT INTO events VALUES (1, 'before')")
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) == 1, timeout=30, what="the first event")

        async def delete() -> None:
            nc = await nats.connect(nats_srv.url)
            await nc.jetstream().delete_stream(names.stream)
            await nc.close()

        asyncio.run(delete())
        with database.connect() as conn:
            conn.execute("INSERT INTO events VALUES (2, 'after')")
        end = database.current_lsn()
        wait_for(lambda: _confirmed(database) >= end, timeout=60, what="delivery into a new stream",
                 check=lambda: assert_running(proc))
        log = proc.log_tail(100)
    assert [e.event["record"]["id"] for e in stored(nats_srv.url, names.stream)] == [2]
    assert f"stream '{names.stream}' no longer exists; setting it up again" in log

