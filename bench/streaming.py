"""Issue 26 part 4: pgoutput protocol 2 streaming (``streaming 'on'``) beside protocol 1.

``./run.sh bench --only streaming``. Each workload gets a database of its own with two fresh
pgoutput slots made before it writes, so both readers see the same WAL; both read live while
it is written, each in a process of its own (``python -m bench.streaming``):

- **protocol 1** (``proto_version '1'``, what ``connectors/postgres/session.py`` asks for): only
  committed transactions arrive, each as Begin … Commit after its commit; the server keeps a
  transaction's changes in ``logical_decoding_work_mem`` and spills the rest to its disk. The
  reader hands each change on as it arrives (walflow publishes as it decodes) and holds nothing.
- **protocol 2** (``proto_version '2', streaming 'on'``): once the reorder buffer outgrows
  ``logical_decoding_work_mem`` the server sends the largest transaction's changes before it
  commits, in Stream Start … Stream Stop blocks, then Stream Commit or Stream Abort (also for a
  rolled-back subtransaction, with its subxid). A reader that keeps walflow's exactly-once may
  publish none of it before Stream Commit, so :class:`Consumer` holds each streamed
  transaction's changes (their pgoutput bytes, nothing decoded: the least it could hold) until
  Stream Commit, and drops them at Stream Abort — a subtransaction's from its first change on,
  as PostgreSQL's own apply worker truncates its spool file. Its peak is the memory walflow
  would need (or a spill file of its own): what protocol 1 leaves on the server's disk.

The workloads, in ``benchmark_records`` (``bench/workloads.py``), rows of the bulk workload's
shape (~100 B): **bulk**, one INSERT transaction of ``streaming_rows`` rows; **concurrent**,
``streaming_sessions`` sessions each committing ``streaming_txns`` transactions of
``streaming_txn_rows`` rows in statements of 1,000, all at once, so the reorder buffer holds
many of them; **aborts**, the same sessions running a cycle of an aborted transaction, one with
a rolled-back savepoint, one with a nested savepoint rolled back past a released one, and a
committed one. Rolled-back rows have negative ids: a consumer that publishes one is wrong, and
every reader must publish exactly the committed rows.

Per workload and protocol: the slot's ``pg_stat_replication_slots`` (reset before, read after
the reader consumed everything), commit → received latency (the writer's COMMIT returning, by
the wall clock, to the reader holding the transaction's Commit or Stream Commit: the earliest
moment its changes may be published), the reader's peak RSS and held bytes, its CPU and wall
time, and what it received and dropped of rolled-back (sub)transactions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import select
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.monitor import CpuSnapshot
from bench.workloads import PUBLICATION, _insert, current_lsn, drop_database, prepare_database
from connectors.postgres.decoder import change_memory
from connectors.postgres.protocol import XLOGDATA_HEADER, parse_keepalive, status_update
from connectors.postgres.stream import ReplicationStream, quote_identifier

if TYPE_CHECKING:
    from bench.runner import Bench

ROOT = Path(__file__).resolve().parent.parent
#: benchmark_records' columns: the values each of its changes carries
COLUMNS = 7
#: Rows per INSERT statement of the concurrent and aborts workloads: transactions interleave.
STATEMENT_ROWS = 1_000
#: The rows of the bulk workload's shape; ``%s`` is the sign, then the first and last g.
ROWS_SELECT = ("SELECT %s::int * g, md5(g::text), g * 1.5, now(), jsonb_build_object('seq', g, 'tag', 'bench') "
               "FROM generate_series(%s::int, %s::int) g")

_XLOG_START = struct.Struct("!Q")
_I32 = struct.Struct("!I")
_BEGIN = struct.Struct("!QqI")  # final_lsn, commit_ts, xid
_STREAM_ABORT = struct.Struct("!II")  # xid, subxid
_INSERT_ID = struct.Struct("!IcHcI")  # relid, 'N', ncols, first column's kind, its length


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The streaming part's sizes (fields of ``bench.runner.Options``)."""
    from bench.runner import FULL, QUICK

    group = parser.add_argument_group("streaming (issue 26: pgoutput protocol 2 streaming beside protocol 1)")
    group.add_argument("--streaming-rows", type=int, help="rows of the bulk transaction "
                       f"[full {FULL.streaming_rows:,}, quick {QUICK.streaming_rows:,}]")
    group.add_argument("--streaming-sessions", type=int, help="concurrent sessions of the concurrent and aborts "
                       f"workloads [full {FULL.streaming_sessions}, quick {QUICK.streaming_sessions}]")
    group.add_argument("--streaming-txns", type=int, help="transactions per session "
                       f"[full {FULL.streaming_txns}, quick {QUICK.streaming_txns}]")
    group.add_argument("--streaming-txn-rows", type=int, help=f"rows per transaction [{FULL.streaming_txn_rows:,}]")
    group.add_argument("--streaming-work-mem", help="logical_decoding_work_mem of both readers' walsenders, comma-separated: "
                       "concurrent and aborts at each, bulk at the first "
                       f"[full {FULL.streaming_work_mem}, quick {QUICK.streaming_work_mem}]")


