"""Schema events (a sink's ``schema_events: true``): one message when a table the sink publishes
changes shape, stored before the first change of the new shape.

A table's **shape** (:class:`core.events.Shape`) is its columns in order, each with its type as
Postgres names it (``format_type``: ``character varying(20)``) and whether it is a key column, and
its replica identity. A Relation message arrives at every session start and after any relcache
invalidation, so a new table version is not a new shape: shapes are compared, by table name
(``schema.table``, the subject's), so a table dropped and created again with other columns is
reported too.

**On the slot's worker** (:class:`SchemaTracker`, called by ``transforms/dispatch.py`` for each new
version of a table the sink's filter passes a change of, in commit order; backfill reads have their
own versions and are not looked at): the new version's shape against the table's last one. A change
becomes a :class:`core.events.SchemaChange` at the position of that first change, which dispatch
sends to each partition before its first change of the version (``core/wire.py``'s ``SCHEMA``);
nothing at all for a table seen for the first time, whose shape is only recorded.

**In each sink partition** (:class:`SchemaEvents`, called by ``transforms/render.py``): the event
as a :data:`core.events.BARRIER` message, so the partition publishes it only once everything before
it is stored and its own next change only once it is. Every partition that gets a change of the new
shape publishes the event, under one ``Nats-Msg-Id`` (:meth:`core.ids.IdScheme.encode_schema`, from
the sink and the position, which names the table): copies within the stream's duplicate window are
JetStream's duplicates. A partition that comes later than that asks the stream for the last message
on the table's ``.schema`` subject first, and publishes nothing if it already reports this shape or a
later position: so no partition stores a change of the new shape before the event, and the stream
holds it once.

**Across restarts** dispatch starts empty: each table's last shape, and its last
:data:`RECENT_CHANGES` changes of shape with their positions, are kept in the sink's KV memory
(``connectors/nats/state.py``), written by the tracker as it sees them. A restart compares against
the shape the table had at the slot's confirmed position (:func:`baselines`): the changes at or after
it are replayed, and with them their events, found in the stream (above) if they were stored before.
A change made while walflow was stopped is so reported at its start, and a restart or a reconnect
that changed nothing publishes nothing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from pydantic_core import to_json

from config.schema import SinkConfig
from connectors.postgres.protocol import lsn_to_str
from core.errors import FatalError
from core.events import BARRIER, ColumnShape, RawChange, SchemaChange, Shape, Table
from core.ids import IdScheme
from core.message import Message
from core.subjects import covers, schema_pattern, schema_subject

log = logging.getLogger("walflow.transforms.schema_events")

#: How many of a table's latest changes of shape its record keeps: a restart needs those at or after
#: the slot's confirmed position, and shape changes that close together are rare.
RECENT_CHANGES: Final = 8

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)
#: A record or a stored event as the tracker and the partitions read it back: JSON walflow wrote.
_Json = dict[str, Any]


def shape_of(table: Table) -> Shape:
    """``table``'s shape: what a schema event compares and reports."""
    keys = set(table.key_columns)
    return Shape(tuple(ColumnShape(name, type_name, name in keys)
                       for name, type_name in zip(table.columns, table.type_names, strict=True)),
                 table.replica_identity)


def shape_json(shape: Shape) -> _Json:
    """``shape`` as the event's payload and the sink's memory write it."""
    return {"columns": [{"name": c.name, "type": c.type, "key": c.key} for c in shape.columns],
            "replica_identity": shape.replica_identity}


def shape_from_json(data: object) -> Shape | None:
    """A shape :func:`shape_json` wrote; None for anything else (the bucket and the stream are anyone's)."""
    if not isinstance(data, dict) or not isinstance(data.get("columns"), list):
        return None
    columns = []
    for column in data["columns"]:
        if not isinstance(column, dict):
            return None
        name, type_name, key = column.get("name"), column.get("type"), column.get("key")
        if not isinstance(name, str) or not isinstance(type_name, str) or not isinstance(key, bool):
            return None
        columns.append(ColumnShape(name, type_name, key))
    identity = data.get("replica_identity")
    return Shape(tuple(columns), identity) if isinstance(identity, str) else None


def _position(data: _Json) -> tuple[int, int] | None:
    lsn, idx = data.get("commit_lsn"), data.get("commit_idx")
    if type(lsn) is not int or type(idx) is not int:
        return None
    return lsn, idx


