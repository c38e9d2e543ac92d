"""The group key: which sink partition a change goes to, so that each group keeps commit order.

Changes with equal keys go to the same partition, which publishes them in the order it
received them; that is how "commit order per row (per group key)" holds. The key is
``"<schema>.<table>:" + JSON array of the group values``, e.g. ``public.orders:[7]``. It is
plain text made from the values themselves (never Python's ``hash()``, which is salted per
process), so every worker and process computes the same key for the same change, before
and after a restart.

**Group columns**: the table's ``group_column_names`` (from ``tables:``, or the legacy
``table:`` + ``group_column_names:``; a ``tables:`` entry wins if both name the table), else
the replica identity key (``Change.key_columns``, the primary key under REPLICA IDENTITY
DEFAULT). A table without key columns (no primary key, or REPLICA IDENTITY NOTHING) is one
group: ``public.log:[]``, so its changes keep their order at the cost of parallelism.

**Values** come from the new row, or from the old row for a delete. A TOASTed column that
the update left alone has no new value; its old value is used when Postgres sent it.

**Fallback**: a group column can be missing from the row. Under REPLICA IDENTITY DEFAULT a
delete sends only the key columns, so a table grouped by a non-key column cannot group its
deletes by that column. Such a change is grouped by the key columns that are present
instead, and a WARNING is logged once per table: its order relative to the row's earlier
changes is then no longer promised. ``ALTER TABLE … REPLICA IDENTITY FULL`` makes Postgres
send the whole old row and removes the problem.

**REPLICA IDENTITY FULL** marks *every* column as part of the identity, so without
configured group columns the key is the whole row, and it changes whenever the row does:
the row's changes may then land on different partitions. Configure ``group_column_names``
(e.g. the primary key) for tables under FULL identity.

With ``message_grouping: false`` each change is its own group (``"<commit_lsn>:<commit_idx>"``):
changes spread over all partitions and no order between them is promised, as in Sequin.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from pydantic_core import to_json

from config.schema import SinkConfig
from connectors.postgres.changes import Change
from connectors.postgres.values import UNCHANGED_TOAST, Row

log = logging.getLogger("walflow.transforms.group")

_ABSENT: Final = object()


def _value(row: Row, old: Row | None, column: str) -> Any:
    """The column's value in ``row``, its old value if TOASTed and untouched, else ``_ABSENT``."""
    value = row.get(column, _ABSENT)
    if value is UNCHANGED_TOAST:
        value = _ABSENT if old is None else old.get(column, _ABSENT)
    return value


class GroupKey:
    """``key`` step of one sink: the text that picks a change's sink partition."""

    def __init__(self, sink: SinkConfig) -> None:
        self._grouping = sink.message_grouping
        configured: dict[str, tuple[str, ...]] = {}
        if sink.table is not None and sink.group_column_names is not None:
            configured[sink.table] = tuple(sink.group_column_names)
        for table in sink.tables:
            configured[table.name] = tuple(table.group_column_names)
        self._configured = configured
        #: (schema, table) -> (key prefix, configured group columns or None): built once per table.
        self._tables: dict[tuple[str, str], tuple[str, tuple[str, ...] | None]] = {}
        self._warned: set[tuple[str, str]] = set()

    def __call__(self, change: Change) -> str:
        if not self._grouping:
            return f"{change.commit_lsn}:{change.commit_idx}"
        prefix, configured = self._table(change.schema, change.table)
        row = (change.old if change.action == "delete" else change.new) or {}
        values = self._values(row, change.old, configured or change.key_columns)
        if values is None:  # a group column is missing: the key columns that are present
            self._warn_fallback(change, configured or change.key_columns, row)
            values = [v for c in change.key_columns if (v := _value(row, change.old, c)) is not _ABSENT]
        return prefix + to_json(values, bytes_mode="base64", inf_nan_mode="strings", fallback=str).decode()

    def _table(self, schema: str, table: str) -> tuple[str, tuple[str, ...] | None]:
        entry = self._tables.get((schema, table))
        if entry is None:
            qualified = f"{schema}.{table}"
            entry = self._tables[(schema, table)] = (f"{qualified}:", self._configured.get(qualified))
        return entry

    @staticmethod
    def _values(row: Row, old: Row | None, columns: Sequence[str]) -> list[Any] | None:
        values = []
        for column in columns:
            value = _value(row, old, column)
            if value is _ABSENT:
                return None
            values.append(value)
        return values

    def _warn_fallback(self, change: Change, columns: Sequence[str], row: Row) -> None:
        if (change.schema, change.table) not in self._warned:
            self._warned.add((change.schema, change.table))
            missing = [c for c in columns if _value(row, change.old, c) is _ABSENT]
            log.warning(
                "%s on %s.%s lacks group column(s) %s (REPLICA IDENTITY DEFAULT sends only the key, and an "
                "untouched TOASTed value only under FULL): grouping by the key columns instead, so its order "
                "relative to the row's other changes is not kept; set REPLICA IDENTITY FULL on this table",
                change.action, change.schema, change.table, ", ".join(missing),
            )
