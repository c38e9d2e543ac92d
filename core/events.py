"""Source-neutral events: what a source emits, what transforms and sinks read.

A source hands the dataflow :class:`RawChange` items: a row is a tuple of column *texts*,
the database's own text output of each value, exactly as it arrived (pgoutput sends it,
and a backfill's ``SELECT`` in text format reads the same). Everything that must happen
in order on the source's worker — framing, positions, filtering by table, the group key —
works on those texts and never needs a converted value, so the CPU-heavy part
(:mod:`transforms.convert` and the envelope) can run on whichever worker owns the key.

:class:`Change` is the same change with values converted (numbers, datetimes, JSON, …);
the envelope renders it into a :class:`core.message.Message`, what a sink publishes: subject,
payload, id and headers (a module of its own, compiled with the hot path).

Changes are ``NamedTuple``: immutable, cheap to build, and dropped from the garbage
collector's lists when they hold no containers. Markers are pickle-stable, so they are
recognised after an item crossed to another process: ``UNCHANGED_TOAST`` is a singleton (``is``
keeps working), an :class:`OversizedValue` a plain class (``type(x) is OversizedValue``).
"""

from __future__ import annotations

import logging
import secrets
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple, Self

from core.message import Message

#: ``read`` is a row a backfill read from the table, not a change the log recorded.
Action = Literal["insert", "update", "delete", "read", "truncate"]


class UnchangedToast:
    """Marks a TOASTed column whose value the source did not send because the update left it alone."""

    _instance: Self | None = None

    def __new__(cls) -> Self:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"  # unpickles as this module's singleton, so `is` keeps working

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast()
#: How the payload shows it: Sequin's value for a TOASTed column that an update left alone.
UNCHANGED_TOAST_MARKER: Final = "unchanged_toast"
#: How the payload shows an :class:`OversizedValue`: this, a colon and the value's size in bytes
#: (``"__walflow_oversized_value:52428800"``), a string in the value's place whatever its type,
#: as Debezium writes ``"__debezium_unavailable_value"``.
OVERSIZED_MARKER: Final = "__walflow_oversized_value"


class OversizedValue:
    """Stands for a column value too large to publish (``core/sizes.py`` has the policy): its
    size in bytes as the source sent its text, and the text's CRC-32, so that two markers of one
    value are equal (``changes`` does not report an oversized column whose value stayed the same)
    and a marker never equals another value. It holds nothing of the value itself.

    A plain class: it pickles by its module's name and its two numbers, so ``type(x) is
    OversizedValue`` keeps working after an item crossed to another process."""

    __slots__ = ("crc", "size")

    def __init__(self, size: int, crc: int) -> None:
        self.size = size
        self.crc = crc

    @classmethod
    def of(cls, text: bytes | memoryview) -> OversizedValue:
        """The marker of ``text`` (a view is read in place, not copied)."""
        return cls(len(text), zlib.crc32(text))

    @property
    def text(self) -> str:
        """What the payload writes in its place (:data:`OVERSIZED_MARKER`)."""
        return f"{OVERSIZED_MARKER}:{self.size}"

    def __eq__(self, other: object) -> bool:
        return type(other) is OversizedValue and other.size == self.size and other.crc == self.crc

    def __hash__(self) -> int:
        return hash((self.size, self.crc))

    def __reduce__(self) -> tuple[type[OversizedValue], tuple[int, int]]:
        return OversizedValue, (self.size, self.crc)

    def __repr__(self) -> str:
        return f"OversizedValue({self.size}, {self.crc:#010x})"


#: One column as the source sent it: its text, None for NULL, UNCHANGED_TOAST, or an
#: OversizedValue in place of a text too large to publish.
RawValue = bytes | None | UnchangedToast | OversizedValue
#: A row as column texts, in the order of :attr:`Table.columns`.
RawRow = tuple[RawValue, ...]
#: A row with converted values, by column name.
Row = dict[str, Any]
#: Turns one column text into its Python value (raises for a value Python cannot hold).
Loader = Callable[[bytes], Any]


class Position(NamedTuple):
    """Where a change stands in the source's total order, and the name it is published under.

    ``lsn`` is the commit LSN of the change's transaction, ``idx`` its index in it: every
    change has its own, and a replay gives it the same one.
    """

    lsn: int
    idx: int


#: What a source needs to rebuild a table's loaders in another process: plain data, its own
#: format (for Postgres, ``connectors.postgres.types.TypeSpecs``).
TypeSpecs = Any


