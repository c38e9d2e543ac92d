"""One backfill's table, read chunk by chunk between watermarks on a connection of its own.

A thread per running backfill (:class:`TableLoop`): it connects, describes the table
(:class:`~connectors.postgres.chunks.TableReader`, which sizes its chunks), and asks the
ledger (:mod:`connectors.postgres.backfill_protocol`) for each next chunk: it writes the
low watermark the ledger gives, waits for commits in flight, reads the chunk, hands its
rows over and writes the high watermark. The ledger makes it wait while two chunks are
handed and not settled, and says where to read again after a dropped chunk or a reconnect.

Errors are sorted by :data:`core.errors.BACKFILL_QUERY`: a ``SELECT`` past the statement
timeout (``10 × query_budget_ms``) halves the chunk (at one row the backfill ends saying
why); an error that will not go away (the table dropped, ``SELECT`` revoked) ends the
backfill with a high watermark carrying the error; anything else reconnects with backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg

from config.schema import BackfillSettings, DatabaseConfig
from connectors.postgres import signals
from connectors.postgres.backfill_protocol import DONE, Handoff
from connectors.postgres.chunks import BackfillRefused, TableReader, wait_for_commits_in_flight
from connectors.postgres.connection import conninfo
from connectors.postgres.outage import OutageLog
from connectors.postgres.signals import BackfillRequest
from core.errors import BACKFILL_QUERY, by_sqlstate

log = logging.getLogger("walflow.backfill")

_BACKOFF_MIN, _BACKOFF_MAX = 0.5, 30.0
#: A SELECT may take this many times its budget before it is cancelled and the chunk halved.
_TIMEOUT_FACTOR: Final = 10


def connect(db: DatabaseConfig, settings: BackfillSettings, purpose: str) -> psycopg.Connection[Any]:
    """A backfill's connection: autocommit, the pinned output settings, the statement timeout."""
    timeout = _TIMEOUT_FACTOR * settings.query_budget_ms
    return psycopg.connect(
        conninfo(db, application_name=f"walflow:{db.slot.name}:{purpose}",
                 settings={"statement_timeout": f"{timeout}ms"}),
        autocommit=True,
    )


class TableLoop:
    """Reads ``request``'s table until the partition settles its last chunk (or it ends)."""

    def __init__(self, request: BackfillRequest, db: DatabaseConfig, settings: BackfillSettings, handoff: Handoff,
                 key: bytes | None, report: Callable[[str], None], seal: signals.CursorSeal | None = None) -> None:
        """``key``: what signals are signed with; ``report(id)``: called after each chunk;
        ``seal``: what seals the positions its watermarks carry."""
        self.request, self._db, self._settings = request, db, settings
        self._handoff, self._key, self._report, self._seal = handoff, key, report, seal
        #: The chunk size reached so far: kept across reconnects.
        self._limit: int | None = None
        #: A server crash says "interrupted" once, not once per attempt while it recovers.
        self._outage = OutageLog(log)

    def run(self) -> None:
        """Read chunk by chunk until done; reconnect after failures."""
        delay = _BACKOFF_MIN
        request, stopping = self.request, self._handoff.stopping
        while not stopping.is_set():
            try:
                with connect(self._db, self._settings, "backfill") as conn:
                    try:
                        reader = TableReader(conn, self._db.publication.name, request, self._settings, self._limit,
                                             database=self._db.name)
                    except BackfillRefused as exc:
                        self._end(conn, str(exc))
                        return
                    with self._handoff as ledger:
                        ledger.connected(request.id, reader.table, reader.estimate)
                    self._outage.recovered(f"backfill {request.id} of {request.table} reads")
                    delay = _BACKOFF_MIN  # the next outage is a new one
                    self._chunks(conn, reader)
                    return
            except psycopg.Error as exc:
                if by_sqlstate(BACKFILL_QUERY, exc.sqlstate, "retry") == "end":
                    dropped = exc.sqlstate == "42P01"
                    self._end_after_failure(f"table {request.table} was dropped" if dropped
                                            else str(exc).strip().splitlines()[0])
                    return
                with self._handoff as ledger:
                    ledger.lost(request.id)
                kind = "connection" if isinstance(exc, psycopg.OperationalError) else exc.sqlstate or "error"
                self._outage.failed(kind, "backfill %s of %s interrupted: %s; retrying in %.1fs",
                                    request.id, request.table,
                                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, delay)
                stopping.wait(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
            except Exception as exc:
                # a thread that died silently would hold the slot's floor for ever
                log.exception("backfill %s of %s failed", request.id, request.table)
                self._end_after_failure(f"walflow failed: {type(exc).__name__}: {exc}")
                return

    def _chunks(self, conn: psycopg.Connection[Any], reader: TableReader) -> None:
        """Chunks until the backfill is done, it ends, or the runner stops.

        One chunk is read ahead: chunk k+1's low watermark is written after chunk k's high
        one, so the partition, reading in WAL order, never has two windows of a table open
        at once, and the ``SELECT`` of the next chunk overlaps the emission of this one.
        """
        backfill, handoff = self.request.id, self._handoff
        while (low := handoff.wait(lambda ledger: ledger.next_read(backfill))) not in (None, DONE):
            assert isinstance(low, signals.Signal)
            signals.emit(conn, low, self._key, self._seal)
            wait_for_commits_in_flight(conn, self._settings.query_budget_ms / 1000, handoff.stopping.wait)
            started = time.monotonic()
            try:
                chunk = reader.read(low.after)
            except psycopg.Error as exc:
                if by_sqlstate(BACKFILL_QUERY, exc.sqlstate, "retry") != "shrink":
                    raise
                if reader.limit == 1:  # it will never get faster
                    self._end(conn, f"a chunk of one row ran past the statement timeout "
                              f"({_TIMEOUT_FACTOR * self._settings.query_budget_ms} ms): index the table's "
                              f"{self.request.sort_column or 'key'} column, or raise walflow.backfill.query_budget_ms")
                    return
                reader.shrink()
                self._limit = reader.limit
                log.info("backfill %s of %s: a chunk ran past the statement timeout; reading %d rows at a time",
                         backfill, self.request.table, reader.limit)
                continue
            seconds = time.monotonic() - started
            with handoff as ledger:
                high = ledger.read(low, chunk, last=len(chunk.rows) < reader.limit)
            signals.emit(conn, high, self._key, self._seal)
            reader.adapt(len(chunk.rows), seconds, chunk.memory)
            self._limit = reader.limit
            self._report(backfill)

    def _end(self, conn: psycopg.Connection[Any], error: str) -> None:
        """Tell the partition (through the slot) that this backfill ends unfinished."""
        with self._handoff as ledger:
            high = ledger.ending(self.request, error)
        signals.emit(conn, high, self._key, self._seal)

    def _end_after_failure(self, error: str) -> None:
        with self._handoff as ledger:
            ledger.lost(self.request.id)
        delay = _BACKOFF_MIN
        while not self._handoff.stopping.is_set():
            try:
                with connect(self._db, self._settings, "backfill") as conn:
                    self._end(conn, error)
                    return
            except psycopg.Error:
                self._handoff.stopping.wait(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
