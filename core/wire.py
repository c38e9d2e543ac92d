"""What crosses Bytewax's exchange from the slot's worker to a sink partition: plain tuples.

Bytewax pickles every item that crosses to another process, one at a time. A NamedTuple's
class is looked up by name on every load, a datetime's too: a :class:`core.events.RawChange`
would cost 8–11 µs per item each side where a tuple of ints and bytes costs 2–4
(``shared/reference/bytewax-engine.md`` §9). So the slot's worker sends a change as a
:data:`Packed` tuple that names its table by :attr:`core.events.Table.uid`, and the sink
partition that owns its key turns it back into a ``RawChange`` (:func:`unpack`) to convert
and render it there.

The items on the way to one sink partition, told apart by their first element:

- a change: ``(table uid, action, new, old, old_is_key, commit_lsn, commit_idx,
  commit time in Unix microseconds, xid, read as a plain tuple or None, annotations)``;
- ``(DESCRIBE, table)``: a table version, sent to a partition before the first change that
  names it (it pickles as plain data, see :class:`core.events.Table`);
- ``(FORGET, uid)``: no later change on this partition names that version.

Timely's channels are FIFO from one worker to another, and one sink's changes all come from
the one worker that reads their database's slot: a description always arrives before the
changes that need it and a ``FORGET`` after the last of them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from core.events import Action, RawChange, RawRow, ReadOf, Table

#: The first element of a table description and of a forgotten version's item.
DESCRIBE: Final = "describe"
FORGET: Final = "forget"

#: A change as it crosses (see the module docstring for the fields).
Packed = tuple[int, Action, RawRow | None, RawRow | None, bool, int, int, int, int,
               tuple[str, str, str] | None, bytes | None]
#: Anything a sink partition receives from the slot's worker.
Item = Packed | tuple[str, Table] | tuple[str, int]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)


def pack(change: RawChange) -> Packed:
    """``change`` as it crosses to its sink partition."""
    read = change.read
    return (change.table.uid, change.action, change.new, change.old, change.old_is_key, change.commit_lsn,
            change.commit_idx, (change.commit_ts - _EPOCH) // _US, change.xid,
            None if read is None else (read.sink, read.backfill, read.row_key), change.annotations)


def unpack(item: Packed, table: Table) -> RawChange:
    """The change ``item`` names, read with ``table`` (the version its uid names)."""
    _, action, new, old, old_is_key, lsn, idx, micros, xid, read, annotations = item
    return RawChange(action, table, new, old, old_is_key, lsn, idx, _EPOCH + timedelta(microseconds=micros), xid,
                     None if read is None else ReadOf(*read), annotations)
