"""Whole transactions in the stream (``transactions: atomic``), as a consumer sees them.

Transfers between 5,000 accounts commit (2 to 2,500 rows a transaction, and a ledger row
each) while a consumer looks at the stream's tail every few milliseconds: at each look it
takes the stream's last sequence and applies every message up to it to its view of the
balances. Money only moves, so in every view the balances add up to what the accounts were
opened with — unless the view holds part of a transaction.

What a consumer must do to see whole transactions only (the README's *Transactions*): read up
to a message that ends an atomic batch (JetStream keeps ``Nats-Batch-Commit: 1`` on it). A
batch is stored all or nothing, but nats-server 2.15 stores its messages one after the other
at the commit, so a reader racing the commit can meet some of them before the rest (measured:
1 look in 8 here, where batches are stored back to back; whole again a moment later). A transaction larger than a
batch arrives as consecutive batches; a view that ends inside one (its last batch says how
many there are) is not whole yet either. Views that end elsewhere are not judged, and counted.

The control, ``transactions: none``, must show half-published transactions to the same
consumer (or the check could not fail). The faults — walflow killed with -9 (with and without
``-r``) and NATS restarted while batches are published — must leave the stream with every
change exactly once, each row's changes in commit order, and no view but whole ones.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from embedded import NatsServer, wait_for
from tests.crashes import last_seq
from tests.harness import Database, TestNames, slot_active, slot_confirmed
from tests.pipeline import assert_running, pipeline, stored, write_config

ACCOUNTS = 5_000
OPENING = 1_000
#: Rows a transfer changes: mostly a few, some more than a batch (1,000) holds.
SIZES = (2, 3, 5, 10, 40, 200, 900, 2_500)
RATE = 2_000  # changes a second, about


class Transfers(threading.Thread):
    """Moves money between random accounts, one transaction per transfer, at about :data:`RATE`
    changes a second, until ``stop``; rides out nothing (the faults here are walflow's and NATS's)."""

    def __init__(self, dsn: str, seed: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rng = dsn, random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.largest = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    size = self.rng.choice(SIZES)
                    ids = self.rng.sample(range(1, ACCOUNTS + 1), size)
                    deltas = [self.rng.randint(-50, 50) for _ in ids[1:]]
                    deltas.insert(0, -sum(deltas))  # money moves; none is made
                    values = ", ".join(f"({i}, {d})" for i, d in zip(ids, deltas, strict=True))
                    with conn.transaction():
                        conn.execute(f"UPDATE accounts SET balance = balance + v.d FROM (VALUES {values}) "
                                     "AS v(id, d) WHERE accounts.id = v.id")
                        conn.execute("INSERT INTO ledger (rows) VALUES (%s)", [size])
                    self.commits += 1
                    self.largest = max(self.largest, size)
                    time.sleep(size / RATE)  # the workload's pace, not a wait for anything
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class Views(threading.Thread):
    """A consumer looking at the stream's tail every few milliseconds (see the module docstring)."""

    def __init__(self, url: str, stream: str, atomic: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.stream, self.atomic = url, stream, atomic
        self.stop = threading.Event()
        self.balances: dict[int, int] = {}
        self.looks = self.whole = self.inside_a_batch = self.inside_a_split = 0
        self.partial: list[str] = []  # views that held part of a transaction
        self.split_batches = 0  # the most batches a transaction came in
        self.next_seq = 1  # the first sequence not read yet
        self.open_split = False
        self.at_commit = False  # the last message read ends an atomic batch

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        nc = await nats.connect(self.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js, sub = nc.jetstream(), None
        try:
            while not self.stop.is_set():
                try:
                    last = (await js.stream_info(self.stream)).state.last_seq
                    while self.next_seq <= last:
                        if sub is None:  # a consumer from where this one stands (again after NATS came back)
                            sub = await js.pull_subscribe(">", stream=self.stream, config=ConsumerConfig(
                                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=self.next_seq, inactive_threshold=30.0))
                        for msg in await sub.fetch(batch=min(2_000, last - self.next_seq + 1), timeout=5):
                            if msg.metadata.sequence.stream == self.next_seq:
                                self._apply(msg)
                                self.next_seq += 1
                except (NotFoundError, nats.errors.Error, TimeoutError):
                    sub = None
                    await asyncio.sleep(0.05)  # NATS away, or the stream not made yet: look again
                    continue
                self._judge(last)
                await asyncio.sleep(0.003)
        finally:
            await nc.close()

    def _apply(self, msg: Any) -> None:
        headers = msg.headers or {}
        batch, batches = headers.get("Walflow-Transaction-Batch"), headers.get("Walflow-Transaction-Batches")
        self.open_split = batch is not None and batches is None
        self.at_commit = headers.get("Nats-Batch-Commit") == "1"
        if batches is not None:
            self.split_batches = max(self.split_batches, int(batches))
        event = json.loads(msg.data)
        if event["metadata"]["table_name"] == "accounts" and event["action"] in ("insert", "update"):
            self.balances[event["record"]["id"]] = event["record"]["balance"]

    def _judge(self, last: int) -> None:
        self.looks += 1
        if self.atomic and not self.at_commit:
            self.inside_a_batch += 1
            return
        if self.open_split:
            self.inside_a_split += 1
            return
        self.whole += 1
        total, opened = sum(self.balances.values()), OPENING * len(self.balances)
        if total != opened:
            self.partial.append(f"at seq {last}: {len(self.balances)} accounts hold {total}, not {opened}")


def _config(database: Database, names: TestNames, nats_srv: Any, tmp_path: Path, transactions: str) -> Path:
    with database.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        conn.execute("CREATE TABLE ledger (id bigserial PRIMARY KEY, rows int NOT NULL)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE accounts, ledger")
    sink = {"name": "money", "transactions": transactions,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    return write_config(tmp_path, database, nats_srv, names, [sink])


def _open_accounts(database: Database) -> None:
    with database.connect() as conn:  # one transaction of 5,000 rows: five batches
        conn.execute("INSERT INTO accounts SELECT i, %s FROM generate_series(1, %s) i", [OPENING, ACCOUNTS])


def _check_stream(database: Database, url: str, names: TestNames, views: Views) -> int:
    """Every change exactly once, each row's in commit order, and the consumer's view the table."""
    events = stored(url, names.stream)
    ids = [e.msg_id for e in events]
    assert len(ids) == len(set(ids)), "a change was stored twice"
    with database.connect() as conn:
        balances = {int(str(i)): int(str(b)) for i, b in conn.execute("SELECT id, balance FROM accounts").fetchall()}
        ledger = conn.execute("SELECT count(*), coalesce(sum(rows), 0) FROM ledger").fetchone()
    assert ledger is not None
    transfers, updated = int(str(ledger[0])), int(str(ledger[1]))
    assert len(events) == ACCOUNTS + transfers + updated  # opening, one ledger row and the updates per transfer
    positions: dict[tuple[str, Any], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        meta = e.event["metadata"]
        positions[(meta["table_name"], e.event["record"]["id"])].append((meta["commit_lsn"], meta["commit_idx"]))
    assert [row for row, seen in positions.items() if seen != sorted(seen)] == []  # per-row order
    assert views.balances == balances
    return len(events)


def _run(database: Database, names: TestNames, server: Any, config: Path, mode: str, tmp_path: Path,
         atomic: bool = True) -> Views:
    """Open the accounts, then transfer under the consumer's eyes (with ``mode``'s faults), until
    the slot passed everything and the consumer read it all."""
    recovery = tmp_path / "recovery"
    args = ["-s", "1"]
    if mode.endswith("-r"):
        args = [*args, "-r", str(recovery), "-b", "0"]  # walflow makes the recovery directory
    views, transfers = Views(server.url, names.stream, atomic), Transfers(database.dsn, mode)
    views.start()
    try:
        with pipeline(config, *args) as proc:
            wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=lambda: assert_running(proc))
            _open_accounts(database)
            transfers.start()
            deadline = time.monotonic() + 12
            if mode.startswith("kill"):
                time.sleep(random.Random(mode).uniform(3, 6))  # the fault itself, at a random moment
                proc.kill()
            elif mode == "nats-restart":
                time.sleep(4)  # the fault itself: NATS goes away while batches are published
                server.stop()
                time.sleep(2)
                server.start()
        if mode.startswith("kill"):
            with pipeline(config, *args, log_suffix="-again") as proc:
                _finish(database, transfers, deadline, proc)
        else:
            with pipeline(config, *args, log_suffix="-after") as proc:
                _finish(database, transfers, deadline, proc)
        wait_for(lambda: views.next_seq > last_seq(server.url, names.stream), timeout=60,
                 what="the consumer to read the whole stream")
    finally:
        transfers.stop.set()
        views.stop.set()
        transfers.join(30)
        views.join(30)
    assert transfers.error is None, transfers.error
    return views


def _finish(database: Database, transfers: Transfers, deadline: float, proc: Any) -> None:
    wait_for(lambda: time.monotonic() > deadline, timeout=60, what="the transfers' time",
             check=lambda: assert_running(proc))
    transfers.stop.set()
    transfers.join(30)
    end = database.current_lsn()
    wait_for(lambda: slot_confirmed(database) >= end, timeout=120, what="the slot to pass the transfers",
             check=lambda: assert_running(proc))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["clean", "kill", "kill-r", "nats-restart"])
def test_a_consumer_never_sees_part_of_a_transaction(mode: str, database: Database, names: TestNames,
                                                     tmp_path: Path) -> None:
    with NatsServer() as server:
        config = _config(database, names, server, tmp_path, "atomic")
        views = _run(database, names, server, config, mode, tmp_path)
        count = _check_stream(database, server.url, names, views)
    assert views.partial == [], views.partial[:5]
    assert views.whole > 100 and views.split_batches >= 3  # it looked often, and saw transactions split
    assert views.at_commit and not views.open_split  # what the stream ends with is whole
    print(f"atomic {mode}: {count} changes, {views.looks} looks ({views.whole} whole, {views.inside_a_batch} inside a "
          f"batch being stored, {views.inside_a_split} inside a split transaction), none partial; up to "
          f"{views.split_batches} batches a transaction")


@pytest.mark.slow
def test_control_without_atomic_batches_the_consumer_sees_half_published_transactions(
        database: Database, names: TestNames, tmp_path: Path) -> None:
    with NatsServer() as server:
        config = _config(database, names, server, tmp_path, "none")
        views = _run(database, names, server, config, "clean", tmp_path, atomic=False)
        _check_stream(database, server.url, names, views)
    assert len(views.partial) > 0  # the same consumer catches transactions half published
    print(f"control: {len(views.partial)} of {views.whole} views held part of a transaction")
