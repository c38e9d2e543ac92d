"""Backfills: a table's existing rows as ``read`` events, consistent with the live stream.

The method is DBLog's watermarks (``shared/reference/postgres-replication.md`` §7.2), with
the slot as the only store:

1. The runner (a thread per table being read) writes a **low watermark** into the WAL,
   reads the next keyset chunk (:mod:`connectors.postgres.chunks`), keeps its rows, and
   writes a **high watermark** (:mod:`connectors.postgres.signals`).
2. The source partition decodes the stream in WAL order. Between a chunk's low and high
   watermark it notes the key of every change to the chunk's table; at the high
   watermark it emits the chunk's rows as ``read`` events, except those whose key
   changed in the window: the change, already in the stream, carries a state at least
   as new. A row deleted before the ``SELECT`` is not read; one deleted after it has its
   delete in the window. So for every row, the last event in the stream is its latest
   state, without a lock, a pause or a long transaction.
3. Reads enter the stream at the high watermark's place, so they are grouped and ordered
   with the row's changes by the same group key, and published, acknowledged and
   confirmed by the same epoch rule.

**Progress and resume.** The partition never confirms a position past the newest
``request`` or ``low`` signal of a backfill it is running (:attr:`Backfills.floor`), and
each ``low`` says where its chunk starts. After a crash without ``-r``, the replay from
the slot's confirmed LSN passes that signal first and the backfill continues from it:
from the last chunk whose reads were durable, never from the start. With ``-r`` the
partition's snapshot holds each backfill's position (:meth:`Backfills.snapshot`). A chunk
read again reads rows that may already be in the stream; their ids name the backfill and
the row (:meth:`core.ids.IdScheme.encode_read`), so the sink publishes them once.

**Signals obey the config.** Anyone may write a signal into the slot
(:mod:`connectors.postgres.messages`): one that is not well-formed (or not signed, with
``walflow.backfill.secret``) is ignored by :func:`connectors.postgres.signals.decode`, and a
well-formed one starts a backfill only if :class:`Admission` allows it: an enabled sink of
this database that reads the table by the same rules as its live changes, with fewer than
``max_pending`` backfills running or waiting. Whether the table is in the publication is the runner's check (:class:`TableReader`
refuses it, and the backfill ends with that error).

**Bounds.** A runner reads at most one chunk ahead of what the partition has emitted,
so each table holds at most two chunks (``walflow.backfill.max_chunk_*``);
reads count against the epoch budget like changes. At most ``max_concurrent`` tables are
read at once; the others wait, and write a checkpoint every few seconds so that waiting
does not hold the slot back.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TypedDict

import psycopg

from config.schema import BackfillSettings, DatabaseConfig, SinkConfig
from connectors.postgres import signals
from connectors.postgres.chunks import BackfillRefused, Chunk, TableReader, wait_for_commits_in_flight
from connectors.postgres.connection import conninfo
from connectors.postgres.decoder import Signal
from connectors.postgres.messages import BACKFILL, Reason
from connectors.postgres.signals import BackfillRequest, Cursor, NotASignal, signing_key
from core.errors import BACKFILL_QUERY, by_sqlstate
from core.events import UNCHANGED_TOAST, RawChange, RawRow, RawValue, ReadOf, Table
from core.ids import row_key
from core.metrics import Metrics
from transforms.filter import SinkFilter

log = logging.getLogger("walflow.backfill")

#: How often a backfill waiting its turn writes a checkpoint (seconds).
_CHECKPOINT_EVERY: Final = 5.0
#: How often progress is logged (seconds); a terminal gets a line every second.
_LOG_EVERY: Final = 60.0
_BACKOFF_MIN, _BACKOFF_MAX = 0.5, 30.0
#: A SELECT may take this many times its budget before it is cancelled and the chunk halved.
_TIMEOUT_FACTOR: Final = 10
#: Chunks a table may have read and not yet emitted: one being emitted, one read ahead.
_AHEAD: Final = 2
_NO_REWIND: Final = object()


class BackfillState(TypedDict):
    """One running backfill in the partition's snapshot: plain data."""

    request: dict[str, str | None]
    after: Cursor | None
    rows: int


@dataclass(slots=True)
class _Pending:
    """A chunk handed over: where it starts, and whether the partition took its rows (then
    it will emit all of them: a reconnect must not read it again)."""

    start: Cursor | None
    taken: bool = False


