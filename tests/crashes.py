"""Helpers for the Postgres crash tests (``tests/dataflows/test_postgres_crashes.py``).

:class:`RowWriter` writes a mixed load (inserts, updates, deletes and re-inserts of the same
rows, some in multi-statement transactions) that rides out server crashes; every write stamps
the row with a fresh ``w`` from a sequence, so each change of a row is told apart by content.
:func:`reference_changes` reads every committed change from a second slot after the fact: the
ground truth, whatever the writer saw of commits interrupted by a crash. :class:`SlotSampler`
polls the slot's confirmed position and the stream's last sequence all along, and
:func:`slot_ahead` says where the slot was ever confirmed past a change the stream did not
hold yet. :func:`scan` shows every stored message to a callback, fast and keeping none (a
million-row transaction's stream), :func:`messages` keeps them; :func:`check_changes` compares
the stream's changes with the reference, and :func:`peak_rss` reads a process's ``VmHWM``.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import random
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import orjson
import psycopg
from nats.aio.msg import Msg as NatsMsg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from config.schema import ReplicationSettings
from core.ids import IdScheme
from tests.harness import Database, TestNames, slot_confirmed
from tests.replication import drain_snapshotting, partition

#: The crash tests' table: ``w`` is a fresh number on every write, so no two changes of a row look alike.
TABLE_COLUMNS = "id int PRIMARY KEY, v int NOT NULL, w bigint NOT NULL, note text"


def create_rows_table(conn: psycopg.Connection[Any], table: str, rows: int = 0) -> None:
    """``table`` (:data:`TABLE_COLUMNS`, REPLICA IDENTITY FULL: a delete carries its row's ``w``), with
    ``rows`` rows ``1..rows``, and the sequence ``w_seq`` its writes draw from."""
    conn.execute("CREATE SEQUENCE IF NOT EXISTS w_seq")
    conn.execute(f"CREATE TABLE {table} ({TABLE_COLUMNS})")
    conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    if rows:
        conn.execute(f"INSERT INTO {table} SELECT g, 0, nextval('w_seq'), 'row ' || g FROM generate_series(1, {rows}) g")
        conn.execute(f"ANALYZE {table}")


class RowWriter(threading.Thread):
    """Updates (``v = v + 1``), deletes, re-inserts and inserts rows of ``table`` until stopped, a
    tenth of the time several in one transaction; about ``rate`` statements a second.

    Ids are drawn from ``1..ids`` and the new ones after it, so every row gets many changes. It
    rides out crashes: on a broken connection it connects again (an interrupted write may or may
    not have committed; :func:`reference_changes` knows which). ``ops`` counts the statements
    that returned, ``failures`` the connections lost.
    """

    def __init__(self, dsn: str, table: str, ids: int, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.rate = dsn, table, rate
        self.stop = threading.Event()
        self.ops: Counter[str] = Counter()
        self.failures = 0
        self.error: BaseException | None = None
        self._rng = random.Random(seed)
        self._next = ids + 1
        self._ids = ids

    def run(self) -> None:
        started, done = time.monotonic(), 0
        try:
            while not self.stop.is_set():
                try:
                    with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                        while not self.stop.is_set():
                            if self._rng.random() < 0.1:
                                with conn.transaction():
                                    for _ in range(self._rng.randint(2, 10)):
                                        self._one(conn)
                                        done += 1
                            else:
                                self._one(conn)
                                done += 1
                            ahead = done / self.rate - (time.monotonic() - started)
                            if ahead > 0:
                                self.stop.wait(ahead)  # a load generator's pacing, not synchronisation
                except psycopg.OperationalError:
                    self.failures += 1
                    self.stop.wait(0.2)  # the server is restarting: try again
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _one(self, conn: psycopg.Connection[Any]) -> None:
        rng, table = self._rng, self.table
        roll = rng.random()
        row = rng.randint(1, self._next - 1)
        if roll < 0.55:
            conn.execute(f"UPDATE {table} SET v = v + 1, w = nextval('w_seq') WHERE id = %s", [row])
            self.ops["update"] += 1
        elif roll < 0.7:
            conn.execute(f"DELETE FROM {table} WHERE id = %s", [row])
            self.ops["delete"] += 1
        elif roll < 0.9:
            conn.execute(f"INSERT INTO {table} VALUES (%s, 0, nextval('w_seq'), 'back') ON CONFLICT DO NOTHING", [row])
            self.ops["reinsert"] += 1
        else:
            conn.execute(f"INSERT INTO {table} VALUES (%s, 0, nextval('w_seq'), 'new') ON CONFLICT DO NOTHING",
                         [self._next])
            self._next += 1
            self.ops["insert"] += 1

    def finish(self) -> None:
        """Stop and join; a writer that failed other than by a lost connection fails the test."""
        self.stop.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"
        assert self.error is None, self.error


@dataclass(frozen=True)
class Ref:
    """One committed change, as the reference slot read it."""

    msg_id: str
    action: str
    table: str
    record: dict[str, Any]
    commit_lsn: int


def create_reference_slot(db: Database, names: TestNames) -> None:
    """A second slot, on the test's publication, read only at the end (:func:`reference_changes`)."""
    with db.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [f"{names.slot}_ref"])


