"""The last step on the slot's worker, per sink: which changes the sink publishes, the sink
partition each goes to, and what crosses to it.

Everything here must run in commit order where the slot is read; everything after it
(converting values, the envelope, publishing) runs on the worker that owns the sink
partition, in another process of a cluster if the partition is there
(``transforms/render.py``). One batch step does it all: the slot's worker is the part of a
cluster that does not scale, and Bytewax's per-item step shims cost ~1 µs each.

For each change of a batch, in order:

1. :class:`~transforms.filter.SinkFilter`: does the sink publish it.
2. :class:`~transforms.group.GroupKey`, from the column texts: the partition, ``adler32(key)
   % partition_count``. The item's Bytewax key is the partition's index, which
   :meth:`connectors.nats.sink.JetStreamSink.part_fn` reads back: equal group keys, one
   partition, one order.
3. :func:`core.wire.pack`: the compact item, into the batch's list for that partition (one
   list per partition per batch crosses the exchange: per-item routing costs µs). Before
   the first change of a table version on
   a partition, ``(DESCRIBE, table)``; when a version is superseded in its lineage (a new
   Relation message for the relation, another read of a backfill's table), ``(FORGET, uid)``
   to each partition that had it, so a partition keeps the versions still in use only
   (and never more than :data:`MAX_VERSIONS`). A version that comes back is described
   again: nothing depends on a version being seen once. For a sink with ``schema_events``,
   a new version whose shape differs from its table's last (:mod:`transforms.schema_events`)
   is followed on each partition by ``(SCHEMA, change)``, right after its description.

What is sent where is this step's own state, not snapshotted: after a restart every
partition is rebuilt empty and every version described again before its first change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final
from zlib import adler32

from config.schema import SinkConfig
from core.events import Commit, RawChange, SchemaChange
from core.metrics import Metrics
from core.wire import BEGIN, DESCRIBE, FORGET, SCHEMA, Crossing, Item, pack, pack_commit, sealed
from transforms.filter import SinkFilter
from transforms.group import GroupKey
from transforms.schema_events import SchemaTracker

#: A table version's lineage: its relation, and the backfill its reads belong to (None: the stream).
_Lineage = tuple[int, str | None]


#: How many table versions dispatch tracks (and a partition holds) at most: past it the
#: oldest is forgotten, and described again if a change still needs it. Versions that are
#: never superseded — a finished backfill's table, a dropped relation — cannot pile up.
MAX_VERSIONS: Final = 1024


class Dispatch:
    """``dispatch`` step of one sink: a batch of the slot's changes → ``(partition, items)`` pairs."""

    def __init__(self, sink: SinkConfig, metrics: Metrics | None = None, max_versions: int = MAX_VERSIONS,
                 commits: bool = False, schema: SchemaTracker | None = None, crosses: bool = False) -> None:
        """``crosses``: every partition of the sink is in another process (this one takes none):
        each list crosses :func:`core.wire.sealed`. ``commits``: the slot's output holds a :class:`~core.events.Commit` after each
        transaction (a sink of the slot publishes in commit order): this one forwards them
        if it publishes in commit order itself, and passes over them else. ``schema``: the
        sink's tables' shapes, for a sink with ``schema_events``."""
        self._commits = commits
        self._crosses = crosses
        self._ordered = sink.in_commit_order
        self._begins = sink.transaction_markers
        self._database = sink.database
        #: The commit LSN of the transaction this sink routed a change of last.
        self._routed_lsn: int | None = None
        self._filter = SinkFilter(sink, metrics)
        self._key = GroupKey(sink)
        self._keys = tuple(str(i) for i in range(sink.partitions))
        self._max_versions = max_versions
        #: uid of a table version → its lineage and the partitions that have its description,
        #: oldest first.
        self._sent: dict[int, tuple[_Lineage, set[int]]] = {}
        #: lineage → the uid of its current version.
        self._current: dict[_Lineage, int] = {}
        self._schema = schema
        #: uid of a tracked table version → the change of shape it brought.
        self._reshaped: dict[int, SchemaChange] = {}

    def route(self, changes: Sequence[RawChange | Commit]) -> list[tuple[str, Crossing]]:
        """A batch's items, one list per partition it touches, each in the batch's order."""
        out: dict[int, list[Item]] = {}
        if not self._commits:
            self._route(changes, out)  # type: ignore[arg-type]  # no Commit among them
        else:
            self._route_commits(changes, out)
        keys = self._keys
        if self._crosses:
            return [(keys[partition], sealed(items)) for partition, items in out.items()]
        return [(keys[partition], items) for partition, items in out.items()]

    def _route_commits(self, changes: Sequence[RawChange | Commit], out: dict[int, list[Item]]) -> None:
        """Route the changes between each two Commits; a Commit after the last change this
        sink routed (not a read: no transaction) crosses to the sink's one partition."""
        start = 0
        for i, item in enumerate(changes):
            if type(item) is Commit:
                last = self._segment(changes[start:i], out)  # type: ignore[arg-type]  # none between
                start = i + 1
                if last is not None and last.read is None:
                    self._routed_lsn = last.commit_lsn
                if self._ordered and item.commit_lsn == self._routed_lsn and item.database == self._database:
                    out.setdefault(0, []).append(pack_commit(item))
                    self._routed_lsn = None
        last = self._segment(changes[start:], out)  # type: ignore[arg-type]
        if last is not None and last.read is None:
            self._routed_lsn = last.commit_lsn

    def _segment(self, changes: Sequence[RawChange], out: dict[int, list[Item]]) -> RawChange | None:
        """Route the changes between two Commits (all of one transaction); for a sink with
        markers, a BEGIN before the first of them it routes when that starts a transaction."""
        if not self._begins:
            return self._route(changes, out)
        routed: dict[int, list[Item]] = {}
        last = self._route(changes, routed)
        if items := routed.get(0):
            first = next((item for item in items if type(item[0]) is int), None)
            into = out.setdefault(0, [])
            if first is not None and first[9] is None and first[5] != self._routed_lsn:
                into.append((BEGIN, first[5], first[8], first[7]))
            into.extend(items)
        return last

    def _route(self, changes: Sequence[RawChange], out: dict[int, list[Item]]) -> RawChange | None:
        """Add the items of ``changes`` the sink publishes to ``out``; the last of them (None: none)."""
        key, sent = self._key, self._sent
        count = len(self._keys)
        change = None
        for change in self._filter.select(changes):
            table = change.table
            grouped = key(change)
            partition = adler32(grouped.encode()) % count
            items = out.get(partition)
            if items is None:
                items = out[partition] = []
            tracked = sent.get(table.uid)
            have = self._new_version(change, out) if tracked is None else tracked[1]
            if partition not in have:
                have.add(partition)
                items.append((DESCRIBE, table))
                if (reshaped := self._reshaped.get(table.uid)) is not None:
                    items.append((SCHEMA, reshaped))
            items.append(pack(change, hash(grouped)))
        return change

    def _new_version(self, change: RawChange, out: dict[int, list[Item]]) -> set[int]:
        """Start tracking ``change``'s table version; forget the one it supersedes, and the
        oldest one past :data:`MAX_VERSIONS`."""
        table, read = change.table, change.read
        lineage = (table.relid, None if read is None else read.backfill)
        old = self._current.get(lineage)
        if old is not None:
            self._forget(old, out)
        if len(self._sent) >= self._max_versions:
            self._forget(next(iter(self._sent)), out)
        self._current[lineage] = table.uid
        if self._schema is not None and read is None and (reshaped := self._schema.seen(change)) is not None:
            self._reshaped[table.uid] = reshaped
        have: set[int] = set()
        self._sent[table.uid] = (lineage, have)
        return have

    def _forget(self, uid: int, out: dict[int, list[Item]]) -> None:
        lineage, had = self._sent.pop(uid)
        self._reshaped.pop(uid, None)
        if self._current.get(lineage) == uid:
            del self._current[lineage]
        for partition in sorted(had):
            out.setdefault(partition, []).append((FORGET, uid))