# --- the consumer: sans-IO, pgoutput bytes in, what a correct consumer publishes and holds --------------


@dataclass
class Received:
    """One committed transaction as a reader saw it (wall clock, ns)."""

    last_change_ns: int
    commit_ns: int
    streamed: bool
    #: the first change that may be published: the first after Begin, or them all at Stream Commit
    first_publishable_ns: int


@dataclass
class Consumer:
    """What an exactly-once consumer does with protocol 1 or 2's messages, counted.

    A change of a transaction sent after its commit (Begin … Commit) is published as it
    arrives; a change inside a stream block is held under its top-level xid until Stream
    Commit publishes them all, or Stream Abort drops them: all of them when the subxid is the
    xid, else those from the subtransaction's first held change on (its children and later
    subtransactions came after it; what came before it stays). "Published" only counts: the
    point is what must be held, and that no rolled-back row (negative id) is ever published.
    """

    #: top-level xid of the open stream block, if any
    stream_xid: int | None = None
    #: xid of the open Begin … Commit transaction
    xid: int = 0
    held: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    #: per held top-level xid: each subxid's first index in its list
    first: dict[int, dict[int, int]] = field(default_factory=dict)
    held_bytes: int = 0
    held_changes: int = 0
    peak_held_bytes: int = 0
    peak_held_changes: int = 0
    received_changes: int = 0
    received_rolled_back: int = 0
    published: int = 0
    published_rolled_back: int = 0
    dropped: int = 0
    dropped_committed: int = 0
    stream_blocks: int = 0
    stream_commits: int = 0
    stream_aborts: int = 0
    subxact_aborts: int = 0
    last_change_ns: int = 0
    first_change_ns: int = 0
    last_stream_ns: dict[int, int] = field(default_factory=dict)
    commits: dict[int, Received] = field(default_factory=dict)

    def message(self, msg: bytes | memoryview, now_ns: int) -> None:
        """One pgoutput message (the XLogData payload) received at ``now_ns``."""
        kind = msg[0]
        if kind in b"IUDT":
            self._change(msg, now_ns)
        elif kind == 0x42:  # 'B'
            self.xid = _BEGIN.unpack_from(msg, 1)[2]
        elif kind == 0x43:  # 'C'
            self.commits[self.xid] = Received(self.last_change_ns or now_ns, now_ns, False,
                                              self.first_change_ns or now_ns)
            self.last_change_ns = self.first_change_ns = 0
        elif kind == 0x53:  # 'S' Stream Start
            self.stream_xid = _I32.unpack_from(msg, 1)[0]
            self.stream_blocks += 1
        elif kind == 0x45:  # 'E' Stream Stop
            assert self.stream_xid is not None, "Stream Stop outside a stream"
            self.last_stream_ns[self.stream_xid] = now_ns
            self.stream_xid = None
        elif kind == 0x63:  # 'c' Stream Commit
            xid = _I32.unpack_from(msg, 1)[0]
            changes = self.held.pop(xid, [])
            self.first.pop(xid, None)
            self._release(changes)
            self.published += len(changes)
            self.published_rolled_back += sum(_rolled_back(m, 5) for _, m in changes)
            self.stream_commits += 1
            self.commits[xid] = Received(self.last_stream_ns.pop(xid, now_ns), now_ns, True, now_ns)
        elif kind == 0x41:  # 'A' Stream Abort
            xid, subxid = _STREAM_ABORT.unpack_from(msg, 1)
            changes = self.held.get(xid, [])
            firsts = self.first.get(xid, {})
            if xid == subxid:
                self.stream_aborts += 1
                cut = 0
                self.held.pop(xid, None)
                self.first.pop(xid, None)
                self.last_stream_ns.pop(xid, None)
            else:
                self.subxact_aborts += 1
                cut = firsts.get(subxid, len(changes))  # none held: nothing of it was streamed
                for sub in [s for s, i in firsts.items() if i >= cut]:
                    del firsts[sub]
            gone = changes[cut:]
            del changes[cut:]
            self._release(gone)
            self.dropped += len(gone)
            self.dropped_committed += sum(not _rolled_back(m, 5) for _, m in gone if m[0] == 0x49)
        # 'R', 'Y', 'O', 'M': nothing to count

    def _change(self, msg: bytes | memoryview, now_ns: int) -> None:
        self.received_changes += 1
        if self.stream_xid is None:  # committed: published now, as walflow does
            rolled_back = _rolled_back(msg, 1)
            self.received_rolled_back += rolled_back
            self.published += 1
            self.published_rolled_back += rolled_back
            self.last_change_ns = now_ns
            self.first_change_ns = self.first_change_ns or now_ns
            return
        subxid = _I32.unpack_from(msg, 1)[0]
        self.received_rolled_back += _rolled_back(msg, 5)
        top = self.stream_xid
        changes = self.held.get(top)
        if changes is None:
            changes = self.held[top] = []
            self.first[top] = {}
        self.first[top].setdefault(subxid, len(changes))
        data = bytes(msg)
        changes.append((subxid, data))
        self.held_bytes += len(data)
        self.held_changes += 1
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        self.peak_held_changes = max(self.peak_held_changes, self.held_changes)

    def _release(self, changes: list[tuple[int, bytes]]) -> None:
        self.held_bytes -= sum(len(m) for _, m in changes)
        self.held_changes -= len(changes)

    def figures(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (
            "received_changes", "received_rolled_back", "published", "published_rolled_back", "dropped",
            "dropped_committed", "peak_held_bytes", "peak_held_changes", "stream_blocks", "stream_commits",
            "stream_aborts", "subxact_aborts")} | {"still_held": self.held_changes}