def baselines(records: list[_Json], confirmed_lsn: int) -> dict[str, tuple[_Json, Shape]]:
    """The sink's recorded tables: ``schema.table`` → its record, and the shape a restart from
    ``confirmed_lsn`` compares against: the oldest ``old`` of its changes at or after that position
    (they are replayed), else its recorded shape. Records that do not read as walflow's are left out
    (their tables are seen anew)."""
    found: dict[str, tuple[_Json, Shape]] = {}
    for record in records:
        schema, table = record.get("schema"), record.get("table")
        baseline = shape_from_json(record.get("shape"))
        changes = record.get("changes")
        if not isinstance(schema, str) or not isinstance(table, str) or baseline is None \
                or not isinstance(changes, list):
            continue
        for change in reversed(changes):
            position = _position(change) if isinstance(change, dict) else None
            old = shape_from_json(change.get("old")) if isinstance(change, dict) else None
            if position is None or old is None or position[0] < confirmed_lsn:
                break
            baseline = old
        found[f"{schema}.{table}"] = (record, baseline)
    return found


class SchemaTracker:
    """One sink's tables' shapes on the slot's worker: a new version → its change of shape, if any."""

    def __init__(self, recorded: dict[str, tuple[_Json, Shape]], remember: Callable[[str, _Json], None]) -> None:
        """``recorded``: :func:`baselines`' result; ``remember(table, record)``: keep a table's record
        (the sink's memory, :meth:`connectors.nats.state.SinkMemory.record_schema`)."""
        self._remember = remember
        self._records = {name: record for name, (record, _) in recorded.items()}
        #: ``schema.table`` → the shape its next version is compared against.
        self._shapes = {name: shape for name, (_, shape) in recorded.items()}

    def seen(self, change: RawChange) -> SchemaChange | None:
        """``change`` is the first one of a new version of its table: the table's change of shape
        at ``change``, or None (the same shape, or a table seen for the first time)."""
        table = change.table
        name, shape = table.qualified, shape_of(table)
        old = self._shapes.get(name)
        if old == shape:
            return None
        self._shapes[name] = shape
        lsn, idx, micros = change.commit_lsn, change.commit_idx, (change.commit_ts - _EPOCH) // _US
        if old is None:
            record: _Json = {"schema": table.schema, "table": table.name, "changes": []}
            self._records[name] = record
            found = None
        else:
            record = self._records[name]
            found = SchemaChange(table.schema, table.name, old, shape, lsn, idx, micros)
            record["changes"] = [*record["changes"], {
                "commit_lsn": lsn, "commit_idx": idx, "commit_timestamp": _timestamp(micros),
                "old": shape_json(old), "new": shape_json(shape)}][-RECENT_CHANGES:]
            log.info("%s changed shape at commit LSN %s (commit_idx %d): %s", name, lsn_to_str(lsn), idx,
                     what_changed(old, shape))
        record["shape"] = shape_json(shape)
        self._remember(name, record)
        return found


class SchemaEvents:
    """One sink partition's schema events: a :class:`~core.events.SchemaChange` → its message."""

    def __init__(self, sink: SinkConfig, database: str, stored: Callable[[str], _Json | None]) -> None:
        """``stored(subject)``: the last message on ``subject`` in the sink's stream, as a JSON object
        (None: none, or not one)."""
        self._prefix = sink.destination.subject_prefix
        self._database = database
        self._ids = IdScheme(database, sink.name, sink.destination.msg_id)
        self._stored = stored

    def message(self, change: SchemaChange) -> Message | None:
        """``change``'s event, ordered against the whole partition; None when the stream's last
        event of the table already reports it (another partition's) or a later one."""
        subject = schema_subject(self._prefix, self._database, change.schema, change.table)
        if _reported(self._stored(subject), change):
            return None
        msg_id = self._ids.encode_schema(change.commit_lsn, change.commit_idx).decode("ascii")
        message = Message(subject.encode(), to_json(payload(change, self._database, msg_id)), msg_id,
                          (f"{change.schema}.{change.table}", "schema"), change.commit_us / 1_000_000)
        message.row = BARRIER
        return message


