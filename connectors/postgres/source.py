"""The Bytewax source: one partition per replication slot (a database of the config), keyed by the slot's name.

The partition is a shell: it drains the reader's buffer in ``next_batch`` without blocking,
shows backfill signals to :class:`~connectors.postgres.backfill.Backfills`, and tells the
slot's :class:`~connectors.postgres.position.SlotPosition` what it emitted and when an epoch
ended or completed; the position decides what is confirmed (README, "When the slot moves").
Its snapshot is plain data — how far it emitted, even into an unfinished transaction, and
where each running backfill continues.

Metrics: the changes taken from the buffer are counted per table and action in plain ints
and added to ``walflow_changes_received_total`` once per ``next_batch``; the epoch budget's
use is read at scrape time, and the time from reaching it to the epoch's end counts as
backpressure.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, cast, get_args

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from config.schema import BackfillSettings, DatabaseConfig, ReplicationSettings, SinkConfig
from connectors.postgres.backfill import Admission, BackfillRunner, Backfills, BackfillState, Release
from connectors.postgres.decoder import Item, ResumePoint, Signal
from connectors.postgres.position import SlotPosition
from connectors.postgres.signals import CursorSeal
from connectors.postgres.supervisor import SlotReader
from core.errors import FatalError
from core.events import Action, Commit, RawChange, Table
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


class SlotPartition(StatefulSourcePartition[RawChange | Commit, SourceState]):
    """Hands the reader's changes to Bytewax; the slot's :class:`SlotPosition` decides what is confirmed when."""

    def __init__(
        self,
        reader: SlotReader,
        runtime: Runtime,
        batch_size: int,
        epoch_budget: int,
        backfills: Backfills,
        commits: bool = False,
    ) -> None:
        """``commits``: emit a :class:`~core.events.Commit` after each transaction's last change
        (a sink of the slot publishes in commit order)."""
        self._reader = reader
        self._commits = commits
        #: The last change emitted, while its transaction is open: what its Commit names.
        self._open: RawChange | None = None
        self._position = reader.position
        self._backfills = backfills
        #: A chunk's reads still to emit, and the items taken after its high watermark.
        self._release: Release | None = None
        self._held: list[Item] = []
        self._runtime = runtime
        self._batch_size = batch_size
        self._epoch_budget = epoch_budget
        self._epoch_bytes = 0
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

    def next_batch(self) -> list[RawChange | Commit]:
        with self._runtime.guard(f"reading slot {self._reader.db.slot.name}"):
            return self._next_batch()

    def _next_batch(self) -> list[RawChange | Commit]:
        self._pacer.polled(time.time())
        position = self._position
        now = time.monotonic()
        if position.epoch_complete(now):
            self._reader.wake()
        if (error := self._reader.error) is not None:
            if isinstance(error, FatalError):
                raise error
            raise RuntimeError(f"replication of slot {self._reader.db.slot.name} failed: {error}") from error
        if position.finished:
            raise StopIteration
        out: list[RawChange | Commit] = []
        if self._epoch_bytes >= self._epoch_budget:
            # Bytewax does not throttle a source within an epoch when its output crosses
            # workers: hold back until the epoch closes (the reader keeps Postgres alive).
            if self._budget_reached is None:
                self._budget_reached = time.monotonic()
            self._idle = True
            return out
        if (release := self._release) is not None:  # a chunk's reads, before anything after its watermark
            out = cast(list[RawChange | Commit], release.take(self._batch_size))  # reads only
            self._epoch_bytes += release.row_memory * len(out)
            if release.empty:
                self._release = None
                release.done()
            position.reads_emitted()
            self._idle = False
            return out
        if self._held:
            items, self._held = self._held, []
        else:
            items, size = self._reader.buffer.take(self._batch_size, finish_within=10 * self._batch_size)
            self._epoch_bytes += size
        backfills = self._backfills
        received = self._received_by_action
        marker = position.marker
        for i, item in enumerate(items):
            if type(item) is int:
                if self._commits and position.commit_lsn is not None and item > position.commit_lsn:
                    last = out[-1] if out else self._open  # the transaction's last change (Commits only follow one)
                    assert type(last) is RawChange
                    out.append(Commit(last.table.database, last.commit_lsn, last.xid, last.commit_ts))
                marker(item)
            elif type(item) is Signal:
                # a backfill's watermark: at a high one, the chunk's reads enter the stream here
                release = backfills.on_signal(item, position.lsn)
                if release is not None:
                    self._release, self._held = release, items[i + 1 :]
                    break
            else:
                assert isinstance(item, RawChange)
                if backfills.watching:
                    backfills.observe(item)
                out.append(item)
                received[item.action][item.table] += 1
                # where the emitted position stands (SlotPosition's fields, written here per change)
                position.commit_lsn, position.commit_idx = item.commit_lsn, item.commit_idx
        if self._commits and out:
            last = out[-1]
            self._open = last if type(last) is RawChange else None
        for batch in self._received:
            batch.flush()
        if position.batch_end(bool(out), backfills.floor, now):
            self._reader.wake()
        self._idle = not out
        return out

    def next_awake(self) -> datetime | None:
        # Never a time that passes while the next epoch waits on the probe (core/pacing.py).
        return self._pacer.next_awake(time.time(), _IDLE_POLL if self._idle else None)

    def snapshot(self) -> SourceState:
        self._pacer.snapshotted(time.time())
        position = self._position
        if position.epoch_complete(time.monotonic()):
            self._reader.wake()
        self._epoch_bytes = 0
        if self._budget_reached is not None:
            self._budget_wait.inc(time.monotonic() - self._budget_reached)
            self._budget_reached = None
        emitted = position.epoch_end(self._backfills.floor)
        if self._commits and emitted["commit_lsn"] is not None:
            # a resumed flow emits the open transaction again from its start: a sink in commit
            # order publishes whole transactions, and its unsent part is not in its snapshot
            emitted = {"lsn": emitted["lsn"], "commit_lsn": None, "commit_idx": -1}
        return {**emitted, "backfills": self._backfills.snapshot()}

    def close(self) -> None:
        self._runtime.unregister(self._reader)
        self._backfills.stop()
        self._reader.stop()


@dataclass(frozen=True)
class Slot:
    """One database's slot, read by one partition of the source.

    ``sinks``: the enabled sinks of this database, which a backfill may be for (each only for
    the tables it reads, as its live changes; :class:`~connectors.postgres.backfill.Admission`); ``on_start``: called once
    where the slot is read, before reading starts (the initial backfill requests);
    ``confirm_after``: confirm no position up to this LSN (its sinks' replay horizon);
    ``confirm_delay``: seconds a durable position waits before it is confirmed (the longest
    ``confirm_delay_ms`` of its sinks);
    ``stop_at_lsn``: end the partition once everything committed before that LSN was
    emitted (bounded runs and tests); without it the partition runs until the flow stops.
    """

    db: DatabaseConfig
    sinks: tuple[SinkConfig, ...] = ()
    on_start: Callable[[], None] | None = None
    confirm_after: int = 0
    stop_at_lsn: int | None = None
    confirm_delay: float = 0.0

    @property
    def commits(self) -> bool:
        """A sink of the slot publishes in commit order: the source marks each transaction's end."""
        return any(sink.in_commit_order for sink in self.sinks)


class PostgresSource(FixedPartitionedSource[RawChange | Commit, SourceState]):
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
        # Started again to repair a stream (core/runtime.py): from the slot, not the snapshot.
        state = resume_state if resume_state and self.runtime.restarted is None else {}
        resume = ResumePoint(state.get("lsn", 0), state.get("commit_lsn"), state.get("commit_idx", -1))
        if slot.commits:
            resume = ResumePoint(resume.lsn)  # an open transaction again from its start (see snapshot)
        metrics = self.runtime.metrics
        position = SlotPosition(resume, confirm_after=slot.confirm_after, stop_at=slot.stop_at_lsn,
                                confirm_delay=slot.confirm_delay)
        reader = SlotReader(db, self.settings, position, metrics=metrics)
        runner = BackfillRunner(db, self.backfill, seal=CursorSeal.of(slot.sinks, self.backfill))
        reader.backfill_progress = runner.progress
        admission = Admission.of(slot.sinks, self.backfill, reader.ignored)
        backfills = Backfills(db.slot.name, admission, runner, state.get("backfills"), resume.lsn, metrics=metrics)
        reader.start()
        self.runtime.register(reader)
        return SlotPartition(reader, self.runtime, self.settings.batch_size, self.epoch_budget, backfills,
                             commits=slot.commits)