def _rolled_back(msg: bytes | memoryview, at: int) -> bool:
    """Whether an Insert (its relid at ``at``) carries a rolled-back row: a negative id in its first column."""
    if msg[0] != 0x49:  # 'I'
        return False
    _relid, _new, _ncols, kind, _length = _INSERT_ID.unpack_from(msg, at)
    return kind == b"t" and msg[at + _INSERT_ID.size] == 0x2D  # '-'


# --- the reader process ------------------------------------------------------------------------------


def _peak_rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    sizes = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":", 1)
            sizes[name] = int(value.split()[0]) * 1024
    return sizes["VmRSS"], sizes["VmHWM"]


def read(dsn: str, slot: str, proto: int, work_mem: str, out: Path) -> None:
    """Read ``slot`` live until stdin gives an LSN and everything up to it has arrived; write figures to ``out``."""
    conninfo = make_conninfo(dsn, replication="database", application_name=f"bench-{slot}",
                             options=f"-c logical_decoding_work_mem={work_mem}")
    stream = ReplicationStream(conninfo)
    options = {"proto_version": str(proto), "publication_names": quote_identifier(PUBLICATION)}
    if proto >= 2:
        options["streaming"] = "on"
    stream.start(slot, 0, options)
    consumer = Consumer()
    rss_ready, _ = _peak_rss()
    print("ready", flush=True)
    get_copy_data = stream.get_copy_data
    feed = consumer.message
    received = 0
    end_lsn: int | None = None
    stdin = sys.stdin.fileno()
    status_at = time.monotonic()
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    first_ns = 0
    while True:
        size, data = get_copy_data(1)
        if size > 0:
            if data[0] == 0x77:  # 'w'
                now = time.time_ns()
                first_ns = first_ns or now
                received = max(received, _XLOG_START.unpack_from(data, 1)[0])
                feed(data[XLOGDATA_HEADER:], now)
            elif data[0] == 0x6B:  # 'k'
                keepalive = parse_keepalive(data)
                received = max(received, keepalive.wal_end)
                if keepalive.reply_requested:
                    stream.send(status_update(received, 0))
            continue
        if size < 0:
            raise stream.ended()
        if end_lsn is not None and received >= end_lsn:
            break
        if time.monotonic() - status_at > 0.5:  # the server answers a write behind it with a keepalive
            stream.send(status_update(received, 0))
            status_at = time.monotonic()
        if stdin in stream.wait(0.2, [stdin] if end_lsn is None else []):
            end_lsn = int(sys.stdin.readline())
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    stream.end()
    stream.close()
    rss, hwm = _peak_rss()
    result = {
        "proto": proto, "slot": slot, **consumer.figures(),
        "rss_ready_bytes": rss_ready, "rss_end_bytes": rss, "peak_rss_bytes": hwm,
        "cpu_s": round(cpu.ru_utime + cpu.ru_stime - cpu_start.ru_utime - cpu_start.ru_stime, 2),
        "first_message_ns": first_ns,
        "commits": {str(xid): [r.last_change_ns, r.commit_ns, r.streamed, r.first_publishable_ns] for xid, r in consumer.commits.items()},
    }
    out.write_text(json.dumps(result))


