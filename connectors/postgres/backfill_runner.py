"""The backfill runner: the queue of backfills, and a thread per table whose turn came.

The partition posts to the runner's :class:`~connectors.postgres.backfill_protocol.Handoff`
(``runner.handoff``) and never calls the runner itself. One queue thread waits on it:
when the ledger says a table's turn came (fewer than ``max_concurrent`` read at once) it
starts that table's :class:`~connectors.postgres.backfill_table.TableLoop`, and every few
seconds it writes a checkpoint of each backfill still waiting, so that waiting does not
hold the slot back. :attr:`BackfillRunner.progress` gives the figures ``walflow status``
shows (:mod:`connectors.postgres.backfill_progress`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Final

import psycopg

from config.schema import BackfillSettings, DatabaseConfig
from connectors.postgres import signals
from connectors.postgres.backfill_progress import ProgressReport, figures
from connectors.postgres.backfill_protocol import Handoff, Ledger
from connectors.postgres.backfill_table import TableLoop, connect
from connectors.postgres.signals import signing_key

log = logging.getLogger("walflow.backfill")

#: How often a backfill waiting its turn writes a checkpoint (seconds).
_CHECKPOINT_EVERY: Final = 5.0


class BackfillRunner:
    """Reads the tables of running backfills in chunks between watermarks, a thread per table."""

    def __init__(self, db: DatabaseConfig, settings: BackfillSettings, *, progress_line: bool | None = None,
                 seal: signals.CursorSeal | None = None) -> None:
        """``seal``: whose positions this run's watermarks seal (default: none, keyed as the settings say)."""
        self.db = db
        self.settings = settings
        #: Names this run's watermarks: only this run holds the rows of its chunks.
        self.run_id = uuid.uuid4().hex[:12]
        #: Where the partition and the runner's threads meet.
        self.handoff = Handoff(Ledger(db.slot.name, self.run_id, settings.max_concurrent))
        self._report = ProgressReport(progress_line)
        #: What every signal this runner writes is signed with (walflow.backfill.secret).
        self._key = signing_key(settings)
        #: What seals the positions of tables a sink hides columns of; the partition opens them with it.
        self.seal = seal or signals.CursorSeal((), self._key)
        self._threads: list[threading.Thread] = []
        self._queue = threading.Thread(target=self._run_queue, name="walflow-backfill-queue", daemon=True)
        self._queue.start()

    def progress(self) -> list[dict[str, object]]:
        """Each backfill's figures, as ``walflow status`` and the health endpoint show them."""
        with self.handoff as ledger:
            return figures(ledger.entries(), time.monotonic())

    def stop(self) -> None:
        self.handoff.stop()
        self._queue.join(5)  # then no thread starts any more
        for thread in self._threads:
            thread.join(5)
        self._report.close()

    def _run_queue(self) -> None:
        """Start tables whose turn came; checkpoint the backfills that wait."""
        conn: psycopg.Connection[Any] | None = None
        due = time.monotonic() + _CHECKPOINT_EVERY
        while not self.handoff.stopping.is_set():
            turns = self.handoff.wait(lambda ledger: ledger.turns(time.monotonic()) or None,
                                      max(0.0, due - time.monotonic()))
            for turn in turns or []:
                self._start(turn)
            if time.monotonic() >= due and not self.handoff.stopping.is_set():
                due = time.monotonic() + _CHECKPOINT_EVERY
                conn = self._checkpoint(conn)
        if conn is not None:
            conn.close()

    def _start(self, turn: signals.Signal) -> None:
        request = turn.request
        log.info("backfill %s of %s for sink %s: starting%s", request.id, request.table, request.sink,
                 "" if turn.after is None else f" where it stopped, after {turn.rows:,} row(s)")
        self._report.started(request.id, time.monotonic())
        loop = TableLoop(request, self.db, self.settings, self.handoff, self._key, self._chunk_read, self.seal)
        thread = threading.Thread(target=loop.run, name=f"walflow-backfill-{request.table}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _checkpoint(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
        """Write each waiting backfill's checkpoint (what each says is taken now: a backfill
        that starts meanwhile only moves on from it); the connection to use next time."""
        with self.handoff as ledger:
            waiting = ledger.checkpoints()
        if not waiting:
            return conn
        try:
            if conn is None or conn.closed:
                conn = connect(self.db, self.settings, "backfill-queue")
            for checkpoint in waiting:
                signals.emit(conn, checkpoint, self._key, self.seal)
        except psycopg.Error as exc:
            log.warning("backfill checkpoint not written: %s", str(exc).strip())
            return None
        return conn

    def _chunk_read(self, backfill: str) -> None:
        self._report.chunk_read(backfill, self.progress(), time.monotonic())
