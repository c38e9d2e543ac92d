"""What crosses Bytewax's exchange from the slot's worker to a sink partition: plain tuples.

Bytewax pickles every item that crosses to another process, one at a time. A NamedTuple's
class is looked up by name on every load, a datetime's too: a :class:`core.events.RawChange`
would cost several times what a tuple of ints and bytes costs (measured: ``docs/design.md``,
*core/wire.py*). So the slot's worker sends a change as a
:data:`Packed` tuple that names its table by :attr:`core.events.Table.uid`, and the sink
partition that owns its key converts and renders its fields there (``transforms/render.py``,
:func:`commit_time` for its commit time); a partition receives them a list per batch.

The items on the way to one sink partition, told apart by their first element:

- a change: ``(table uid, action, new, old, old_is_key, commit_lsn, commit_idx,
  commit time in Unix microseconds, xid, read as a plain tuple or None, annotations)``;
- ``(DESCRIBE, table)``: a table version, sent to a partition before the first change that
  names it (it pickles as plain data, see :class:`core.events.Table`);
- ``(FORGET, uid)``: no later change on this partition names that version;
- ``(SCHEMA, change)``: a :class:`core.events.SchemaChange`, right after the description of
  the table version whose shape it reports and before that version's first change on this
  partition; only to a sink with ``schema_events``, to every partition that gets a change of
  the new shape (the copies share one ``Nats-Msg-Id``: ``transforms/schema_events.py``);
- ``(BEGIN, commit_lsn, xid, commit time in Unix microseconds)``: before the first change of
  a transaction that a sink with ``transaction_markers`` publishes (one partition);
- ``(COMMIT, commit_lsn, xid, commit time in Unix microseconds)``: the transaction at
  ``commit_lsn`` ended, and this partition had its last change the sink publishes. Sent only
  to a sink that publishes in commit order (``SinkConfig.in_commit_order``: atomic batches,
  markers), which has one partition; never for a transaction the sink published nothing of.

When every sink partition is in another process (the slot's process of a cluster takes none,
``dataflows/engine.py``), a partition's list crosses :func:`sealed`: one ``marshal`` blob
instead of a list of tuples, since Bytewax 0.21.1 pickles each item it sends twice (once to
measure it, once to write it) and ``marshal`` writes these plain tuples in half a pickle's
time. A list that holds anything else (a description, a schema change, a TOAST marker) crosses
as it is; the partition opens either with :func:`opened`. Within a process nothing is sealed:
nothing there is pickled.

Timely's channels are FIFO from one worker to another, and one sink's changes all come from
the one worker that reads their database's slot: a description always arrives before the
changes that need it and a ``FORGET`` after the last of them.
"""

from __future__ import annotations

import marshal
from datetime import UTC, datetime, timedelta
from typing import Final, cast

from core.events import Action, Commit, RawChange, RawRow, SchemaChange, Table

#: The first element of a table description and of a forgotten version's item.
DESCRIBE: Final = "describe"
FORGET: Final = "forget"
#: The first element of a transaction's end, and of its start (for markers).
COMMIT: Final = "commit"
BEGIN: Final = "begin"
#: The first element of a table's change of shape.
SCHEMA: Final = "schema"

#: A change as it crosses (see the module docstring for the fields).
Packed = tuple[int, Action, RawRow | None, RawRow | None, bool, int, int, int, int,
               tuple[str, str, str] | None, bytes | None, int]
#: Anything a sink partition receives from the slot's worker.
Item = Packed | tuple[str, Table] | tuple[str, int] | tuple[str, int, int, int] | tuple[str, SchemaChange]

#: What crosses for one partition per batch: its items, or their :func:`sealed` blob.
Crossing = list[Item] | bytes

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)
#: Below 2**32 s (2106), a float's spacing is under a microsecond: ``micros / 1e6`` rounds
#: back to the same microsecond in ``fromtimestamp``, twice as fast as adding a timedelta.
_FAST_UNTIL: Final = 2**32 * 1_000_000


def pack(change: RawChange, row: int = 0) -> Packed:
    """``change`` as it crosses to its sink partition; ``row``: the row it changes, as a hash of
    its group key (:attr:`core.message.Message.row`; 0: none)."""
    action, table, new, old, old_is_key, lsn, idx, ts, xid, read, annotations = change
    return (table.uid, action, new, old, old_is_key, lsn, idx, (ts - _EPOCH) // _US, xid,
            None if read is None else (read.sink, read.backfill, read.row_key), annotations, row)


def sealed(items: list[Item]) -> Crossing:
    """``items`` as they cross to another process: one marshal blob if they are plain data
    (exact ints, strs, bytes, bools, None, tuples: ``marshal`` refuses a NamedTuple or any
    other class, and a change's texts are exact ``bytes``), else the list itself."""
    try:
        return marshal.dumps(items)
    except ValueError:  # a Table, a SchemaChange, a TOAST or oversized marker: pickled by Bytewax
        return items


def opened(items: Crossing) -> list[Item]:
    """What :func:`sealed` made, as the list it was: a blob comes from this flow's own
    processes, which run the same walflow and Python (as pickle needs them to)."""
    if isinstance(items, bytes):
        return cast(list[Item], marshal.loads(items))
    return items


def pack_commit(commit: Commit) -> tuple[str, int, int, int]:
    """``commit`` as it crosses to its sink's partition."""
    return (COMMIT, commit.commit_lsn, commit.xid, (commit.commit_ts - _EPOCH) // _US)


def commit_time(micros: int) -> datetime:
    """A packed commit time (Unix microseconds) as the aware UTC datetime it was."""
    if _FAST_UNTIL > micros >= 0:  # a float holds every microsecond of these exactly enough
        return datetime.fromtimestamp(micros / 1_000_000, UTC)
    return _EPOCH + timedelta(microseconds=micros)