class Reader:
    """One reader process (:func:`read`), started and ready before the workload writes."""

    def __init__(self, dsn: str, slot: str, proto: int, work_mem: str, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.streaming", "--dsn", dsn, "--slot", slot, "--proto", str(proto),
             "--work-mem", work_mem, "--out", str(out)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"streaming reader {slot} (protocol {proto}) did not start: {line!r}")

    def tell_end(self, end_lsn: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{end_lsn}\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        if self.proc.wait(timeout) != 0:
            raise RuntimeError(f"streaming reader exited with {self.proc.returncode}")
        figures: dict[str, Any] = json.loads(self.out.read_text())
        return figures

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- the workloads -----------------------------------------------------------------------------------


@dataclass
class Writes:
    """What a workload committed: each transaction's xid with the wall clock (ns) its COMMIT returned."""

    began_ns: int = 0
    committed: dict[int, int] = field(default_factory=dict)
    committed_rows: int = 0
    rolled_back_rows: int = 0
    aborted_transactions: int = 0
    rolled_back_savepoints: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def commit(self, conn: psycopg.Connection[tuple[Any, ...]], xid: int, rows: int, rolled_back: int) -> None:
        conn.execute("COMMIT")
        now = time.time_ns()
        with self.lock:
            self.committed[xid] = now
            self.committed_rows += rows
            self.rolled_back_rows += rolled_back


class Ids:
    """Blocks of ids, each used once per workload, from many sessions."""

    def __init__(self) -> None:
        self._next = 1
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        with self._lock:
            first, self._next = self._next, self._next + n
        return first


def _begin(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    conn.execute("BEGIN")
    row = conn.execute("SELECT txid_current() % 4294967296").fetchone()
    assert row is not None
    return int(row[0])


def _rows(conn: psycopg.Connection[tuple[Any, ...]], ids: Ids, n: int, sign: int = 1) -> int:
    """``n`` rows in statements of :data:`STATEMENT_ROWS`; negative ids when ``sign`` is -1 (to be rolled back)."""
    done = 0
    while done < n:
        count = min(STATEMENT_ROWS, n - done)
        first = ids.take(count)
        done += _insert(conn, ROWS_SELECT, [sign, first, first + count - 1])
    return done


def write_bulk(dsn: str, rows: int) -> Writes:
    writes = Writes(began_ns=time.time_ns())
    began = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        xid = _begin(conn)
        inserted = _insert(conn, ROWS_SELECT, [1, 1, rows])
        writes.commit(conn, xid, inserted, 0)
    writes.seconds = time.monotonic() - began
    return writes


def _sessions(dsn: str, sessions: int, work: Callable[[psycopg.Connection[tuple[Any, ...]], int], None]) -> Writes:
    """``work(conn, session)`` in ``sessions`` concurrent sessions, started together."""
    writes = Writes()
    errors: list[BaseException] = []
    start = threading.Barrier(sessions + 1)

    def session(s: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait()
                work(conn, s)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=session, args=(s,)) for s in range(sessions)]
    for t in threads:
        t.start()
    start.wait()
    writes.began_ns = time.time_ns()
    began = time.monotonic()
    for t in threads:
        t.join()
    writes.seconds = time.monotonic() - began
    if errors:
        raise errors[0]
    return writes


def write_concurrent(dsn: str, sessions: int, txns: int, txn_rows: int) -> tuple[Writes, Callable[[], None]]:
    ids = Ids()
    holder: list[Writes] = []

    def work(conn: psycopg.Connection[tuple[Any, ...]], s: int) -> None:
        for _ in range(txns):
            xid = _begin(conn)
            holder[0].commit(conn, xid, _rows(conn, ids, txn_rows), 0)

    return _deferred(dsn, sessions, work, holder)


def _deferred(dsn: str, sessions: int, work: Callable[[psycopg.Connection[tuple[Any, ...]], int], None],
              holder: list[Writes]) -> tuple[Writes, Callable[[], None]]:
    """The sessions' Writes, shared by every session before any starts."""
    writes = Writes()
    holder.append(writes)

    def run() -> None:
        done = _sessions(dsn, sessions, work)
        writes.began_ns, writes.seconds = done.began_ns, done.seconds

    return writes, run


def write_aborts(dsn: str, sessions: int, txns: int, txn_rows: int) -> tuple[Writes, Callable[[], None]]:
    """Each session's transaction ``t`` by ``(session + t) % 4``: 0 aborted whole; 1 a half rolled
    back to a savepoint, then more rows; 2 a savepoint, a nested one released, then rolled back
    to the outer one; 3 committed with a released savepoint."""
    ids = Ids()
    holder: list[Writes] = []
    half = txn_rows // 2
    quarter = txn_rows // 4

    def work(conn: psycopg.Connection[tuple[Any, ...]], s: int) -> None:
        writes = holder[0]
        for t in range(txns):
            shape = (s + t) % 4
            xid = _begin(conn)
            if shape == 0:
                rolled = _rows(conn, ids, txn_rows, -1)
                conn.execute("ROLLBACK")
                with writes.lock:
                    writes.aborted_transactions += 1
                    writes.rolled_back_rows += rolled
                continue
            kept = _rows(conn, ids, quarter)
            conn.execute("SAVEPOINT a")
            if shape == 1:
                rolled = _rows(conn, ids, half, -1)
                conn.execute("ROLLBACK TO SAVEPOINT a")
            elif shape == 2:
                rolled = _rows(conn, ids, quarter, -1)
                conn.execute("SAVEPOINT b")
                rolled += _rows(conn, ids, quarter, -1)
                conn.execute("RELEASE SAVEPOINT b")
                rolled += _rows(conn, ids, quarter // 2, -1)
                conn.execute("ROLLBACK TO SAVEPOINT a")
            else:
                rolled = 0
                kept += _rows(conn, ids, half)
                conn.execute("RELEASE SAVEPOINT a")
            if rolled:
                with writes.lock:
                    writes.rolled_back_savepoints += 1
            kept += _rows(conn, ids, quarter)
            writes.commit(conn, xid, kept, rolled)

    return _deferred(dsn, sessions, work, holder)


# --- one workload, both readers -------------------------------------------------------------------------


def _slot_stats(dsn: str, slot: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes, "
                           "total_txns, total_bytes FROM pg_stat_replication_slots WHERE slot_name = %s",
                           [slot]).fetchone()
    names = ("spill_txns", "spill_count", "spill_bytes", "stream_txns", "stream_count", "stream_bytes",
             "total_txns", "total_bytes")
    return dict(zip(names, (int(v) for v in row), strict=True)) if row else {}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty), ``q`` in (0, 100]."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def latencies(writes: Writes, reader: dict[str, Any]) -> dict[str, Any]:
    """Commit → received (ms) over the transactions the writer committed: the reader's Commit or Stream
    Commit, and (protocol 2's streamed ones) its last change, which may come before COMMIT returns."""
    commit_ms: list[float] = []
    last_ms: list[float] = []
    first_ms: list[float] = []
    missing = 0
    for xid, returned in writes.committed.items():
        got = reader["commits"].get(str(xid))
        if got is None:
            missing += 1
            continue
        last_ms.append((got[0] - returned) / 1e6)
        commit_ms.append((got[1] - returned) / 1e6)
        first_ms.append((got[3] - returned) / 1e6)
    figures: dict[str, Any] = {"transactions": len(commit_ms), "missing": missing}
    for name, values in (("commit_ms", commit_ms), ("last_change_ms", last_ms), ("first_publishable_ms", first_ms)):
        if values:
            figures[name] = {"p50": round(percentile(values, 50), 1), "p99": round(percentile(values, 99), 1),
                             "max": round(max(values), 1), "mean": round(statistics.fmean(values), 1)}
    return figures


def measure_one(suite: Bench, say: Callable[[str], None], name: str, work_mem: str,
                write: Callable[[str], tuple[Writes, Callable[[], None]]]) -> dict[str, Any]:
    """One workload written while both readers, their walsenders at ``work_mem``, read it live."""
    name = f"{name}_{work_mem.lower()}"
    database = f"bench_stream_{name}"
    dsn = suite.pg.dsn(database)
    slots = {1: f"st_{name}_p1", 2: f"st_{name}_p2"}
    prepare_database(suite.pg.dsn(), database, dsn, list(slots.values()))
    readers: dict[int, Reader] = {}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for slot in slots.values():
                conn.execute("SELECT pg_stat_reset_replication_slot(%s)", [slot])
            start_lsn = current_lsn(conn)
        machine = CpuSnapshot.take()
        for proto, slot in slots.items():
            readers[proto] = Reader(dsn, slot, proto, work_mem, suite.workdir / f"{slot}.json")
        writes, run = write(dsn)
        say(f"streaming {name}: writing, both readers live")
        run()
        with psycopg.connect(dsn, autocommit=True) as conn:
            end_lsn = current_lsn(conn)
        for reader in readers.values():
            reader.tell_end(end_lsn)
        result: dict[str, Any] = {
            "work_mem": work_mem, "committed_transactions": len(writes.committed), "committed_rows": writes.committed_rows,
            "rolled_back_rows": writes.rolled_back_rows, "aborted_transactions": writes.aborted_transactions,
            "rolled_back_savepoints": writes.rolled_back_savepoints, "write_s": round(writes.seconds, 2),
            "wal_mb": round((end_lsn - start_lsn) / 2**20, 1), "protocols": {},
        }
        for proto, reader in readers.items():
            figures = reader.result(timeout=suite.timeout(writes.committed_rows + writes.rolled_back_rows))
            if proto == 2:  # both readers have read everything
                result.update(CpuSnapshot.take().shares_since(machine))
                suite.check_noise(f"streaming {name}", result)
            last = max((c[1] for c in figures["commits"].values()), default=writes.began_ns)
            figures["wall_s"] = round((last - writes.began_ns) / 1e9, 2)
            figures["latency"] = latencies(writes, figures)
            del figures["commits"]
            figures["slot"] = _slot_stats(dsn, slots[proto])
            result["protocols"][str(proto)] = figures
            for problem in problems(result, figures):
                suite.warnings.append(f"streaming {name}, protocol {proto}: {problem}")
            lat = figures["latency"].get("commit_ms", {})
            say(f"streaming {name}: protocol {proto}: spilled {figures['slot'].get('spill_bytes', 0) / 2**20:.0f} MB, "
                f"streamed {figures['slot'].get('stream_bytes', 0) / 2**20:.0f} MB, commit → received p50 "
                f"{lat.get('p50')} ms p99 {lat.get('p99')} ms, held peak {figures['peak_held_bytes'] / 2**20:.0f} MB, "
                f"peak RSS {figures['peak_rss_bytes'] / 2**20:.0f} MB, dropped {figures['dropped']:,}")
        return result
    finally:
        for reader in readers.values():
            reader.kill()
        drop_database(suite.pg.dsn(), database)


def problems(workload: dict[str, Any], reader: dict[str, Any]) -> list[str]:
    """What a correct consumer must never show: a rolled-back row published, a committed one lost or dropped."""
    found = []
    if reader["published"] != workload["committed_rows"]:
        found.append(f"published {reader['published']:,} changes of {workload['committed_rows']:,} committed")
    if reader["published_rolled_back"]:
        found.append(f"published {reader['published_rolled_back']:,} rolled-back changes")
    if reader["dropped_committed"]:
        found.append(f"dropped {reader['dropped_committed']:,} committed changes")
    if reader["still_held"]:
        found.append(f"{reader['still_held']:,} changes still held at the end")
    if reader["latency"]["missing"]:
        found.append(f"{reader['latency']['missing']} committed transactions never arrived")
    return found


def measure(suite: Bench, say: Callable[[str], None]) -> dict[str, Any]:
    """The streaming part of a bench run: the three workloads, each read by both protocols."""
    o = suite.options
    with psycopg.connect(suite.pg.dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('logical_decoding_work_mem'), version()").fetchone()
    assert row is not None
    mems = o.streaming_work_mem.split(",")
    result: dict[str, Any] = {
        "work_mem": mems, "server_work_mem": str(row[0]), "server": str(row[1]).split(" on ")[0],
        "cpus": os.cpu_count(), "workloads": {},
    }
    sessions, txns, txn_rows = o.streaming_sessions, o.streaming_txns, o.streaming_txn_rows
    plan: list[tuple[str, str, Callable[[str], tuple[Writes, Callable[[], None]]]]] = [
        ("bulk", f"one INSERT transaction of {o.streaming_rows:,} rows",
         lambda dsn: _now(lambda: write_bulk(dsn, o.streaming_rows))),
        ("concurrent", f"{sessions} sessions × {txns} transactions × {txn_rows:,} rows, interleaved",
         lambda dsn: write_concurrent(dsn, sessions, txns, txn_rows)),
        ("aborts", f"{sessions} sessions × {txns} transactions × ~{txn_rows:,} rows: aborted, savepoints rolled back",
         lambda dsn: write_aborts(dsn, sessions, txns, txn_rows)),
    ]
    for name, label, write in plan:
        for work_mem in mems[:1] if name == "bulk" else mems:  # the bulk one spills or streams at any of them
            say(f"streaming {name}, logical_decoding_work_mem {work_mem}: {label}")
            result["workloads"][f"{name}-{work_mem}"] = {"label": label, **measure_one(suite, say, name, work_mem,
                                                                                        write)}
    return result


def _now(write: Callable[[], Writes]) -> tuple[Writes, Callable[[], None]]:
    """A single-session workload in the deferred form: its Writes filled when run."""
    writes = Writes()

    def run() -> None:
        done = write()
        writes.began_ns, writes.committed, writes.committed_rows, writes.seconds = (
            done.began_ns, done.committed, done.committed_rows, done.seconds)

    return writes, run


# --- the report ---------------------------------------------------------------------------------------


def _mb(n: int | None) -> str:
    return "0" if not n else f"{n / 2**20:,.1f} MB"


def _ms(figures: dict[str, Any] | None, key: str) -> str:
    return "" if not figures else f"{figures[key]:,.1f}"


def _as_changes(reader: dict[str, Any]) -> int:
    """The held peak as walflow's decoder counts what its changes hold until acknowledged
    (:func:`connectors.postgres.decoder.change_memory`; benchmark_records has 7 columns)."""
    n = reader["peak_held_changes"]
    return change_memory(reader["peak_held_bytes"] // n, COLUMNS) * n if n else 0


def markdown(streaming: dict[str, Any] | None) -> list[str]:
    if not streaming:
        return []
    lines = [
        "## Protocol 2 streaming beside protocol 1 (issue 26)",
        "",
        (f"{streaming['server']}, {streaming['cpus']} CPUs; both readers' walsenders with the logical_decoding_work_mem "
         f"of the row (the server's default: {streaming['server_work_mem']}); each workload's WAL read "
         "live by both at once, each on its own slot. Commit → received: from the writer's COMMIT returning to the "
         "reader holding the Commit (protocol 1) or Stream Commit (protocol 2): when all its changes may be "
         "published. First publishable: to the first change that may be published (protocol 1: the first after "
         "Begin, published as it arrives; a streamed transaction's: all at Stream Commit). Latencies are wall "
         "clock across processes on one machine. Held: the pgoutput bytes of streamed changes a consumer must keep until Stream Commit; as walflow's "
         "changes: the same count as walflow's decoder estimates its changes' memory (0.5 KB + 120 B a value + 2 × "
         "the message's bytes)."),
        "",
        ("| workload | work_mem | proto | spill_bytes (count) | stream_bytes (count) | commit → received p50 / p99 / max ms "
         "| first publishable p50 ms | held peak (changes) | as walflow's changes | peak RSS (at start) | reader CPU s | wall s "
         "| rolled back: received / dropped / published |"),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, w in streaming["workloads"].items():
        for proto, r in w["protocols"].items():
            s, lat = r["slot"], r["latency"]
            commit = lat.get("commit_ms")
            lines.append(
                f"| {name.rsplit('-', 1)[0]}: {w['label']} ({w['committed_transactions']} committed txns, {w['wal_mb']} MB "
                f"WAL; machine {w.get('machine_cpu_busy', 0):.0%} busy, {w.get('other_processes_cpu', 0):.0%} others) "
                f"| {w['work_mem']} | {proto} "
                f"| {_mb(s.get('spill_bytes'))} ({s.get('spill_count', 0):,}) "
                f"| {_mb(s.get('stream_bytes'))} ({s.get('stream_count', 0):,}) "
                f"| {_ms(commit, 'p50')} / {_ms(commit, 'p99')} / {_ms(commit, 'max')} "
                f"| {_ms(lat.get('first_publishable_ms'), 'p50')} "
                f"| {_mb(r['peak_held_bytes'])} ({r['peak_held_changes']:,}) | {_mb(_as_changes(r))} "
                f"| {_mb(r['peak_rss_bytes'])} ({_mb(r['rss_ready_bytes'])}) | {r['cpu_s']} | {r['wall_s']} "
                f"| {r['received_rolled_back']:,} / {r['dropped']:,} / {r['published_rolled_back']:,} |"
            )
    lines.append("")
    wrong = [f"{name} protocol {proto}: {problem}" for name, w in streaming["workloads"].items()
             for proto, r in w["protocols"].items() for problem in problems(w, r)]
    lines += [("Every reader published exactly the committed rows, none rolled back, and held nothing at the end."
               if not wrong else "Wrong: " + "; ".join(wrong)), ""]
    for name, aborts in streaming["workloads"].items():
        if not name.startswith("aborts"):
            continue
        p2 = aborts["protocols"].get("2", {})
        lines += [
            (f"aborts at {aborts['work_mem']}: {aborts['aborted_transactions']} transactions aborted and {aborts['rolled_back_savepoints']} "
             f"savepoints rolled back, {aborts['rolled_back_rows']:,} rows rolled back, "
             f"{aborts['committed_rows']:,} committed. Protocol 2 saw {p2.get('stream_aborts', 0)} Stream Aborts of "
             f"whole transactions and {p2.get('subxact_aborts', 0)} of subtransactions (subxid ≠ xid)."),
            "",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one streaming reader (bench/streaming.py), started by the bench")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--proto", type=int, choices=(1, 2), required=True)
    parser.add_argument("--work-mem", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    read(args.dsn, args.slot, args.proto, args.work_mem, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
