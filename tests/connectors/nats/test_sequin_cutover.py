"""The real pipeline with ``msg_id: sequin`` in a Sequin user's stream: what a cutover relies on.

The stream exists already (Sequin's, on ``<prefix>.>``, under its own name) and the config
names none: walflow publishes into it, with Sequin's ``Nats-Msg-Id`` — base64 of
``"<commit_lsn>:<commit_idx>"`` — and a restart past the duplicate window publishes
nothing twice, the replay scan reading Sequin-form ids back by their subjects.
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import nats
import pytest
from nats.js.errors import NotFoundError

from embedded import wait_for
from tests.harness import Database, Nats, TestNames, delete_stream
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import Stored, assert_running, pipeline, stored, write_config

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)


def _sequin_stream(url: str, name: str, prefix: str) -> None:
    """The stream a Sequin user already has: their own name, all of the prefix, a 100 ms
    duplicate window (so that JetStream cannot hide a second copy)."""

    async def create() -> None:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            await nc.jetstream().add_stream(name=name, subjects=[f"{prefix}.>"], duplicate_window=0.1)
        finally:
            await nc.close()

    asyncio.run(create())


def _exists(url: str, name: str) -> bool:
    async def look() -> bool:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            await nc.jetstream().stream_info(name)
        except NotFoundError:
            return False
        finally:
            await nc.close()
        return True

    return asyncio.run(look())


def _sequin_key(event: Stored) -> str:
    metadata = event.event["metadata"]
    return base64.b64encode(f"{metadata['commit_lsn']}:{metadata['commit_idx']}".encode()).decode()


def test_sequin_ids_in_a_sequin_stream_and_a_replay_that_publishes_nothing_twice(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, payload text)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE events")
    _sequin_stream(nats_srv.url, names.stream, names.subject_prefix)
    sink = {"name": "g", "destination": {"subject_prefix": names.subject_prefix, "msg_id": "sequin"}}  # no stream name
    config = write_config(tmp_path, database, nats_srv, names, [sink])
    try:
        with pipeline(config, "-s", "10") as proc:  # long epochs: stored in JetStream long before confirmed
            wait_for(lambda: _slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
            with database.connect() as conn:
                for i in range(1, 41):
                    conn.execute("INSERT INTO events VALUES (%s, 'x')", [i])
                with conn.transaction():  # several changes of one transaction: commit_idx counts them
                    for i in range(41, 51):
                        conn.execute("INSERT INTO events VALUES (%s, 'x')", [i])
            end = database.current_lsn()
            wait_for(lambda: len(stored(nats_srv.url, names.stream)) == 50, timeout=60, what="the 50 events",
                     check=lambda: assert_running(proc))
            assert _confirmed(database) < end  # not confirmed yet: a restart will replay them
            proc.kill()
        first = stored(nats_srv.url, names.stream)
        assert [e.msg_id for e in first] == [_sequin_key(e) for e in first]
        assert all(e.event["metadata"]["idempotency_key"] == e.msg_id for e in first)
        in_transaction = [e for e in first if e.event["record"]["id"] > 40]  # stream order is per row only
        assert len({e.event["metadata"]["commit_lsn"] for e in in_transaction}) == 1  # the one transaction
        assert sorted(e.event["metadata"]["commit_idx"] for e in in_transaction) == list(range(10))
        assert len({e.msg_id for e in first}) == 50

        time.sleep(0.3)  # let the stream's 100 ms duplicate window pass: JetStream will not dedupe
        with pipeline(config, "-s", "1") as proc:
            wait_for(lambda: _confirmed(database) >= end, timeout=60, what="the replay",
                     check=lambda: assert_running(proc))
            with database.connect() as conn:
                conn.execute("INSERT INTO events VALUES (51, 'after')")
            wait_for(lambda: len(stored(nats_srv.url, names.stream)) >= 51, timeout=60, what="the new event",
                     check=lambda: assert_running(proc))
            log = proc.log_tail(200)
        events = stored(nats_srv.url, names.stream)
        assert sorted(e.event["record"]["id"] for e in events) == list(range(1, 52))
        assert [e.msg_id for e in events] == [_sequin_key(e) for e in events]
        assert "50 change(s) to be replayed are already in the stream" in log
        assert f"using JetStream stream '{names.stream}' as it is" in log
        assert not _exists(nats_srv.url, "WALFLOW")
    finally:
        delete_stream(nats_srv.url, "WALFLOW")  # should it have been created after all
