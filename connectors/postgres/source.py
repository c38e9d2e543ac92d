"""The Bytewax source: one partition per replication slot (a database of the config), keyed by the slot's name.

The partition drains the reader's buffer in ``next_batch`` and never blocks. Its
snapshot is plain data — the LSN up to which everything was emitted, and how far into an
unfinished transaction it got — so a resumed run starts exactly after the last change it
emitted, even in the middle of a ten-million-row transaction.

**When the slot moves.** Bytewax calls a source partition in epoch e+1 only after epoch e
is complete downstream (with ``-r``: after its snapshots are committed;
``shared/reference/bytewax-engine.md`` §3.8). So the position returned by ``snapshot()``
at the end of epoch e is confirmed to Postgres on the next call, never earlier.

Metrics: the changes taken from the buffer are counted per table and action in plain ints
and added to ``walflow_changes_received_total`` once per ``next_batch``; the epoch budget's
use is read at scrape time, and the time from reaching it to the epoch's end counts as
backpressure.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, get_args

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from config.schema import BackfillSettings, DatabaseConfig, ReplicationSettings, SinkConfig
from connectors.postgres.backfill import Admission, BackfillRunner, Backfills, BackfillState, Release
from connectors.postgres.decoder import Item, ResumePoint, Signal
from connectors.postgres.supervisor import SlotReader
from core.errors import FatalError
from core.events import Action, RawChange, Table
from core.metrics import CounterBatch
from core.pacing import EpochPacer
from core.runtime import Runtime
from core.threads import keep_thread_state

log = logging.getLogger("walflow.postgres")

#: How long an idle partition waits before Bytewax polls it again (it must not block).
_IDLE_POLL = 0.005


def _received_labels(slot: str, action: str) -> Callable[[Table], tuple[str, str, str]]:
    """``walflow_changes_received_total``'s labels for a table's changes of ``action`` from ``slot``."""
    return lambda table: (slot, table.qualified, action)


class SourceState(TypedDict, total=False):
    """The partition's snapshot: plain data, stable across walflow versions."""

    lsn: int
    commit_lsn: int | None
    commit_idx: int
    #: Running backfills and where each continues (absent in snapshots of older versions).
    backfills: list[BackfillState]