@dataclass(slots=True)
class _Job:
    """One backfill on the runner's side."""

    request: BackfillRequest
    after: Cursor | None
    rows: int
    estimate: int = 0
    started: float = field(default_factory=time.monotonic)
    #: The columns that identify a row (known once the table is described).
    key_columns: tuple[str, ...] | None = None
    #: The table its changes are published under: a partition's parent (``Catalog``).
    published_as: str | None = None
    #: Chunks handed over whose high watermark the partition has not reached yet, by
    #: number; ``changed`` is notified as they go.
    pending: dict[int, _Pending] = field(default_factory=dict)
    #: The chunk size reached so far: kept across reconnects.
    limit: int | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)
    #: A chunk the partition dropped: where to read again from (``_NO_REWIND``: none).
    rewind: Cursor | None | object = _NO_REWIND
    done: bool = False
    thread: threading.Thread | None = None
    #: When its progress was last logged.
    logged_at: float = field(default_factory=time.monotonic)


class BackfillRunner:
    """Reads the tables of running backfills in chunks between watermarks, a thread per table."""

    def __init__(self, db: DatabaseConfig, settings: BackfillSettings, *, progress_line: bool | None = None) -> None:
        self.db = db
        self.settings = settings
        #: Names this run's watermarks: only this run holds the rows of its chunks.
        self.run_id = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._queue: list[str] = []
        self._ready: dict[tuple[str, int], Chunk] = {}
        self._chunk_numbers = itertools.count()
        self._stopping = threading.Event()
        self._checkpoints = threading.Thread(target=self._checkpoint_waiting, name="walflow-backfill-queue", daemon=True)
        self._progress_line = sys.stderr.isatty() if progress_line is None else progress_line
        #: What every signal this runner writes is signed with (walflow.backfill.secret).
        self._key = signing_key(settings)

    # -- what the partition calls -----------------------------------------------------------

    def start(self, request: BackfillRequest, after: Cursor | None, rows: int) -> None:
        """Run ``request`` from ``after`` on (now, or when a table's turn comes)."""
        with self._lock:
            if request.id in self._jobs:
                return
            self._jobs[request.id] = _Job(request, after, rows)
            self._queue.append(request.id)
            self._start_waiting()
            if not self._checkpoints.is_alive() and not self._stopping.is_set():
                self._checkpoints.start()

    def take(self, backfill: str, chunk: int) -> Chunk | None:
        """The rows of this run's chunk ``chunk`` of ``backfill``, at its high watermark: the
        partition emits every one of them."""
        with self._lock:
            found = self._ready.pop((backfill, chunk), None)
            job = self._jobs.get(backfill)
        if found is not None and job is not None:
            with job.changed:
                if (pending := job.pending.get(chunk)) is not None:
                    pending.taken = True
        return found

    def described(self, backfill: str) -> tuple[tuple[str, ...] | None, str | None]:
        """The key columns of the backfill's table, and the name its changes are published
        under (a partition's are its parent's): what its windows match changes by."""
        with self._lock:
            job = self._jobs.get(backfill)
            return (None, None) if job is None else (job.key_columns, job.published_as)

    def emitted(self, backfill: str, chunk: int, rows: int, *, accepted: bool = True) -> None:
        """The partition emitted the chunk (or, not ``accepted``, dropped it): the runner
        may read another one (or that one again)."""
        with self._lock:
            job = self._jobs.get(backfill)
        if job is None:
            return
        with job.changed:
            pending = job.pending.pop(chunk, None)
            if pending is None:
                return  # forgotten: the runner reads it again anyway
            job.rows += rows
            if not accepted and job.rewind is _NO_REWIND:
                job.rewind = pending.start
            job.changed.notify_all()

    def finished(self, backfill: str) -> None:
        """The partition saw the backfill end: another table may start."""
        with self._lock:
            job = self._jobs.pop(backfill, None)
            if job is not None:
                with job.changed:
                    job.done = True
                    job.changed.notify_all()
                self._queue = [b for b in self._queue if b != backfill]
                self._start_waiting()

    def progress(self) -> list[dict[str, object]]:
        """Each backfill's figures, as ``walflow status`` and the health endpoint show them."""
        now = time.monotonic()
        with self._lock:
            jobs = list(self._jobs.values())
        out: list[dict[str, object]] = []
        for job in jobs:
            elapsed = now - job.started
            rate = job.rows / elapsed if elapsed > 0 and job.thread is not None else 0.0
            remaining = max(job.estimate - job.rows, 0)
            out.append({
                "id": job.request.id, "sink": job.request.sink, "table": job.request.table,
                "state": "running" if job.thread is not None else "waiting",
                "rows": job.rows, "estimate": job.estimate, "rows_per_s": round(rate, 1),
                "eta_s": round(remaining / rate, 1) if rate > 0 and job.estimate else None,
            })
        return out

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            with job.changed:
                job.changed.notify_all()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(5)
        if self._progress_line:
            sys.stderr.write("\n")

    # -- the threads ----------------------------------------------------------------------

    def _start_waiting(self) -> None:
        """Start queued jobs while fewer than ``max_concurrent`` run (under the lock)."""
        running = sum(1 for j in self._jobs.values() if j.thread is not None)
        while self._queue and running < self.settings.max_concurrent and not self._stopping.is_set():
            job = self._jobs[self._queue.pop(0)]
            job.started = job.logged_at = time.monotonic()
            job.thread = threading.Thread(target=self._run, args=(job,), name=f"walflow-backfill-{job.request.table}",
                                          daemon=True)
            job.thread.start()
            running += 1

    def _connect(self, purpose: str) -> psycopg.Connection[Any]:
        timeout = _TIMEOUT_FACTOR * self.settings.query_budget_ms
        return psycopg.connect(
            conninfo(self.db, application_name=f"walflow:{self.db.slot.name}:{purpose}",
                     settings={"statement_timeout": f"{timeout}ms"}),
            autocommit=True,
        )

    def _signal(self, kind: signals.Kind, job: _Job, **fields: Any) -> signals.Signal:
        return signals.Signal(kind, self.db.slot.name, job.request, run=self.run_id, rows=job.rows,
                              estimate=job.estimate, **fields)

    def _run(self, job: _Job) -> None:
        """Read ``job``'s table chunk by chunk until its last one is emitted; reconnect after failures."""
        delay = _BACKOFF_MIN
        request = job.request
        log.info("backfill %s of %s for sink %s: starting%s", request.id, request.table, request.sink,
                 "" if job.after is None else f" where it stopped, after {job.rows:,} row(s)")
        while not self._stopping.is_set():
            try:
                with self._connect("backfill") as conn:
                    try:
                        reader = TableReader(conn, self.db.publication.name, request, self.settings, job.limit,
                                             database=self.db.name)
                    except BackfillRefused as exc:
                        self._end(conn, job, str(exc))
                        return
                    job.estimate = max(reader.estimate, job.rows)
                    job.key_columns = reader.key_columns
                    job.published_as = reader.table.qualified
                    if self._chunks(conn, job, reader):
                        return
            except psycopg.Error as exc:
                if by_sqlstate(BACKFILL_QUERY, exc.sqlstate, "retry") == "end":
                    dropped = exc.sqlstate == "42P01"
                    self._end_after_failure(job, f"table {request.table} was dropped" if dropped
                                            else str(exc).strip().splitlines()[0])
                    return
                self._forget_chunks(job)
                log.warning("backfill %s of %s interrupted: %s; retrying in %.1fs", request.id, request.table,
                            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
            except Exception as exc:
                # a thread that died silently would hold the slot's floor for ever
                log.exception("backfill %s of %s failed", request.id, request.table)
                self._end_after_failure(job, f"walflow failed: {type(exc).__name__}: {exc}")
                return

    def _chunks(self, conn: psycopg.Connection[Any], job: _Job, reader: TableReader) -> bool:
        """Chunks until the table's last is emitted; True when done, False to stop.

        One chunk is read ahead: chunk k+1's low watermark is written after chunk k's high
        one, so the partition, reading in WAL order, never has two windows of a table open
        at once, and the ``SELECT`` of the next chunk overlaps the emission of this one.
        """
        after = job.after
        while not self._stopping.is_set():
            with job.changed:
                job.changed.wait_for(lambda: len(job.pending) < _AHEAD or self._stopping.is_set() or job.done)
                rewind = job.rewind
            if rewind is not _NO_REWIND:  # a chunk was dropped: it and those read after it are read again
                self._forget_chunks(job, rewind)
                after = job.after
            if self._stopping.is_set() or job.done:
                return job.done
            number = next(self._chunk_numbers)
            signals.emit(conn, self._signal("low", job, chunk=number, after=after), self._key)
            wait_for_commits_in_flight(conn, self.settings.query_budget_ms / 1000, self._stopping.wait)
            started = time.monotonic()
            try:
                chunk = reader.read(after)
            except psycopg.Error as exc:
                if by_sqlstate(BACKFILL_QUERY, exc.sqlstate, "retry") != "shrink":
                    raise
                if reader.limit == 1:  # it will never get faster
                    self._end(conn, job, f"a chunk of one row ran past the statement timeout "
                              f"({_TIMEOUT_FACTOR * self.settings.query_budget_ms} ms): index the table's "
                              f"{job.request.sort_column or 'key'} column, or raise walflow.backfill.query_budget_ms")
                    return False
                reader.shrink()
                job.limit = reader.limit
                log.info("backfill %s of %s: a chunk ran past the statement timeout; reading %d rows at a time",
                         job.request.id, job.request.table, reader.limit)
                continue
            seconds = time.monotonic() - started
            last = len(chunk.rows) < reader.limit
            with self._lock:
                self._ready[(job.request.id, number)] = chunk
            with job.changed:
                job.pending[number] = _Pending(after)
            signals.emit(conn, self._signal("high", job, chunk=number, after=after, last=last), self._key)
            reader.adapt(len(chunk.rows), seconds, chunk.memory)
            job.limit = reader.limit
            self._report(job)
            if chunk.end is not None:
                after = job.after = chunk.end
            if last:  # done once the partition emitted it (finished() ends the job), unless it dropped it
                with job.changed:
                    job.changed.wait_for(lambda: job.done or self._stopping.is_set() or job.rewind is not _NO_REWIND)
                    if job.done or self._stopping.is_set():
                        return job.done
        return False

    def _end(self, conn: psycopg.Connection[Any], job: _Job, error: str) -> None:
        """Tell the partition (through the slot) that this backfill ends unfinished."""
        signals.emit(conn, self._signal("high", job, after=job.after, last=True, error=error), self._key)

    def _end_after_failure(self, job: _Job, error: str) -> None:
        self._forget_chunks(job)
        delay = _BACKOFF_MIN
        while not self._stopping.is_set():
            try:
                with self._connect("backfill") as conn:
                    self._end(conn, job, error)
                    return
            except psycopg.Error:
                self._stopping.wait(delay)
                delay = min(delay * 2, _BACKOFF_MAX)

    def _forget_chunks(self, job: _Job, start: Cursor | None | object = _NO_REWIND) -> None:
        """Chunks whose high watermark may never come, or that follow a dropped one: the
        next attempt reads again from ``start``, else from where the oldest of them not taken
        by the partition began (a taken one is emitted whole: reading it again after a long
        outage would publish it twice, past the duplicate window)."""
        with job.changed:
            if start is _NO_REWIND:
                not_taken = [n for n, p in job.pending.items() if not p.taken]
                if not_taken:
                    start = job.pending[min(not_taken)].start
            if start is not _NO_REWIND:
                job.after = start  # type: ignore[assignment]
            job.pending.clear()
            job.rewind = _NO_REWIND
            job.changed.notify_all()
        with self._lock:
            for key in [k for k in self._ready if k[0] == job.request.id]:
                del self._ready[key]

    def _checkpoint_waiting(self) -> None:
        """Backfills waiting their turn write a checkpoint now and then, so the slot moves on."""
        conn: psycopg.Connection[Any] | None = None
        while not self._stopping.wait(_CHECKPOINT_EVERY):
            with self._lock:  # what each says is taken now: a job that starts meanwhile only moves on from it
                waiting = [(self._jobs[b], self._jobs[b].after) for b in self._queue if b in self._jobs]
            if not waiting:
                continue
            try:
                if conn is None or conn.closed:
                    conn = self._connect("backfill-queue")
                for job, after in waiting:
                    signals.emit(conn, self._signal("low", job, after=after), self._key)
            except psycopg.Error as exc:
                log.warning("backfill checkpoint not written: %s", str(exc).strip())
                conn = None
        if conn is not None:
            conn.close()

    def _report(self, job: _Job) -> None:
        now = time.monotonic()
        if self._progress_line:
            line = "  ".join(_progress_text(p) for p in self.progress() if p["state"] == "running")
            sys.stderr.write(f"\r\x1b[Kbackfill {line}")
            sys.stderr.flush()
        if now - job.logged_at >= _LOG_EVERY:
            job.logged_at = now
            for p in self.progress():
                if p["id"] == job.request.id:
                    log.info("backfill %s: %s", job.request.id, _progress_text(p))


def _progress_text(p: dict[str, object]) -> str:
    estimate = p["estimate"]
    done = f"{p['rows']:,}" + (f"/~{estimate:,}" if estimate else "")
    eta = f", ETA {p['eta_s']:.0f}s" if p["eta_s"] is not None else ""
    return f"{p['table']} → {p['sink']}: {done} rows, {p['rows_per_s']:,.0f} rows/s{eta}"


@dataclass(slots=True)
class Release:
    """A chunk's reads, handed to Bytewax in slices at their high watermark (a slice per
    ``next_batch``, so conversion and publishing overlap as for changes); ``done`` once
    all are out. Until then the chunk counts as not emitted: a snapshot resumes before it."""

    reads: list[RawChange]
    row_memory: int
    done: Callable[[], None]
    _next: int = 0

    def take(self, limit: int) -> list[RawChange]:
        start, self._next = self._next, min(self._next + limit, len(self.reads))
        return self.reads[start:self._next]

    @property
    def empty(self) -> bool:
        return self._next >= len(self.reads)


@dataclass(slots=True)
class _Running:
    """One backfill on the partition's side."""

    request: BackfillRequest
    #: Where a resume continues: after the last chunk emitted (None: the table's start).
    after: Cursor | None
    rows: int
    #: The position before its newest request/low signal: nothing past it is confirmed.
    floor: int
    #: This run's open window: its chunk number, and the keys changed in it.
    window: int | None = None
    changed: set[str] = field(default_factory=set)
    key_columns: tuple[str, ...] | None = None
    #: The table name the open window matches changes by (:meth:`BackfillRunner.described`).
    window_table: str = ""
    #: Something in the window that no key can name (a truncate, a key column without a
    #: value): the chunk is read again rather than trusted.
    doubt: bool = False
    #: A chunk was dropped: later ones are dropped too until the runner starts again from
    #: ``after`` (a chunk read ahead must not move ``after`` past the dropped one).
    rewinding: bool = False


def _unreported(prefix: str, reason: Reason, detail: str) -> None:
    """Where refusals go when nobody counts them (unit tests of the windows)."""


@dataclass(frozen=True)
class Admission:
    """Whether a backfill may run: decided by the config, never by the signal that asks.

    A request, or an earlier run's watermark (which resumes its backfill), names a sink and
    a table. It runs only if the sink is an enabled sink of this database that reads the
    table by the same rules as its live changes (``source:``, ``table:``), and the sink has
    fewer than ``max_pending`` running or waiting (a second request for a table is a
    backfill of its own: it may start elsewhere, or follow a finished one). Refusals are reported once each (``report``: the slot's
    :class:`~connectors.postgres.messages.IgnoredMessages`) and never read.
    """

    #: The sinks a backfill may be for, by name: their table rules.
    sinks: Mapping[str, SinkFilter]
    #: Signals must be signed with this key (walflow.backfill.secret), if set.
    key: bytes | None = None
    max_pending: int = BackfillSettings().max_pending
    report: Callable[[str, Reason, str], None] = _unreported

    @classmethod
    def of(cls, sinks: Iterable[SinkConfig], settings: BackfillSettings,
           report: Callable[[str, Reason, str], None] = _unreported) -> Admission:
        return cls({s.name: SinkFilter(s) for s in sinks}, signing_key(settings), settings.max_pending, report)

    def refusal(self, request: BackfillRequest, pending: Iterable[BackfillRequest]) -> NotASignal | None:
        """Why ``request`` may not run beside the backfills ``pending`` (None: it may)."""
        rules = self.sinks.get(request.sink)
        if rules is None:
            return NotASignal("refused", f"backfill {request.id}: no enabled sink {request.sink!r} reads this database")
        schema, dot, _ = request.table.partition(".")
        if not dot or not rules.admits(schema, request.table):
            return NotASignal("refused", f"backfill {request.id}: sink {request.sink} does not read {request.table!r} "
                                         "(its source: and table:)")
        same = sum(1 for p in pending if p.sink == request.sink)
        if same >= self.max_pending:
            return NotASignal("too_many", f"backfill {request.id}: sink {request.sink} has {same} backfills "
                                          "running or waiting (walflow.backfill.max_pending)")
        return None


class Backfills:
    """The partition's side of backfills: which run, their windows, how far the slot may move."""

    def __init__(self, slot: str, admission: Admission, runner: BackfillRunner,
                 resume: list[BackfillState] | None = None, resume_lsn: int = 0, *,
                 metrics: Metrics | None = None) -> None:
        """``metrics``: the process's, which count the rows and chunks handed on (else its own)."""
        self._slot = slot
        self._metrics = metrics or Metrics()
        self._admission = admission
        self._runner = runner
        self._running: dict[str, _Running] = {}
        #: Tables with an open window → their backfills (several sinks may read one table).
        self._windows: dict[str, list[_Running]] = {}
        #: Per table version, the positions of a window's key columns in its rows.
        self._positions: dict[tuple[str, tuple[str, ...]], tuple[Table, tuple[int, ...]]] = {}
        for state in resume or []:
            request = BackfillRequest(**state["request"])  # type: ignore[arg-type]
            refused = admission.refusal(request, (r.request for r in self._running.values()))
            if refused is not None:  # the config changed since the snapshot
                log.warning("%s: dropped", refused.detail)
                continue
            self._running[request.id] = _Running(request, state["after"], state["rows"], resume_lsn)
            runner.start(request, state["after"], state["rows"])

    @property
    def floor(self) -> int | None:
        """The position the slot may be confirmed up to at most, while backfills run."""
        return min((r.floor for r in self._running.values()), default=None)

    @property
    def watching(self) -> bool:
        """Whether changes must be shown to :meth:`observe` (a window is open)."""
        return bool(self._windows)

    def stop(self) -> None:
        self._runner.stop()

    def snapshot(self) -> list[BackfillState]:
        return [
            {"request": asdict(r.request), "after": r.after, "rows": r.rows} for r in self._running.values()
        ]

    def observe(self, change: RawChange) -> None:
        """A change inside an open window: its row's key is noted, so the chunk's stale copy is dropped."""
        running = self._windows.get(change.table.qualified)
        if running is None:
            return
        for backfill in running:
            if change.action == "truncate":
                backfill.doubt = True
                continue
            assert backfill.key_columns is not None
            at = self._key_positions(change.table, backfill.key_columns)
            if at is None:
                backfill.doubt = True
                continue
            # both rows, for an update that changed the key
            for row, other in ((change.new, change.old), (change.old, change.new)):
                if row is not None:
                    key = _key(row, other, at)
                    if key is None:
                        backfill.doubt = True
                    else:
                        backfill.changed.add(key)

    def on_signal(self, item: Signal, position: int) -> Release | None:
        """A backfill signal decoded at ``position`` (the last marker before it); at a high
        watermark, the chunk's reads to emit right here, before anything after it."""
        signal = signals.decode(item.content, self._slot, self._admission.key)
        if signal is None:
            return None  # another slot's
        if isinstance(signal, NotASignal):
            self._admission.report(BACKFILL, signal.reason, signal.detail)
            return None
        request = signal.request
        running = self._running.get(request.id)
        own = signal.run == self._runner.run_id
        if running is None:
            if not own:  # a request, or an earlier run's watermark of a backfill this run has not seen yet
                self._begin(signal, position)
            return None  # else: one that already ended in this run
        if signal.kind == "low" and own:
            running.floor = position
            if signal.chunk is not None:
                if running.rewinding and signal.after == running.after:
                    running.rewinding = False  # the runner starts again where the stream stands
                self._open(running, signal.chunk)
        elif signal.kind == "high" and own:
            return self._high(running, signal, item)
        return None  # a request seen again, or another run's watermark: nothing new

    # -- steps ------------------------------------------------------------------------------

    def _begin(self, signal: signals.Signal, position: int) -> None:
        request = signal.request
        if signal.kind == "high" and signal.last and signal.error:
            return  # another run's backfill that ended unfinished
        refused = self._admission.refusal(request, (r.request for r in self._running.values()))
        if refused is not None:
            self._admission.report(BACKFILL, refused.reason, refused.detail)
            return
        if signal.kind != "request":
            log.info("backfill %s of %s for sink %s: resuming after %s row(s)", request.id, request.table,
                     request.sink, f"{signal.rows:,}")
        self._running[request.id] = _Running(request, signal.after, signal.rows, position)
        self._runner.start(request, signal.after, signal.rows)

    def _open(self, running: _Running, chunk: int) -> None:
        self._close(running)
        running.key_columns, published_as = self._runner.described(running.request.id)
        running.window_table = published_as or running.request.table
        running.window, running.changed, running.doubt = chunk, set(), False
        self._windows.setdefault(running.window_table, []).append(running)

    def _close(self, running: _Running) -> None:
        if running.window is None:
            return
        running.window = None
        table = running.window_table
        remaining = [r for r in self._windows.get(table, []) if r is not running]
        if remaining:
            self._windows[table] = remaining
        else:
            self._windows.pop(table, None)

    def _high(self, running: _Running, signal: signals.Signal, item: Signal) -> Release | None:
        request = running.request
        if signal.error:
            log.error("backfill %s of %s for sink %s stopped: %s", request.id, request.table, request.sink,
                      signal.error)
            self._finish(running)
            return None
        number = signal.chunk
        watched, doubt, changed = running.window == number, running.doubt, running.changed
        self._close(running)  # changes after the high watermark follow the reads in the stream
        if number is None:
            return None
        if not watched or doubt or running.rewinding:
            # not watched from its low watermark on, or a change no key names: its rows cannot be trusted
            running.rewinding = True
            log.info("backfill %s of %s: chunk %d is read again (%s)", request.id, request.table, number,
                     "a truncate or an unkeyed change in its window" if doubt else "its window was not watched")
            self._runner.emitted(request.id, number, 0, accepted=False)
            return None
        chunk = self._runner.take(request.id, number)
        if chunk is None:
            return None  # its rows are gone (a retried chunk): the runner reads it again
        sink, backfill, table, lsn, ts = request.sink, request.id, chunk.table, item.commit_lsn, item.commit_ts
        reads = [
            RawChange("read", table, row, None, False, lsn, idx, ts, 0, ReadOf(sink, backfill, key))
            for idx, (row, key) in enumerate(
                ((row, key) for row, key in zip(chunk.rows, chunk.keys, strict=True) if key not in changed), 1)
        ]

        def emitted() -> None:
            """All of the chunk's reads are out: a resume starts after it."""
            if chunk.end is not None:
                running.after = chunk.end
            running.rows += len(reads)
            self._metrics.backfill_rows.labels(request.sink, request.table).inc(len(reads))
            self._metrics.backfill_chunks.labels(request.sink, request.table).inc()
            if signal.last:
                log.info("backfill %s of %s for sink %s: done, %s row(s)", request.id, request.table, request.sink,
                         f"{running.rows:,}")
                self._finish(running)
            else:
                self._runner.emitted(request.id, number, len(reads))

        return Release(reads, chunk.row_memory, emitted)

    def _finish(self, running: _Running) -> None:
        self._close(running)
        self._running.pop(running.request.id, None)
        self._runner.finished(running.request.id)

    def _key_positions(self, table: Table, columns: tuple[str, ...]) -> tuple[int, ...] | None:
        """Where ``columns`` are in ``table``'s rows; None if one is missing. One entry per
        table, however many versions (a Relation per session and DDL) come by."""
        cached = self._positions.get((table.qualified, columns))
        if cached is None or cached[0] is not table:
            positions = table.positions
            at = tuple(positions[c] for c in columns) if all(c in positions for c in columns) else ()
            cached = (table, at)
            self._positions[(table.qualified, columns)] = cached
        return cached[1] or None


def _key(row: RawRow, other: RawRow | None, at: tuple[int, ...]) -> str | None:
    """The row's key (:func:`core.ids.row_key` of its key columns' texts); an untouched TOASTed
    key value is taken from the other row when it has it. None: the key is not known."""
    values: list[RawValue] = []
    for i in at:
        value = row[i]
        if value is UNCHANGED_TOAST:
            value = UNCHANGED_TOAST if other is None else other[i]
            if value is UNCHANGED_TOAST:
                return None
        values.append(value)
    return row_key(values)