def payload(change: SchemaChange, database: str, msg_id: str) -> _Json:
    """The event a consumer reads (the README's *Schema events*)."""
    return {
        "action": "schema",
        "table": {"schema": change.schema, "name": change.table},
        "old": shape_json(change.old),
        "new": shape_json(change.new),
        "metadata": {"database_name": database, "commit_lsn": change.commit_lsn, "commit_idx": change.commit_idx,
                     "commit_timestamp": _timestamp(change.commit_us), "idempotency_key": msg_id},
    }


def _reported(event: _Json | None, change: SchemaChange) -> bool:
    """Whether the stream's last event of the table (``event``, as JSON) makes ``change``'s
    redundant: it reports the same new shape, or stands at ``change``'s position or later."""
    if event is None:
        return False
    metadata = event.get("metadata")
    position = _position(metadata) if isinstance(metadata, dict) else None
    if position is not None and position >= (change.commit_lsn, change.commit_idx):
        return True
    return shape_from_json(event.get("new")) == change.new


class Memory(Protocol):
    """What the schema events need of the sink's memory (``connectors.nats.state.SinkMemory``)."""

    def schema_records(self) -> list[_Json]: ...

    def record_schema(self, table: str, record: _Json) -> None: ...

    def last_message(self, stream: str, subject: str) -> _Json | None: ...


def schema_parts(sink: SinkConfig, database: str, stream: str, captured: tuple[str, ...], memory: Memory,
                 confirmed_lsn: int) -> tuple[SchemaTracker | None, SchemaEvents | None]:
    """A sink's schema-event parts when it has ``schema_events`` (else none): its tracker, with its
    tables' records read back for a restart from ``confirmed_lsn``, and its partitions' events,
    which look in ``stream``. Refuses a stream that would not store the events (one that captures,
    ``captured``, the change subjects only)."""
    if not sink.schema_events:
        return None, None
    wanted = schema_pattern(sink.destination.subject_prefix, database)
    if not any(covers(pattern, wanted) for pattern in captured):
        raise FatalError(
            f"sink '{sink.name}' has schema_events, but stream {stream} does not capture {wanted} (it captures "
            f"{', '.join(captured)}): add that subject to the stream, or set schema_events: false")
    tracker = SchemaTracker(baselines(memory.schema_records(), confirmed_lsn), memory.record_schema)
    return tracker, SchemaEvents(sink, database, functools.partial(memory.last_message, stream))


def _timestamp(micros: int) -> str:
    """A commit time in Unix microseconds as ISO 8601 UTC with six fractional digits, as the envelope writes it."""
    text = (_EPOCH + micros * _US).isoformat(timespec="microseconds")
    return text[:-6] + "Z"


def what_changed(old: Shape, new: Shape) -> str:
    """What changed from ``old`` to ``new``, in a log line's words (names and types only)."""
    before, after = {c.name: c for c in old.columns}, {c.name: c for c in new.columns}
    said = [f"+{n}" for n in after if n not in before] + [f"-{n}" for n in before if n not in after]
    said += [f"{n} {before[n].type} → {after[n].type}" for n in after if n in before and before[n].type != after[n].type]
    said += [f"{n} {'now' if after[n].key else 'no longer'} a key column" for n in after
             if n in before and before[n].key != after[n].key]
    if old.replica_identity != new.replica_identity:
        said.append(f"replica identity {old.replica_identity} → {new.replica_identity}")
    return ", ".join(said) or "column order"


def last_changes(records: list[_Json]) -> list[tuple[str, str]]:
    """Each recorded table's last change of shape in words (``walflow status``): ``(schema.table,
    what and where)``, in name order; tables recorded without a change are left out."""
    found = []
    for record in records:
        changes = record.get("changes")
        last = changes[-1] if isinstance(changes, list) and changes else None
        if not isinstance(last, dict) or not isinstance(record.get("schema"), str) \
                or not isinstance(record.get("table"), str):
            continue
        old, new, position = shape_from_json(last.get("old")), shape_from_json(last.get("new")), _position(last)
        if old is None or new is None or position is None:
            continue
        words = (f"{what_changed(old, new)} (the first change of the new shape at commit LSN "
                 f"{lsn_to_str(position[0])}, commit_idx {position[1]}, committed {last.get('commit_timestamp')})")
        found.append((f"{record['schema']}.{record['table']}", words))
    return sorted(found)