def reference_changes(db: Database, names: TestNames, sink: str, end: int) -> list[Ref]:
    """Every change committed before ``end``, in commit order, from the reference slot."""
    cfg = db.config(create=False).model_copy(
        update={"slot": db.config().slot.model_copy(update={"name": f"{names.slot}_ref"})}
    )
    prefix = IdScheme("shop", sink).prefix
    out: list[Ref] = []
    with partition(cfg, ReplicationSettings(batch_size=5000)) as part:
        changes, _ = drain_snapshotting(part, lambda _, state: state["lsn"] >= end, timeout=180)
    for c in changes:
        msg_id = base64.b64encode(f"{prefix}{c.commit_lsn}:{c.commit_idx}".encode()).decode()
        record = c.old if c.action == "delete" else c.new
        assert record is not None
        out.append(Ref(msg_id, c.action, c.table, dict(record), c.commit_lsn))
    return out


@dataclass(frozen=True, slots=True)
class Msg:
    """One stored message, as the crash tests look at it."""

    seq: int
    msg_id: str
    action: str
    table: str
    commit_lsn: int
    commit_idx: int
    record: dict[str, Any]


#: Called with each stored message: its stream sequence, its ``Nats-Msg-Id`` and its payload.
Visit = Callable[[int, str, dict[str, Any]], None]


#: Messages asked for at once by :func:`scan`: what its subscription may hold, bounded.
SCAN_BATCH = 10_000


