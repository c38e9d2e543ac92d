"""The runner protocol: what the partition and the runner's threads tell each other about backfills.

:class:`Ledger` is sans-IO, like the decoder: no thread, socket or clock (``now`` is given).
It holds every backfill the runner knows, takes the events of both sides and answers with
commands, mostly the signals to write:

- the partition: a backfill ``begin``\\s (a request, a resume), a high watermark ``take``\\s a
  chunk's rows, a chunk is ``settled`` (emitted, dropped, or the backfill ended);
- the queue: whose ``turns`` it is (at most ``max_concurrent`` read at once), the
  ``checkpoints`` of those waiting;
- a table's reading loop: ``connected`` (the table described), ``next_read`` (the low
  watermark to write, or wait: two chunks handed and not settled, or the last one not),
  ``read`` (a chunk read: the high watermark to write), ``lost`` (a reconnect), ``ending``.

What a reconnect or a dropped chunk reads again from: a dropped chunk's start, else the
oldest chunk not taken by the partition (a taken one is emitted whole). Chunk numbers are
the ledger's, one sequence per run.

:class:`Handoff` is the one place the two sides meet: the ledger behind one condition,
``with handoff as ledger:`` for an exchange, :meth:`Handoff.wait` for a thread that waits.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Literal, TypeVar

from connectors.postgres.chunks import Chunk
from connectors.postgres.signals import BackfillRequest, Cursor, Signal
from core.events import Table

#: Chunks a table may have read and not yet settled: one being emitted, one read ahead.
AHEAD: Final = 2
#: :meth:`Ledger.next_read`'s answer once a backfill ended: the loop stops.
DONE: Final = "done"
#: How the partition settled a chunk (``ended``: the backfill ended, by its last chunk or an error).
Settled = Literal["emitted", "dropped", "ended"]

T = TypeVar("T")


@dataclass(slots=True)
class Entry:
    """One backfill as the runner knows it, from ``begin`` until the partition ends it."""

    request: BackfillRequest
    #: Where the next chunk starts (waiting: where it resumes); None: the table's start.
    after: Cursor | None
    #: Rows emitted so far, and the table's estimated count.
    rows: int
    estimate: int = 0
    #: Its turn came (a loop reads its table), at ``started``.
    running: bool = False
    started: float = 0.0
    #: The table as its loop's connection described it: what windows match changes by.
    table: Table | None = None
    #: Chunks handed over and not settled: where each starts, by number.
    starts: dict[int, Cursor | None] = field(default_factory=dict)
    #: Their rows, until the partition takes them at the high watermark.
    untaken: dict[int, Chunk] = field(default_factory=dict)
    #: The last chunk was read: nothing more until it is settled (or dropped).
    read_last: bool = False
    #: A chunk was dropped: read again from ``dropped_at`` (with those read after it).
    dropped: bool = False
    dropped_at: Cursor | None = None


class Ledger:
    """Every backfill of one runner, and the rules of the protocol (sans-IO)."""

    def __init__(self, slot: str, run: str, max_concurrent: int) -> None:
        """``run`` names this run's watermarks: only this run holds the rows of its chunks."""
        self.slot, self.run, self.max_concurrent = slot, run, max_concurrent
        self._entries: dict[str, Entry] = {}
        self._queue: list[str] = []
        self._numbers = itertools.count()

    # -- the partition ----------------------------------------------------------------------

    def begin(self, request: BackfillRequest, after: Cursor | None, rows: int) -> None:
        """Run ``request`` from ``after`` on, when its turn comes (once: a repeat is ignored)."""
        if request.id not in self._entries:
            self._entries[request.id] = Entry(request, after, rows)
            self._queue.append(request.id)

    def described(self, backfill: str) -> Table | None:
        """The backfill's table as its reader described it (None: not yet)."""
        entry = self._entries.get(backfill)
        return None if entry is None else entry.table

    def take(self, backfill: str, chunk: int) -> Chunk | None:
        """At chunk's high watermark, its rows (None: gone, it is read again); the
        partition emits every one of them."""
        entry = self._entries.get(backfill)
        return None if entry is None else entry.untaken.pop(chunk, None)

    def settled(self, backfill: str, chunk: int | None, rows: int, how: Settled) -> None:
        """The partition emitted ``rows`` of ``chunk``, or dropped it, or ended the backfill."""
        entry = self._entries.get(backfill)
        if entry is None:
            return
        if how == "ended":
            del self._entries[backfill]
            self._queue = [b for b in self._queue if b != backfill]
            return
        if chunk is None or chunk not in entry.starts:
            return  # forgotten (a reconnect): it is read again anyway
        start = entry.starts.pop(chunk)
        entry.untaken.pop(chunk, None)
        entry.rows += rows
        if how == "dropped" and not entry.dropped:
            entry.dropped, entry.dropped_at = True, start

    # -- the queue --------------------------------------------------------------------------

    def turns(self, now: float) -> list[Signal]:
        """The backfills whose turn came (now running), each as its checkpoint: where it stands."""
        running = sum(1 for e in self._entries.values() if e.running)
        out: list[Signal] = []
        while self._queue and running < self.max_concurrent:
            entry = self._entries[self._queue.pop(0)]
            entry.running, entry.started = True, now
            out.append(self._signal("low", entry, entry.after))
            running += 1
        return out

    def checkpoints(self) -> list[Signal]:
        """A checkpoint (a low watermark without a chunk) of each backfill waiting its turn."""
        return [self._signal("low", self._entries[b], self._entries[b].after) for b in self._queue]

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    # -- a table's reading loop -------------------------------------------------------------

    def connected(self, backfill: str, table: Table, estimate: int) -> None:
        """The loop's connection described the table."""
        if (entry := self._entries.get(backfill)) is not None:
            entry.table, entry.estimate = table, max(estimate, entry.rows)

    def next_read(self, backfill: str) -> Signal | Literal["done"] | None:
        """The low watermark of the next chunk to read (its number, where it starts), DONE
        once the backfill ended, or None: wait for the partition to settle a chunk."""
        entry = self._entries.get(backfill)
        if entry is None:
            return DONE
        if entry.dropped:  # it and those read after it are read again
            self._forget(entry, entry.dropped_at)
        if len(entry.starts) >= AHEAD or entry.read_last:
            return None
        return self._signal("low", entry, entry.after, chunk=next(self._numbers))

    def read(self, low: Signal, chunk: Chunk, last: bool) -> Signal:
        """The chunk of ``low`` was read (``last``: the table's last): its rows wait for the
        partition; the high watermark to write."""
        entry = self._entries.get(low.request.id)
        if entry is None:
            return Signal("high", self.slot, low.request, run=self.run, chunk=low.chunk, after=low.after, last=last)
        assert low.chunk is not None
        entry.starts[low.chunk], entry.untaken[low.chunk] = low.after, chunk
        entry.read_last = last
        if chunk.end is not None:
            entry.after = chunk.end
        return self._signal("high", entry, low.after, chunk=low.chunk, last=last)

    def lost(self, backfill: str) -> None:
        """The loop's connection failed: the next one reads again from a dropped chunk's
        start, else from the oldest chunk not taken (else on from the last one read)."""
        if (entry := self._entries.get(backfill)) is None:
            return
        if entry.dropped:
            self._forget(entry, entry.dropped_at)
            return
        untaken = [n for n in entry.starts if n in entry.untaken]
        self._forget(entry, entry.starts[min(untaken)] if untaken else entry.after)

    def ending(self, request: BackfillRequest, error: str) -> Signal:
        """The high watermark that tells the partition ``request`` ends unfinished, and why."""
        entry = self._entries.get(request.id)
        if entry is None:
            return Signal("high", self.slot, request, run=self.run, last=True, error=error)
        return self._signal("high", entry, entry.after, last=True, error=error)

    # -- helpers ----------------------------------------------------------------------------

    def _forget(self, entry: Entry, start: Cursor | None) -> None:
        entry.after = start
        entry.starts.clear()
        entry.untaken.clear()
        entry.read_last = entry.dropped = False
        entry.dropped_at = None

    def _signal(self, kind: Literal["low", "high"], entry: Entry, after: Cursor | None, *, chunk: int | None = None,
                last: bool = False, error: str | None = None) -> Signal:
        return Signal(kind, self.slot, entry.request, run=self.run, chunk=chunk, after=after, rows=entry.rows,
                      estimate=entry.estimate, last=last, error=error)


class Handoff:
    """The ledger behind one condition: the only state the partition and the runner's threads share."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._changed = threading.Condition()
        #: Set by :meth:`stop`: waits end, and so do the runner's threads.
        self.stopping = threading.Event()

    def __enter__(self) -> Ledger:
        self._changed.acquire()
        return self._ledger

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._changed.notify_all()
        self._changed.release()

    def wait(self, decide: Callable[[Ledger], T | None], timeout: float | None = None) -> T | None:
        """``decide``'s first answer that is not None, asked again after every exchange;
        None once stopping, or after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self.stopping.is_set():
                if (answer := decide(self._ledger)) is not None:
                    return answer
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            return None

    def stop(self) -> None:
        with self._changed:
            self.stopping.set()
            self._changed.notify_all()
