"""The group key: which sink partition a change goes to, so that each group keeps commit order.

Changes with equal keys go to the same partition, which publishes them in the order it
received them; that is how "commit order per row (per group key)" holds. The key is
``"<schema>.<table>:" + JSON array of the group columns' texts``, e.g. ``public.orders:["7"]``,
made from the values as the database printed them, before any conversion (so the source's
worker can route a change without converting it), never from Python's salted ``hash()``: every
worker and process computes the same key for the same change, before and after a restart.

- **Group columns**: the table's ``group_column_names`` (from ``tables:``, or the legacy
  ``table:`` + ``group_column_names:``; a ``tables:`` entry wins), else the table's key
  (``Table.key_columns``: the primary key under REPLICA IDENTITY DEFAULT or FULL, the index's
  columns under USING INDEX). A table without key columns (no primary key, or REPLICA IDENTITY
  NOTHING) is one group, ``public.log:[]``: its changes keep their order at the cost of parallelism.
- **Values** come from the new row, or from the old row for a delete; a TOASTed column the
  update left alone takes its old value when Postgres sent it.
- **Fallback**: a change without some group column (a delete under REPLICA IDENTITY DEFAULT
  sends only the key) is grouped by the key columns it has, with one WARNING per table: its
  order relative to the row's earlier changes is then not promised. ``ALTER TABLE … REPLICA
  IDENTITY FULL`` removes the problem.
- With ``message_grouping: false`` each change is its own group (``"<commit_lsn>:<commit_idx>"``):
  no order between changes is promised, as in Sequin.
"""

from __future__ import annotations

import logging
from typing import Final, NamedTuple

from config.schema import SinkConfig
from core.events import UNCHANGED_TOAST, RawChange, RawRow, RawValue, Table
from core.ids import row_key

log = logging.getLogger("walflow.transforms.group")

_ABSENT: Final = object()


class _Plan(NamedTuple):
    """What the key of one table version needs, found once per version."""

    prefix: str
    #: Positions of the group columns; None when one of them is not a column of the table.
    group: tuple[int, ...] | None
    #: Positions of the table's key columns: the fallback.
    key: tuple[int, ...]
    #: Positions a key-only old row carries.
    identity: frozenset[int]


def _value(i: int, row: RawRow | None, row_is_key: bool, other: RawRow | None, other_is_key: bool,
           identity: frozenset[int]) -> RawValue | object:
    """Column ``i`` of ``row``; for an untouched TOASTed one its value in ``other`` (the old
    row), if sent; ``_ABSENT`` when neither has it."""
    if row is None or (row_is_key and i not in identity):
        return _ABSENT
    value = row[i]
    if value is UNCHANGED_TOAST:
        if other is None or (other_is_key and i not in identity) or other[i] is UNCHANGED_TOAST:
            return _ABSENT
        return other[i]
    return value


class GroupKey:
    """``key`` step of one sink: the text that picks a change's sink partition."""

    def __init__(self, sink: SinkConfig) -> None:
        self._grouping = sink.message_grouping
        configured: dict[str, tuple[str, ...]] = {}
        if sink.table is not None and sink.group_column_names is not None:
            configured[sink.table] = tuple(sink.group_column_names)
        for table in sink.tables:
            if table.group_column_names is not None:  # None: the table's key, as for unlisted tables
                configured[table.name] = tuple(table.group_column_names)
        self._configured = configured
        #: ``schema.table`` -> the last table version seen and its plan: one entry per table,
        #: however many versions (a Relation message per session and per DDL) come by.
        self._plans: dict[str, tuple[Table, _Plan]] = {}
        self._warned: set[str] = set()

    def __call__(self, change: RawChange) -> str:
        if not self._grouping:
            return f"{change.commit_lsn}:{change.commit_idx}"
        table = change.table
        cached = self._plans.get(table.qualified)
        plan = cached[1] if cached is not None and cached[0] is table else self._plan(table)
        if change.action == "delete":
            row, row_is_key, other, other_is_key = change.old, change.old_is_key, None, False
        else:
            row, row_is_key, other, other_is_key = change.new, False, change.old, change.old_is_key
        values: list[RawValue | object] = []
        if plan.group is not None:
            for i in plan.group:
                value = _value(i, row, row_is_key, other, other_is_key, plan.identity)
                if value is _ABSENT:
                    break
                values.append(value)
            else:
                return plan.prefix + row_key(values)
        # a group column is missing: the key columns that are present
        self._warn_fallback(change, plan)
        values = [v for i in plan.key if (v := _value(i, row, row_is_key, other, other_is_key, plan.identity))
                  is not _ABSENT]
        return plan.prefix + row_key(values)

    def _plan(self, table: Table) -> _Plan:
        columns = self._configured.get(table.qualified, table.key_columns)
        positions = table.positions
        group = tuple(positions[c] for c in columns) if all(c in positions for c in columns) else None
        plan = _Plan(
            f"{table.qualified}:",
            group,
            tuple(positions[c] for c in table.key_columns if c in positions),
            frozenset(positions[c] for c in table.identity_columns if c in positions),
        )
        self._plans[table.qualified] = (table, plan)
        return plan

    def _warn_fallback(self, change: RawChange, plan: _Plan) -> None:
        table = change.table
        if table.qualified not in self._warned:
            self._warned.add(table.qualified)
            columns = self._configured.get(table.qualified, table.key_columns)
            log.warning(
                "%s on %s lacks group column(s) %s (REPLICA IDENTITY DEFAULT sends only the key, and an "
                "untouched TOASTed value only under FULL): grouping by the key columns instead, so its order "
                "relative to the row's other changes is not kept; set REPLICA IDENTITY FULL on this table",
                change.action, table.qualified, ", ".join(columns),
            )
