"""Test-side helpers for a 3-node NATS cluster (``embedded.nats.NatsCluster``): the config, a mixed
load whose ground truth is the table itself, and a watch that catches the slot ahead of the stream.

:func:`cluster` starts one for a test (closed after it); :func:`setup_counters` writes a config
whose sink publishes to every node (with the cluster's login) with an R3 stream; :class:`Counters` commits inserts
(``v = 0``) and updates (``v = v + 1``), so a row's changes are exactly once and in order iff
its events, in stream order, carry ``v = 0, 1, …, final v``; :class:`SlotWatch` samples the
slot's confirmed LSN and then the stream's last sequence (from its leader), so that
:func:`check_counters` can assert that every change below a sampled LSN was stored by then.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
import psycopg
from nats.errors import NoRespondersError
from nats.js.errors import ServiceUnavailableError

from embedded import wait_for
from embedded.nats import NatsCluster
from tests.harness import Database, TestNames, slot_confirmed
from tests.pipeline import Stored, stored, write_config


@contextmanager
def cluster() -> Iterator[NatsCluster]:
    """A fresh 3-node cluster for one test, closed (its stores removed) afterwards."""
    with NatsCluster(3) as nodes:
        yield nodes


def setup_counters(db: Database, names: TestNames, nodes: NatsCluster, tmp_path: Path, duplicate_window_ms: int = 1000,
                   **walflow: Any) -> Path:
    """Create ``counters (id int PRIMARY KEY, v int, payload text)`` and its publication; write a
    config with one sink ``c`` to an R3 stream on ``nodes`` (a duplicate window of 1 s unless
    given). Returns the config's path."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE counters (id int PRIMARY KEY, v int NOT NULL, payload text)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE counters")
    sink = {"name": "c", "destination": {**nodes.destination, "subject_prefix": names.subject_prefix,
                                         "stream": {"name": names.stream, "replicas": 3,
                                                    "duplicate_window_ms": duplicate_window_ms}}}
    return write_config(tmp_path, db, nodes.nodes[0], names, [sink], **walflow)


class Counters(threading.Thread):
    """Commits about ``rate`` changes a second until ``stop`` is set: an insert of a new row
    (``v = 0``) or ``v = v + 1`` on a random earlier one, half and half. The table is the truth."""

    def __init__(self, dsn: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate = dsn, rate
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(25)
        rows = 0
        started = time.monotonic()
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    if rows < 10 or rng.random() < 0.5:
                        rows += 1
                        conn.execute("INSERT INTO counters VALUES (%s, 0, repeat('x', 100))", [rows])
                    else:
                        conn.execute("UPDATE counters SET v = v + 1 WHERE id = %s", [rng.randint(1, rows)])
                    self.commits += 1
                    ahead = self.commits / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        self.stop.wait(ahead)  # a load generator's pacing, not synchronisation
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class SlotWatch(threading.Thread):
    """Every ``every`` seconds: the slot's confirmed LSN, then the stream's last sequence as its
    leader answers (a sample is skipped while the stream has no leader). Read in that order, a
    change the slot had passed must be stored at a sequence no higher than the one read after."""

    def __init__(self, db: Database, nodes: NatsCluster, stream: str, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.db, self.urls, self.stream, self.every = db, nodes.urls, stream, every
        self.stop = threading.Event()
        self.samples: list[tuple[int, int]] = []  # (confirmed LSN, last_seq read just after)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._watch())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    async def _watch(self) -> None:
        nc = await nats.connect(self.urls, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                allow_reconnect=True)
        try:
            js = nc.jetstream(timeout=1.0)
            while not self.stop.is_set():
                confirmed = slot_confirmed(self.db)
                try:
                    last = int((await js.stream_info(self.stream)).state.last_seq)
                except Exception:  # noqa: BLE001 - no leader, no stream yet, a node away: no sample
                    last = -1
                if last >= 0 and confirmed:
                    self.samples.append((confirmed, last))
                await asyncio.sleep(self.every)  # the sampling period
        finally:
            await nc.close()


def final_values(db: Database) -> dict[int, int]:
    """Each row's ``v`` in the table now: how many updates it had (so ``v + 1`` changes in all)."""
    with db.connect() as conn:
        return {int(str(i)): int(str(v)) for i, v in conn.execute("SELECT id, v FROM counters").fetchall()}


def check_counters(db: Database, nodes: NatsCluster, stream: str,
                   watch: SlotWatch) -> tuple[list[Stored], dict[int, list[int]]]:
    """Assert every committed change in the stream exactly once and the slot never seen ahead of
    the stream; returns the events and the rows whose changes are all there but out of order
    (their ``v`` values in stream order), for the caller to judge."""
    events = read_all(nodes, stream)
    truth = final_values(db)
    ids = [e.msg_id for e in events]
    assert len(set(ids)) == len(ids), f"{len(ids) - len(set(ids))} message id(s) stored twice"
    seen: defaultdict[int, list[int]] = defaultdict(list)
    for e in events:
        seen[int(e.event["record"]["id"])].append(int(e.event["record"]["v"]))
    wrong = {row: vs for row, vs in seen.items() if sorted(vs) != list(range(truth.get(row, -1) + 1))}
    missing = [row for row in truth if row not in seen]
    assert not wrong and not missing, (
        f"{len(wrong)} row(s) with changes missing or repeated (e.g. {list(wrong.items())[:3]}, final v "
        f"{[truth.get(r) for r in list(wrong)[:3]]}); {len(missing)} row(s) never published")
    out_of_order = {row: vs for row, vs in seen.items() if vs != sorted(vs)}
    assert len(events) == sum(v + 1 for v in truth.values())
    assert watch.samples, "the slot was never sampled"
    for confirmed, last in watch.samples:
        late = [e.seq for e in events if e.event["metadata"]["commit_lsn"] < confirmed and e.seq > last]
        assert not late, (f"the slot was confirmed at {confirmed} while change(s) below it were not yet stored "
                          f"(stored later at seq {late[:3]}; last_seq was {last})")
    return events, out_of_order


def read_all(nodes: NatsCluster, stream: str, timeout: float = 60.0) -> list[Stored]:
    """Everything in ``stream``, read through its leader once it has one. Right after a node woke
    or restarted, the stream may still be electing a leader, or the reading consumer (replicated
    like its stream) its own, and a fetch then gets a 503: the read starts again, to a deadline."""
    out: list[list[Stored]] = []

    def read() -> bool:
        try:
            out[:] = [stored(nodes.wait_for_stream_leader(stream).url, stream)]
        except (ServiceUnavailableError, NoRespondersError):
            return False
        return True

    wait_for(read, timeout=timeout, what=f"stream {stream} to answer a read", interval=0.5)
    return out[0]