def _new_uid() -> int:
    return secrets.randbits(63)


@dataclass(frozen=True, slots=True, eq=False)
class Table:
    """One version of a table's shape, as the source described it when its changes began.

    Changes refer to it rather than copying it, and a new version (after DDL) is a new
    object, so every change is read with the columns it was written with. Compared by
    identity: steps cache what they derive from a table per version.

    **Across processes** a table travels once per sink partition and version, before the
    first change that uses it (``transforms/dispatch.py``); changes then name it by
    :attr:`uid`. Its loaders are functions and do not pickle: a table pickles as its plain
    fields plus ``types``, and the receiving process rebuilds the loaders with ``rebuild``
    (a module-level function of the source, pickled by name) — the same loaders, without
    a connection to the database.
    """

    schema: str
    name: str
    columns: tuple[str, ...]
    #: What identifies a row, the group key's default: the primary key or replica identity
    #: columns; empty when there are none (the whole table is then one group).
    key_columns: tuple[str, ...]
    #: The columns a key-only old row carries (the replica identity's).
    identity_columns: tuple[str, ...]
    #: Per column, the loader that converts its text (:mod:`transforms.convert`).
    loaders: tuple[Loader, ...] = field(repr=False)
    #: The configured name of the database it belongs to (a flow may read several).
    database: str = ""
    #: The source's id of the relation (Postgres's OID): one per table, whatever its versions.
    relid: int = 0
    #: How ``loaders`` are rebuilt in another process, from ``types`` (None: they cannot be).
    rebuild: Callable[[TypeSpecs], tuple[Loader, ...]] | None = field(default=None, repr=False)
    types: TypeSpecs = field(default=None, repr=False)
    #: Names this version in the items that cross to a sink partition (random: unique
    #: across the processes of a cluster and the sessions of a run).
    uid: int = field(default_factory=_new_uid, repr=False)
    #: Per column, its type as the database names it with its modifier (``character varying(20)``):
    #: what a schema event reports (empty: the source did not say).
    type_names: tuple[str, ...] = field(default=(), repr=False)
    #: The source's replica identity (Postgres: ``default``, ``nothing``, ``full``, ``index``; empty: not said).
    replica_identity: str = ""
    #: ``schema.table``, as the config writes tables.
    qualified: str = field(init=False, repr=False)
    #: Column name → position in a raw row.
    positions: dict[str, int] = field(init=False, repr=False)
    #: The positions of :attr:`key_columns` in column order (Sequin's ``record_pks`` order).
    key_positions: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qualified", f"{self.schema}.{self.name}")
        positions = {name: i for i, name in enumerate(self.columns)}
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "key_positions", tuple(sorted(positions[name] for name in self.key_columns)))

    def __reduce__(self) -> tuple[Callable[..., Table], tuple[Any, ...]]:
        if self.rebuild is None:
            raise TypeError(f"table {self.qualified} was described without a way to rebuild its loaders elsewhere")
        return _rebuilt, (self.schema, self.name, self.columns, self.key_columns, self.identity_columns,
                          self.database, self.relid, self.rebuild, self.types, self.uid, self.type_names,
                          self.replica_identity)


def _rebuilt(schema: str, name: str, columns: tuple[str, ...], key_columns: tuple[str, ...],
             identity_columns: tuple[str, ...], database: str, relid: int,
             rebuild: Callable[[TypeSpecs], tuple[Loader, ...]], types: TypeSpecs, uid: int,
             type_names: tuple[str, ...], replica_identity: str) -> Table:
    """A :class:`Table` unpickled in another process, its loaders rebuilt there. This runs
    inside Bytewax's exchange, where an exception surfaces only as a panic of its thread:
    what failed is logged first."""
    try:
        loaders = rebuild(types)
    except Exception:
        logging.getLogger("walflow.events").exception(
            "table %s.%s of database %s: its loaders could not be rebuilt in this process from %r",
            schema, name, database, types)
        raise
    return Table(schema, name, columns, key_columns, identity_columns, loaders, database, relid, rebuild, types, uid,
                 type_names, replica_identity)


class ReadOf(NamedTuple):
    """What makes a row a backfill's ``read``: which sink asked, which backfill, which row.

    ``row_key`` is the row's primary key as a JSON array of its texts: with the backfill's
    id it names the read (:meth:`core.ids.IdScheme.encode_read`), the same whichever chunk
    and run read the row, so a chunk read again after a crash publishes nothing twice.
    """

    sink: str
    backfill: str
    row_key: str