def scan(url: str, stream: str, visit: Visit) -> int:
    """Show every message of ``stream`` to ``visit``, in stream order, and keep none of them (a
    million fit); returns how many there were.

    A pull consumer asked for :data:`SCAN_BATCH` messages at a time, read by a subscription's
    callback: nats-py's ``fetch`` costs a few event-loop turns per message (40 µs, most of a
    million-message test), the callback one."""

    async def read() -> int:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                return 0
            last = info.state.last_seq
            if info.state.messages == 0:
                return 0
            consumer = await js.add_consumer(stream, ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0))
            next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer.name}"
            seen, batch_left = 0, 0
            failed: list[BaseException] = []
            done, room = asyncio.Event(), asyncio.Event()

            async def handle(msg: NatsMsg) -> None:
                nonlocal seen, batch_left
                if msg.headers and "Status" in msg.headers:  # 404/408: that request is over
                    batch_left = 0
                    room.set()
                    return
                # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>…, or with <domain>.<account> after ACK
                tokens = msg.reply.split(".")
                seq = int(tokens[5] if len(tokens) == 9 else tokens[7])
                try:
                    visit(seq, msg.headers.get("Nats-Msg-Id", "") if msg.headers else "", orjson.loads(msg.data))
                except BaseException as exc:  # noqa: BLE001 - raised by scan, not swallowed by nats-py
                    failed.append(exc)
                    done.set()
                    return
                seen += 1
                batch_left -= 1
                if seq >= last:
                    done.set()
                elif batch_left <= 0:
                    room.set()

            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox, cb=handle, pending_msgs_limit=2 * SCAN_BATCH, pending_bytes_limit=-1)
            try:
                while not done.is_set():
                    room.clear()
                    batch_left = SCAN_BATCH
                    await nc.publish(next_subject, orjson.dumps({"batch": SCAN_BATCH, "expires": 10_000_000_000}),
                                     reply=inbox)
                    waiting = [asyncio.ensure_future(done.wait()), asyncio.ensure_future(room.wait())]
                    finished, pending = await asyncio.wait(waiting, timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    for task in pending:
                        task.cancel()
                    assert finished, f"no message of {stream} for 30 s after sequence {seen}"
            finally:
                await sub.unsubscribe()
            if failed:
                raise failed[0]
            return seen
        finally:
            await nc.close()

    return asyncio.run(read())


def messages(url: str, stream: str) -> list[Msg]:
    """Every message of ``stream``, in stream order."""
    out: list[Msg] = []

    def keep(seq: int, msg_id: str, event: dict[str, Any]) -> None:
        meta = event["metadata"]
        out.append(Msg(seq, msg_id, event["action"], meta["table_name"], int(meta["commit_lsn"]),
                       int(meta["commit_idx"]), event["record"]))

    scan(url, stream, keep)
    return out


def highest_seq_by_commit(msgs: list[Msg]) -> dict[int, int]:
    """For each commit LSN, the highest stream sequence among its changes (reads left out)."""
    out: dict[int, int] = {}
    for m in msgs:
        if m.action != "read":
            out[m.commit_lsn] = max(out.get(m.commit_lsn, 0), m.seq)
    return out


def last_seq(url: str, stream: str) -> int:
    """The stream's last sequence (0 while it does not exist)."""

    async def ask() -> int:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            try:
                return int((await nc.jetstream().stream_info(stream)).state.last_seq)
            except NotFoundError:
                return 0
        finally:
            await nc.close()

    return asyncio.run(ask())


class SlotSampler(threading.Thread):
    """Samples (the slot's confirmed LSN, then the stream's last sequence) until stopped.

    Read in that order, a sample says: everything the slot was confirmed past was in the stream
    at or before that sequence. While Postgres is down there is no sample.
    """

    def __init__(self, db: Database, url: str, stream: str, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.db, self.url, self.stream, self.interval = db, url, stream, interval
        self.samples: list[tuple[int, int]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                confirmed = slot_confirmed(self.db)
            except psycopg.OperationalError:
                self.stop.wait(self.interval)  # Postgres is down: nothing to sample
                continue
            try:
                self.samples.append((confirmed, last_seq(self.url, self.stream)))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc
                return
            self.stop.wait(self.interval)  # a sampling rate, not synchronisation

    def finish(self) -> list[tuple[int, int]]:
        self.stop.set()
        self.join(30)
        assert self.error is None, self.error
        return self.samples


def slot_ahead(samples: list[tuple[int, int]], by_commit: dict[int, int]) -> list[str]:
    """The samples in which the slot was confirmed past a change (its commit LSN below the confirmed
    position) that the stream had not yet stored, one line each; ``by_commit`` is
    :func:`highest_seq_by_commit` of the whole stream."""
    lsns = sorted(by_commit)
    highest, top = [], 0
    for lsn in lsns:
        top = max(top, by_commit[lsn])
        highest.append(top)
    bad = []
    for confirmed, stored_up_to in samples:
        passed = bisect.bisect_left(lsns, confirmed)  # transactions committed before the confirmed position
        if passed and highest[passed - 1] > stored_up_to:
            bad.append(f"slot confirmed at {confirmed} while the stream ended at {stored_up_to}: "
                       f"a change committed before it is at {highest[passed - 1]}")
    return bad


def check_changes(msgs: list[Msg], reference: list[Ref]) -> dict[str, int]:
    """The stream's changes (not its reads) are the reference's exactly: each message id once, no
    change of a row twice (by its content), each with the reference's action and record, and for
    every row its changes in commit order. Returns counts for the test's report."""
    ids = Counter(m.msg_id for m in msgs)
    duplicated = [i for i, n in ids.items() if n > 1]
    assert not duplicated, f"{len(duplicated)} message ids stored twice, e.g. {duplicated[:3]}"
    changes = [m for m in msgs if m.action != "read"]
    pairs = Counter((m.table, m.record["id"], m.action, m.record["w"]) for m in changes)
    twice = [p for p, n in pairs.items() if n > 1]
    assert not twice, f"{len(twice)} changes of a row stored twice, e.g. {twice[:3]}"
    want = {r.msg_id: r for r in reference}
    got = {m.msg_id: m for m in changes}
    missing = [i for i in want if i not in got]
    unexpected = [i for i in got if i not in want]
    assert (len(missing), len(unexpected)) == (0, 0), (
        f"{len(missing)} committed changes missing (e.g. {[want[i] for i in missing[:3]]}), "
        f"{len(unexpected)} never committed (e.g. {[got[i] for i in unexpected[:3]]})")
    wrong = [(got[i], r) for i, r in want.items() if (got[i].action, got[i].table, got[i].record)
             != (r.action, r.table, r.record)]
    assert not wrong, f"{len(wrong)} changes stored unlike their commit, e.g. {wrong[:2]}"
    in_stream: dict[tuple[str, Any], list[str]] = defaultdict(list)
    for m in changes:
        in_stream[(m.table, m.record["id"])].append(m.msg_id)
    committed: dict[tuple[str, Any], list[str]] = defaultdict(list)
    for r in reference:
        committed[(r.table, r.record["id"])].append(r.msg_id)
    out_of_order = [row for row, seen in in_stream.items() if seen != committed[row]]
    assert not out_of_order, f"{len(out_of_order)} rows with changes out of commit order, e.g. {out_of_order[:3]}"
    per_row = [len(seen) for seen in committed.values()]
    return {"changes": len(changes), "rows": len(committed), "most_per_row": max(per_row, default=0)}


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far, in bytes (``VmHWM``)."""
    found = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found is not None
    return int(found.group(1)) * 1024