class SlotPartition(StatefulSourcePartition[RawChange, SourceState]):
    """Hands the reader's changes to Bytewax, tracks the position, confirms it an epoch later."""

    def __init__(
        self,
        reader: SlotReader,
        runtime: Runtime,
        batch_size: int,
        epoch_budget: int,
        backfills: Backfills,
        stop_at_lsn: int | None = None,
        confirm_after: int = 0,
    ) -> None:
        self._reader = reader
        self._backfills = backfills
        #: A chunk's reads still to emit, and the items taken after its high watermark.
        self._release: Release | None = None
        self._held: list[Item] = []
        #: Positions of epoch ends not yet confirmable because a backfill's floor is below them.
        self._epoch_ends: deque[int] = deque([reader.resume.lsn])
        self._runtime = runtime
        self._confirm_after = confirm_after
        self._batch_size = batch_size
        self._epoch_budget = epoch_budget
        self._epoch_bytes = 0
        self._stop_at = stop_at_lsn
        resume = reader.resume
        self._lsn = resume.lsn
        self._commit_lsn = resume.commit_lsn
        self._commit_idx = resume.commit_idx
        self._unconfirmed: int | None = None
        self._dirty = False  # changes emitted since the last snapshot
        self._settled = False  # every change emitted so far is covered by a confirmed snapshot
        self._idle = False
        # Built in build_part, where Bytewax's first epoch starts: see core/pacing.py.
        self._pacer = EpochPacer(time.time())
        metrics = runtime.metrics
        # One batch per action, keyed by the Table itself: no key tuple built and hashed per change.
        self._received: list[CounterBatch[Table]] = []
        self._received_by_action: dict[str, defaultdict[Table, int]] = {}
        for action in get_args(Action):
            batch: CounterBatch[Table] = CounterBatch(metrics.changes_received,
                                                           _received_labels(reader.db.slot.name, action))
            self._received.append(batch)
            self._received_by_action[action] = batch.counts
        metrics.track_bound("epoch_budget", lambda: self._epoch_bytes, epoch_budget)
        self._budget_wait = metrics.backpressure.labels("epoch_budget")
        self._budget_reached: float | None = None  # when this epoch reached its budget

    def next_batch(self) -> list[RawChange]:
        with self._runtime.guard(f"reading slot {self._reader.db.slot.name}"):
            return self._next_batch()

    def _next_batch(self) -> list[RawChange]:
        self._pacer.polled(time.time())
        self._confirm_previous_epoch()
        if (error := self._reader.error) is not None:
            if isinstance(error, FatalError):
                raise error
            raise RuntimeError(f"replication of slot {self._reader.db.slot.name} failed: {error}") from error
        if self._stop_at is not None and self._lsn >= self._stop_at and self._commit_lsn is None:
            raise StopIteration
        out: list[RawChange] = []
        if self._epoch_bytes >= self._epoch_budget:
            # Bytewax does not throttle a source within an epoch when its output crosses
            # workers: hold back until the epoch closes (the reader keeps Postgres alive).
            if self._budget_reached is None:
                self._budget_reached = time.monotonic()
            self._idle = True
            return out
        if (release := self._release) is not None:  # a chunk's reads, before anything after its watermark
            out = release.take(self._batch_size)
            self._epoch_bytes += release.row_memory * len(out)
            if release.empty:
                self._release = None
                release.done()
            self._dirty, self._settled, self._idle = True, False, False
            return out
        if self._held:
            items, self._held = self._held, []
        else:
            items, size = self._reader.buffer.take(self._batch_size, finish_within=10 * self._batch_size)
            self._epoch_bytes += size
        backfills = self._backfills
        received = self._received_by_action
        for i, item in enumerate(items):
            if type(item) is int:
                self._lsn = max(self._lsn, item)
                if self._commit_lsn is not None and item > self._commit_lsn:
                    self._commit_lsn, self._commit_idx = None, -1  # that transaction is complete
            elif type(item) is Signal:
                # a backfill's watermark: at a high one, the chunk's reads enter the stream here
                release = backfills.on_signal(item, self._lsn)
                if release is not None:
                    self._release, self._held = release, items[i + 1 :]
                    break
            else:
                assert isinstance(item, RawChange)
                if backfills.watching:
                    backfills.observe(item)
                out.append(item)
                received[item.action][item.table] += 1
                self._commit_lsn, self._commit_idx = item.commit_lsn, item.commit_idx
        for batch in self._received:
            batch.flush()
        if out:
            self._dirty, self._settled = True, False
        elif self._settled and (lsn := self._confirmable(self._lsn)) > max(self._reader.confirmed, self._confirm_after):
            # Nothing is in flight: the position moved over WAL with nothing to publish
            # (keepalive walEnd), so it is safe at once, without waiting for an epoch.
            self._reader.confirm(lsn)
        self._idle = not out
        return out

    def next_awake(self) -> datetime | None:
        # Never a time that passes while the next epoch waits on the probe (core/pacing.py).
        return self._pacer.next_awake(time.time(), _IDLE_POLL if self._idle else None)

    def snapshot(self) -> SourceState:
        self._pacer.snapshotted(time.time())
        self._confirm_previous_epoch()
        self._epoch_bytes = 0
        if self._budget_reached is not None:
            self._budget_wait.inc(time.monotonic() - self._budget_reached)
            self._budget_reached = None
        if self._commit_lsn is None:
            # Only epochs that end between transactions are confirmed: then every change in
            # JetStream at or after the confirmed LSN came from a later epoch, which is what
            # the sink's startup check for already-published changes relies on.
            self._epoch_ends.append(self._lsn)
            self._unconfirmed = self._confirmable(self._lsn)
        self._dirty = False
        return {"lsn": self._lsn, "commit_lsn": self._commit_lsn, "commit_idx": self._commit_idx,
                "backfills": self._backfills.snapshot()}

    def close(self) -> None:
        self._runtime.unregister(self._reader)
        self._backfills.stop()
        self._reader.stop()

    def _confirmable(self, lsn: int) -> int:
        """``lsn``, or less while a backfill runs: the slot keeps its newest signal (backfill.py).
        Then the latest epoch end at or before that signal, never a position inside an epoch
        (which the sinks' startup scan relies on, see above); 0 if there is none yet."""
        floor = self._backfills.floor
        if floor is None:  # lsn is an epoch end, or nothing is in flight: where a backfill's wait may start
            self._epoch_ends.clear()
            self._epoch_ends.append(lsn)
            return lsn
        ends = self._epoch_ends
        while len(ends) > 1 and ends[1] <= floor:
            ends.popleft()
        return ends[0] if ends and ends[0] <= floor else 0

    def _confirm_previous_epoch(self) -> None:
        """The previous epoch is complete downstream: its snapshot position is durable."""
        if self._unconfirmed is not None:
            if self._unconfirmed > self._confirm_after:  # past what a previous run may have published
                self._reader.confirm(self._unconfirmed)
            self._unconfirmed = None
            self._settled = not self._dirty