#: Builds a ``NamedTuple`` of this module from a tuple of all its fields in order,
#: ``new_tuple(Change, fields)``, as the class's generated ``__new__`` does, without running
#: that function: on the hot path (a change, a read), where a compiled module calling the class
#: runs its ``__new__`` interpreted (~2k instructions a change). The tests hold each use to
#: the class's fields.
new_tuple: Final = tuple.__new__


class RawChange(NamedTuple):
    """One row change of a committed transaction (or a row a backfill read), values as texts.

    ``new`` is the row after the change (insert, update, read). ``old`` is what the source
    sent of the row before it: for a delete always, for an update only when the source
    sends old rows (REPLICA IDENTITY FULL, or a changed key). With ``old_is_key`` it holds
    values only for :attr:`Table.identity_columns`; the others are absent, not NULL.

    A ``read`` carries :class:`ReadOf` in ``read`` and, as its position, the commit LSN of
    the backfill chunk's high watermark and its index among the chunk's rows: where it
    stands in the stream, after every change committed before the watermark.
    """

    action: Action
    table: Table
    new: RawRow | None
    old: RawRow | None
    old_is_key: bool
    commit_lsn: int
    commit_idx: int
    commit_ts: datetime
    xid: int
    read: ReadOf | None = None
    #: The JSON text its transaction was annotated with before it (Sequin's
    #: ``sequin:transaction_annotations.set`` message), else None.
    annotations: bytes | None = None


class Commit(NamedTuple):
    """The end of a transaction, after its last change, in the source's output: only from a
    slot with a sink that publishes in commit order (:attr:`config.schema.SinkConfig.in_commit_order`),
    which needs to know where a transaction ends (an atomic batch's commit, a marker's END)."""

    database: str
    commit_lsn: int
    xid: int
    commit_ts: datetime


class ColumnShape(NamedTuple):
    """One column of a table's shape as a schema event reports it."""

    name: str
    type: str
    #: One of the table's :attr:`Table.key_columns` (what identifies a row, ``record_pks``).
    key: bool


class Shape(NamedTuple):
    """What a schema event compares between two versions of a table: its columns in order, each
    with its type and whether it is a key column, and its replica identity. Plain data: it pickles
    across processes and is kept as JSON in the sink's memory (``connectors/nats/state.py``)."""

    columns: tuple[ColumnShape, ...]
    replica_identity: str


class SchemaChange(NamedTuple):
    """A table the sink publishes changed shape: the old and the new, and where the first change
    of the new shape stands (its position and commit time in Unix microseconds). Made on the slot's
    worker (``transforms/schema_events.py``), it crosses to every sink partition that receives a
    change of the new shape, ahead of the first (``core/wire.py``)."""

    schema: str
    table: str
    old: Shape
    new: Shape
    commit_lsn: int
    commit_idx: int
    commit_us: int


class Change(NamedTuple):
    """A :class:`RawChange` with its values converted: what the envelope renders."""

    action: Action
    schema: str
    table: str
    key_columns: tuple[str, ...]
    new: Row | None
    old: Row | None
    commit_lsn: int
    commit_idx: int
    commit_ts: datetime
    xid: int
    read: ReadOf | None = None
    annotations: bytes | None = None
    #: The primary key's values as Postgres prints them, in column order (Sequin's
    #: ``record_pks``); empty without a key.
    pks: tuple[str, ...] = ()


#: The :attr:`Message.row` of a message that is ordered against every other message of its
#: partition, not only its row's: a transaction's BEGIN and END markers, a schema event. No
#: group key's hash is this (Python's ``hash`` is a signed 64-bit value).
BARRIER: Final = 1 << 64

#: In a render's output for a sink with ``transactions: atomic``: the messages since the last
#: one (or since the start) are one unit, visible in the stream all at once — a transaction's
#: at its COMMIT, a backfill's read alone. The atomic publisher reads it; it is never published.
TRANSACTION_END: Final = Message(b"", b"", "", ("", ""))


class JsonText:
    """A json or jsonb value nested too deep to load as Python values: its text, exactly as
    Postgres sent it (valid JSON: Postgres checked it), published as it is
    (:func:`connectors.postgres.types.json_loads`). Shaping sees this object: a condition or
    a path cannot look inside it."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return type(other) is JsonText and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"JsonText({len(self.text)} bytes)"
