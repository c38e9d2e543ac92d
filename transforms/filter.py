"""Which changes a sink receives: its actions, its ``source`` filters and its legacy ``table``.

All conditions must hold; the table rules are the config's (:meth:`config.schema.SinkConfig.reads`,
the same for backfill requests). ``None`` in ``source`` means no restriction; an empty list includes
nothing. Names compare exactly as Postgres stores them (``public.Orders`` is not
``public.orders``), and tables are written ``schema.table`` as in the config. The decision
depends only on a table's schema and name, so it is made once per table and cached (this runs
for every change, before any value is converted); a table added to the publication while
walflow runs is decided by the same rules when it first shows up, so it flows without a restart.

- A backfill's ``read`` goes only to the sink that asked for it (the request was checked where
  it was acted on, :class:`connectors.postgres.backfill.Admission`), and a read of a table the
  sink does not read is dropped, as its changes would be.
- **Truncates never pass** (they carry no rows and have no place in Sequin's payload); the
  first one of each table this sink would otherwise receive is logged once per process as a
  WARNING, since consumers then disagree with the table.
- :meth:`SinkFilter.select` runs a batch at a time: what it drops is counted per table and
  action and added to ``walflow_changes_filtered_total`` once per batch. A batch's changes of
  another database than the sink's are passed over, and not counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from config.schema import SinkConfig
from core.events import RawChange, Table
from core.metrics import CounterBatch, Metrics

log = logging.getLogger("walflow.transforms.filter")


class SinkFilter:
    """``filter`` step of one sink: true for the changes that sink publishes."""

    def __init__(self, sink: SinkConfig, metrics: Metrics | None = None) -> None:
        """``metrics``: the process's, which count what the sink drops (else its own)."""
        self._sink = sink.name
        self._config = sink
        self._database = sink.database
        self._actions = frozenset(sink.actions)
        #: ``schema.table`` -> decision: one entry per table, however many versions come by.
        self._tables: dict[str, bool] = {}
        self._warned_truncates: set[str] = set()
        name = sink.name
        self._dropped: CounterBatch[tuple[Table, str]] = CounterBatch(
            (metrics or Metrics()).changes_filtered, lambda key: (name, key[0].qualified, key[1]))

    def select(self, changes: Sequence[RawChange]) -> list[RawChange]:
        """The changes of a batch this sink publishes, in order (the flow's ``filter`` step)."""
        kept: list[RawChange] = []
        dropped = self._dropped.counts
        database = self._database
        counted = False
        for change in changes:
            if change.table.database != database:
                continue
            if self(change):
                kept.append(change)
            elif change.read is None:  # another sink's backfill read is not this sink's to count
                dropped[change.table, change.action] += 1
                counted = True
        if counted:
            # Only the worker that reads the sink's database counts and flushes: with two
            # databases on two worker threads, the other one's batches touch nothing here.
            self._dropped.flush()
        return kept

    def __call__(self, change: RawChange) -> bool:
        if change.read is not None:  # a backfill's row goes to the sink that asked for it, whatever its actions
            return change.read.sink == self._sink and self._receives(change.table)
        if change.action in self._actions:
            return self._receives(change.table)
        if change.action == "truncate" and self._receives(change.table):
            self._warn_truncate(change.table)
        return False

    def _receives(self, table: Table) -> bool:
        return self.receives(table.schema, table.qualified)

    def receives(self, schema: str, qualified: str) -> bool:
        """Whether this sink's schema/table rules admit the table ``qualified`` (cached per
        table: only for tables whose changes come from the slot)."""
        decision = self._tables.get(qualified)
        if decision is None:
            decision = self._tables[qualified] = self._config.reads(schema, qualified)
        return decision

    def _warn_truncate(self, table: Table) -> None:
        if table.qualified not in self._warned_truncates:
            self._warned_truncates.add(table.qualified)
            log.warning(
                "TRUNCATE of %s is not delivered to sink %s: walflow delivers row changes only",
                table.qualified, self._sink,
            )