@dataclass(frozen=True)
class Slot:
    """One database's slot, read by one partition of the source.

    ``sinks``: the enabled sinks of this database, which a backfill may be for (each only for
    the tables it reads, as its live changes; :class:`~connectors.postgres.backfill.Admission`); ``on_start``: called once
    where the slot is read, before reading starts (the initial backfill requests);
    ``confirm_after``: confirm no position up to this LSN (its sinks' replay horizon);
    ``stop_at_lsn``: end the partition once everything committed before that LSN was
    emitted (bounded runs and tests); without it the partition runs until the flow stops.
    """

    db: DatabaseConfig
    sinks: tuple[SinkConfig, ...] = ()
    on_start: Callable[[], None] | None = None
    confirm_after: int = 0
    stop_at_lsn: int | None = None


class PostgresSource(FixedPartitionedSource[RawChange, SourceState]):
    """Committed row changes from databases' replication slots, each in commit order, values as texts.

    One partition per :class:`Slot`, keyed by the slot's name (so a recovery directory
    resumes each slot where its partition stopped); in a cluster each process lists the
    slots it reads (``here``, decided by ``dataflows/engine.py``) and Bytewax gives each to
    one of that process's workers. The epoch budget is the flow's, shared evenly by the slots.
    """

    def __init__(
        self,
        slots: Sequence[Slot],
        settings: ReplicationSettings,
        runtime: Runtime,
        *,
        backfill: BackfillSettings | None = None,
        epoch_budget_mb: int = 128,
        here: frozenset[str] | None = None,
    ) -> None:
        """``here``: the slots this process reads, of a cluster's (None: all of them)."""
        names = [slot.db.slot.name for slot in slots]
        if not slots or len(set(names)) != len(names):
            raise ValueError(f"the slots a source reads must be some and distinct: {names}")
        self.slots = {slot.db.slot.name: slot for slot in slots}
        self.backfill = backfill or BackfillSettings()
        self.settings = settings
        self.runtime = runtime
        self.epoch_budget = epoch_budget_mb * 1024 * 1024 // len(slots)
        self.here = frozenset(names) if here is None else here

    def list_parts(self) -> list[str]:
        keep_thread_state()  # Bytewax calls this once on every worker thread: see core/threads.py
        return [name for name in self.slots if name in self.here]

    def build_part(self, step_id: str, for_part: str, resume_state: SourceState | None) -> SlotPartition:
        keep_thread_state()
        slot = self.slots[for_part]
        db = slot.db
        if slot.on_start is not None:
            with self.runtime.guard(f"slot {db.slot.name}: requesting initial backfills"):
                slot.on_start()
        state = resume_state or {}
        resume = ResumePoint(state.get("lsn", 0), state.get("commit_lsn"), state.get("commit_idx", -1))
        metrics = self.runtime.metrics
        reader = SlotReader(db, self.settings, resume, metrics=metrics)
        runner = BackfillRunner(db, self.backfill)
        reader.backfill_progress = runner.progress
        admission = Admission.of(slot.sinks, self.backfill, reader.ignored)
        backfills = Backfills(db.slot.name, admission, runner, state.get("backfills"), resume.lsn, metrics=metrics)
        reader.start()
        self.runtime.register(reader)
        return SlotPartition(reader, self.runtime, self.settings.batch_size, self.epoch_budget, backfills,
                             slot.stop_at_lsn, slot.confirm_after)
