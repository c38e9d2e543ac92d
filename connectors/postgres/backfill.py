"""Backfills, the partition's side: a table's existing rows as ``read`` events, consistent with the stream.

DBLog's watermarks, with the slot as the only store (the README's "Backfills" says why).
The runner (:mod:`connectors.postgres.backfill_runner`) writes a chunk's **low watermark**
into the WAL, reads the chunk and writes its **high watermark**. :class:`Backfills`, fed in
WAL order, notes the key of every change to the chunk's table between the two, and at the
high watermark emits the chunk's rows as reads (:class:`Release`) but those whose key
changed in the window: the change, already in the stream, is at least as new.

It never confirms past the newest ``request`` or ``low`` signal of a running backfill
(:attr:`Backfills.floor`), and each ``low`` says where its chunk starts: a replay passes it
and the backfill continues from the last chunk whose reads were durable; with ``-r``,
:meth:`Backfills.snapshot` holds the same (:class:`BackfillState`).

A signal starts a backfill only if :func:`~connectors.postgres.signals.decode` takes it
(well-formed, signed with ``walflow.backfill.secret`` if set) and :class:`Admission` allows it.

Everything it tells the runner or takes from it goes through the runner's
:class:`~connectors.postgres.backfill_protocol.Handoff`: ``begin``, ``take`` (a chunk's rows at
its high watermark) and ``settled`` (emitted, dropped, ended); the table a window watches is
the one the previous chunk was read as, asked once per backfill, and a chunk read as another
(a reconnect after DDL) is read again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TypedDict

from config.schema import BackfillSettings, SinkConfig
from connectors.postgres import signals
from connectors.postgres.backfill_protocol import Handoff
from connectors.postgres.backfill_runner import BackfillRunner
from connectors.postgres.decoder import Signal
from connectors.postgres.messages import BACKFILL, Reason
from connectors.postgres.signals import BackfillRequest, Cursor, NotASignal, signing_key
from core.events import UNCHANGED_TOAST, RawChange, RawRow, RawValue, ReadOf, Table, new_tuple
from core.ids import row_key
from core.metrics import Metrics

__all__ = ["Admission", "BackfillRunner", "BackfillState", "Backfills", "Release"]

log = logging.getLogger("walflow.backfill")


class BackfillState(TypedDict):
    """One running backfill in the partition's snapshot: plain data."""

    request: dict[str, str | None]
    after: Cursor | None
    rows: int


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
    #: The table its windows watch, as its last chunk was read (at first: as the runner
    #: described it); the open window matches changes by its key columns and name.
    table: Table | None = None
    key_columns: tuple[str, ...] | None = None
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

    #: The sinks a backfill may be for, by name: their table rules (:meth:`SinkConfig.reads`).
    sinks: Mapping[str, SinkConfig]
    #: Signals must be signed with this key (walflow.backfill.secret), if set.
    key: bytes | None = None
    max_pending: int = BackfillSettings().max_pending
    report: Callable[[str, Reason, str], None] = _unreported

    @classmethod
    def of(cls, sinks: Iterable[SinkConfig], settings: BackfillSettings,
           report: Callable[[str, Reason, str], None] = _unreported) -> Admission:
        return cls({s.name: s for s in sinks}, signing_key(settings), settings.max_pending, report)

    def refusal(self, request: BackfillRequest, pending: Iterable[BackfillRequest]) -> NotASignal | None:
        """Why ``request`` may not run beside the backfills ``pending`` (None: it may)."""
        sink = self.sinks.get(request.sink)
        if sink is None:
            return NotASignal("refused", f"backfill {request.id}: no enabled sink {request.sink!r} reads this database")
        schema, dot, _ = request.table.partition(".")
        if not dot or not sink.reads(schema, request.table):
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
        self._handoff: Handoff = runner.handoff
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
            with self._handoff as ledger:
                ledger.begin(request, state["after"], state["rows"])

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
        signal = signals.decode(item.content, self._slot, self._admission.key, self._runner.seal)
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
        rows = signal.rows
        if signal.unknown_position:
            rows = 0
            log.warning("backfill %s of %s for sink %s: starting again from the table's start: an earlier run sealed "
                        "where it stood with a key of its own (a sink hides columns of the table); set "
                        "walflow.backfill.secret to resume where it stopped", request.id, request.table, request.sink)
        elif signal.kind != "request":
            log.info("backfill %s of %s for sink %s: resuming after %s row(s)", request.id, request.table,
                     request.sink, f"{rows:,}")
        self._running[request.id] = _Running(request, signal.after, rows, position)
        with self._handoff as ledger:
            ledger.begin(request, signal.after, rows)

    def _open(self, running: _Running, chunk: int) -> None:
        self._close(running)
        if running.table is None:
            with self._handoff as ledger:
                running.table = ledger.described(running.request.id)
        table = running.table
        running.key_columns = None if table is None else table.key_columns
        running.window_table = running.request.table if table is None else table.qualified
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
        watched_as = (running.window_table, running.key_columns)
        self._close(running)  # changes after the high watermark follow the reads in the stream
        if number is None:
            return None
        why = None
        if doubt:
            why = "a truncate or an unkeyed change in its window"
        elif not watched or running.rewinding:
            why = "its window was not watched"
        with self._handoff as ledger:
            chunk = None if why else ledger.take(request.id, number)
            if chunk is not None and (chunk.table.qualified, chunk.table.key_columns) != watched_as:
                running.table, why = chunk.table, "its table was described anew"
            if why:
                ledger.settled(request.id, number, 0, "dropped")
        if why:
            # not watched from its low watermark on (or as another table), or a change no key
            # names: its rows cannot be trusted
            running.rewinding = True
            log.info("backfill %s of %s: chunk %d is read again (%s)", request.id, request.table, number, why)
            return None
        if chunk is None:
            return None  # its rows are gone (a retried chunk): the runner reads it again
        sink, backfill, table, lsn, ts = request.sink, request.id, chunk.table, item.commit_lsn, item.commit_ts
        # each row's RawChange and ReadOf made as their NamedTuple.__new__ makes them, without that
        # function's frame: half the time per row (a chunk is up to thousands of rows)
        reads: list[RawChange] = [
            new_tuple(RawChange, ("read", table, row, None, False, lsn, idx, ts, 0,
                                  new_tuple(ReadOf, (sink, backfill, key)), None))
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
                with self._handoff as ledger:
                    ledger.settled(request.id, number, len(reads), "emitted")

        return Release(reads, chunk.row_memory, emitted)

    def _finish(self, running: _Running) -> None:
        self._close(running)
        self._running.pop(running.request.id, None)
        with self._handoff as ledger:
            ledger.settled(running.request.id, None, 0, "ended")

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

