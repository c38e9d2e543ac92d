"""The size policy: a change too large to publish whole is published with markers in place of its largest values.

Any database user can write a value of up to 1 GB; neither stopping at it (the slot would keep
its WAL for ever) nor dropping it (a silent gap) is a policy. Two limits apply, each where the
size is first known, and the same rule answers both:

- ``walflow.max_change_mb``, on a change's WAL message as the walsender sends it (the decoder,
  ``connectors/postgres/decoder.py``, before any value is copied) and on a backfill's row
  (``connectors/postgres/chunks.py``);
- a sink's NATS ``max_payload``, on each rendered message, payload and headers as the
  publisher counts them (``transforms/render.py``).

**The rule** (:func:`largest`): replace the largest values first, until the excess is covered,
each by an :class:`core.events.OversizedValue` — its size and CRC-32, nothing of the value —
which the payload writes as the string ``"__walflow_oversized_value:<bytes>"``. Never a value
of the table's key columns (``Table.key_positions``): ids, ``record_pks``, the group key and a
backfill's keyset are made of them, and a key value is bounded by its index entry (a btree
entry holds at most ~2.7 kB, compressed) far below either limit. What still does not fit
after every other value is replaced is a dead letter (render's), never a stop.

**Counted and said once** (:class:`OversizedReport`): every replaced value in
``walflow_oversized_values_total{limit, table, column}``, and one warning per limit, table and
column per process, naming the first change it happened to.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Final, Literal

from core.events import OVERSIZED_MARKER, OversizedValue, RawRow, RawValue
from core.metrics import Metrics

log = logging.getLogger("walflow.sizes")

#: Which limit a value broke: the label of ``walflow_oversized_values_total``.
Limit = Literal["max_change", "max_payload"]
#: A value this small is never replaced: its marker's text is about as long, so replacing it would
#: not make the change smaller.
SMALLEST: Final = 64

#: A value chosen by :func:`largest`: which of the change's rows (by index in the sequence it
#: was given), which column, and the value's size in bytes.
Place = tuple[int, int, int]


def largest(rows: Sequence[Sequence[RawValue | memoryview] | None], protected: Collection[int], excess: int) -> tuple[list[Place], int]:
    """``rows``' largest texts (``bytes``, or views of a message) outside the ``protected``
    columns and over :data:`SMALLEST` bytes, largest first, until their sizes add up to
    ``excess`` or more (all of them when they do not), and the bytes they add up to. Ties go to
    the earlier place, so the same change always loses the same values."""
    candidates = sorted(
        ((len(value), -r, -c) for r, row in enumerate(rows) if row is not None
         for c, value in enumerate(row)
         if c not in protected and isinstance(value, bytes | memoryview) and len(value) > SMALLEST),
        reverse=True,
    )
    places: list[Place] = []
    covered = 0
    for size, r, c in candidates:
        if covered >= excess:
            break
        places.append((-r, -c, size))
        covered += size
    return places, covered


def replaced(row: Sequence[RawValue | memoryview], columns: Collection[int]) -> RawRow:
    """``row`` with the values at ``columns`` replaced by their markers, and every text that is
    a view of a message copied into ``bytes`` (only what is kept is copied)."""
    return tuple(OversizedValue.of(value) if i in columns and isinstance(value, bytes | memoryview)
                 else bytes(value) if isinstance(value, memoryview) else value
                 for i, value in enumerate(row))


class OversizedReport:
    """Counts the values one part replaced, and says so once per table and column in the process.

    ``metrics`` None (a part the process's metrics do not reach, such as a backfill's table
    reader): said once per this report, not counted."""

    def __init__(self, limit: Limit, metrics: Metrics | None, why: str) -> None:
        """``why``: what the warning says about the limit (``"its change is larger than …"``); the
        warnings of reports with different ``why`` are told apart (one per sink, say)."""
        self._limit = limit
        self._counter = None if metrics is None else metrics.oversized_values
        self._tables = None if metrics is None else metrics.tables
        self._warned: set[tuple[str, ...]] = set() if metrics is None else metrics.oversized_warned
        self._why = why

    def __call__(self, table: str, column: str, size: int, where: str) -> None:
        """One value of ``column`` of ``table`` (``schema.table``), ``size`` bytes, replaced in the
        change ``where`` names. Labelled as the process's metrics bound tables: a table past the
        bound counts (and is said once) as ``_other``, its columns too."""
        if self._tables is not None and (label := self._tables(table)) != table:
            table = column = label
        if self._counter is not None:
            self._counter.labels(self._limit, table, column).inc()
        self.once((table, column), "%s.%s: a value of %d bytes in %s is published as \"%s\": %s. Later values of "
                  "this column are counted in walflow_oversized_values_total{limit=\"%s\"}, not logged",
                  table, column, size, where, f"{OVERSIZED_MARKER}:{size}", self._why, self._limit)

    def once(self, key: tuple[str, ...], message: str, *args: object) -> None:
        """Warn ``message`` (``%`` arguments ``args``) the first time ``key`` comes by for this
        report's limit in the process."""
        seen = (self._why, *key)
        if seen not in self._warned:
            self._warned.add(seen)  # two threads may both warn: once more, not a lost warning
            log.warning(message, *args)
