"""The tests' reference decoder of pgoutput, PostgreSQL's logical replication protocol, versions 1 to 4.

walflow's own decoder (``connectors/postgres/decoder.py``) reads only what its session asks
for, straight into changes and positions. This one reads every message of every protocol
version into a typed object, written independently and checked against a real server
(``tests/connectors/postgres/test_pgoutput_reference.py``): it is the oracle that walflow's
decoder is differentially tested against.

Every XLogData payload from a pgoutput slot holds exactly one message: a type byte, then fields in
network byte order as PostgreSQL's ``proto.c`` writes them. :class:`Decoder` turns one such payload
into one immutable, typed object. Anything it cannot account for byte by byte (an unknown type byte,
a truncated body, trailing bytes, an impossible marker, a message that cannot occur in the current
stream state) raises :class:`DecodeError`. Nothing is skipped: a replication client that guesses past
bytes it could not read loses changes without noticing.

The decoder stops at the wire format. Column values stay the raw text or ``typsend`` bytes the server
sent, and relations, transactions and streamed transactions are the caller's to track.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias


class DecodeError(ValueError):
    """A payload that is not exactly one valid pgoutput message in the decoder's current state."""


@dataclass(frozen=True, slots=True)
class Begin:
    """``B``: a transaction's first published change follows. ``final_lsn`` is its commit record's start."""

    final_lsn: int
    commit_ts: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """``C``: the transaction committed; ``commit_lsn``/``end_lsn`` are its commit record's start/end."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Origin:
    """``O``: the transaction was replayed from replication origin ``name`` (after Begin or Stream Start)."""

    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    """One published column of a :class:`Relation`."""

    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        """Part of the replica identity (every column under ``REPLICA IDENTITY FULL``)."""
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """``R``: the schema that the following changes to table ``relid`` use (replaces any earlier one)."""

    xid: int | None
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """``Y``: a column type with an OID of 10000 or more (for a domain: the domain's OID, its base type's name)."""

    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class TupleData:
    """One row: per column a kind byte (``n`` NULL, ``u`` unchanged TOAST, ``t`` text, ``b`` binary).

    ``values[i]`` holds the raw bytes of a ``t``/``b`` column and ``None`` for ``n``/``u``.
    """

    kinds: bytes
    values: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Insert:
    """``I``: a new row."""

    xid: int | None
    relid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """``U``: a changed row; the old row comes only as the key (``K``) or the full row (``O``) when needed."""

    xid: int | None
    relid: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """``D``: a deleted row, as its key (``K``, other columns NULL) or in full (``O``)."""

    xid: int | None
    relid: int
    old_kind: str
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    """``T``: one ``TRUNCATE`` statement, for every published table it emptied."""

    xid: int | None
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    """``M``: ``pg_logical_emit_message()`` output; non-transactional ones arrive outside any transaction."""

    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    """``S``: a block of changes of the in-progress transaction ``xid`` follows, up to Stream Stop."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """``E``: the current stream block ends."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """``c``: the streamed transaction ``xid`` committed."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """``A``: discard subtransaction ``subxid`` of streamed transaction ``xid`` (all of it when equal).

    ``abort_lsn``/``abort_ts`` are sent only with ``streaming 'parallel'`` (protocol 4).
    """

    xid: int
    subxid: int
    abort_lsn: int | None
    abort_ts: int | None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """``b``: a transaction that will end in ``PREPARE TRANSACTION gid`` follows."""

    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    """``P``: the transaction begun by Begin Prepare was prepared."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """``K``: ``COMMIT PREPARED gid``."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """``r``: ``ROLLBACK PREPARED gid``; the prepare's end LSN and time identify the prepare it undoes."""

    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    """``p``: the streamed transaction ``xid`` was prepared."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


PgoutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)

_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_U64: Final = struct.Struct("!Q")
_BEGIN: Final = struct.Struct("!QqI")  # final_lsn, commit_ts, xid
_COMMIT: Final = struct.Struct("!BQQq")  # flags, commit_lsn, end_lsn, commit_ts
_STREAM_START: Final = struct.Struct("!IB")  # xid, first_segment
_STREAM_COMMIT: Final = struct.Struct("!IBQQq")  # xid, flags, commit_lsn, end_lsn, commit_ts
_STREAM_ABORT: Final = struct.Struct("!II")  # xid, subxid
_STREAM_ABORT_PARALLEL: Final = struct.Struct("!IIQq")  # xid, subxid, abort_lsn, abort_ts
_BEGIN_PREPARE: Final = struct.Struct("!QQqI")  # prepare_lsn, end_lsn, prepare_ts, xid
_PREPARE: Final = struct.Struct("!BQQqI")  # flags, lsn, end_lsn, ts, xid: Prepare, Commit Prepared, Stream Prepare
_ROLLBACK_PREPARED: Final = struct.Struct("!BQQqqI")  # flags, prepare_end, rollback_end, prepare_ts, rollback_ts, xid
_RELID_MARKER: Final = struct.Struct("!IB")  # relid, then 'N', 'K' or 'O'
_COLUMN_TYPE: Final = struct.Struct("!Ii")  # type_oid, typmod
_TRUNCATE: Final = struct.Struct("!IB")  # nrels, flags
_MESSAGE: Final = struct.Struct("!BQ")  # flags, lsn

_NULL, _UNCHANGED, _TEXT, _BINARY = b"nutb"
_NEW, _KEY, _OLD = b"NKO"
_REPLICA_IDENTITIES: Final = frozenset("dnfi")
_TRUNCATE_CASCADE, _TRUNCATE_RESTART_IDENTITY = 1, 2
_MESSAGE_TRANSACTIONAL = 1


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    """The NUL-terminated string at ``pos`` (UTF-8; other bytes as surrogates, which encode back
    to them: a database in another encoding sends its names as they are), and the offset after
    its terminator."""
    end = buf.find(0, pos)
    if end < 0:
        raise DecodeError(f"string at offset {pos} has no NUL terminator")
    return buf[pos:end].decode("utf-8", "surrogateescape"), end + 1


def _tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    """The TupleData at ``pos`` (Int16 ncols, then per column a kind byte and, for t/b, a counted value)."""
    (ncols,) = _U16.unpack_from(buf, pos)
    pos += 2
    size = len(buf)
    unpack_length = _U32.unpack_from
    kinds: list[int] = []
    values: list[bytes | None] = []
    for i in range(ncols):
        kind = buf[pos]
        if kind == _TEXT or kind == _BINARY:
            (length,) = unpack_length(buf, pos + 1)
            pos += 5
            end = pos + length
            if end > size:
                raise DecodeError(f"column {i}: a {length}-byte value at offset {pos} runs past the end")
            values.append(buf[pos:end])
            pos = end
        elif kind == _NULL or kind == _UNCHANGED:
            values.append(None)
            pos += 1
        else:
            raise DecodeError(f"column {i}: unknown tuple data kind {bytes([kind])!r} at offset {pos}")
        kinds.append(kind)
    return TupleData(bytes(kinds), tuple(values)), pos


def _end(buf: bytes, pos: int) -> None:
    """Refuse bytes after the last field: the message is not what its type byte says."""
    if pos != len(buf):
        raise DecodeError(f"{len(buf) - pos} unexpected trailing bytes at offset {pos}")


def _fixed(buf: bytes, layout: struct.Struct) -> tuple[int, ...]:
    """The fields of a message that is its type byte and ``layout``, nothing more or less."""
    if len(buf) != 1 + layout.size:
        raise DecodeError(f"expected {1 + layout.size} bytes, got {len(buf)}")
    return layout.unpack_from(buf, 1)


# -- messages that carry the [xid] prefix inside a stream block: (buffer, offset after prefix, xid) ------------


def _insert(buf: bytes, pos: int, xid: int | None) -> Insert:
    relid, marker = _RELID_MARKER.unpack_from(buf, pos)
    if marker != _NEW:
        raise DecodeError(f"expected 'N' (new tuple), got {bytes([marker])!r}")
    new, pos = _tuple(buf, pos + 5)
    _end(buf, pos)
    return Insert(xid, relid, new)


def _update(buf: bytes, pos: int, xid: int | None) -> Update:
    relid, marker = _RELID_MARKER.unpack_from(buf, pos)
    pos += 5
    old_kind: str | None = None
    old: TupleData | None = None
    if marker == _KEY or marker == _OLD:
        old_kind = "K" if marker == _KEY else "O"
        old, pos = _tuple(buf, pos)
        marker = buf[pos]
        pos += 1
    if marker != _NEW:
        raise DecodeError(f"expected 'N' (new tuple), got {bytes([marker])!r}")
    new, pos = _tuple(buf, pos)
    _end(buf, pos)
    return Update(xid, relid, old_kind, old, new)


def _delete(buf: bytes, pos: int, xid: int | None) -> Delete:
    relid, marker = _RELID_MARKER.unpack_from(buf, pos)
    if marker != _KEY and marker != _OLD:
        raise DecodeError(f"expected 'K' or 'O' (old tuple), got {bytes([marker])!r}")
    old, pos = _tuple(buf, pos + 5)
    _end(buf, pos)
    return Delete(xid, relid, "K" if marker == _KEY else "O", old)


def _relation(buf: bytes, pos: int, xid: int | None) -> Relation:
    (relid,) = _U32.unpack_from(buf, pos)
    namespace, pos = _string(buf, pos + 4)
    name, pos = _string(buf, pos)
    replica_identity = chr(buf[pos])
    if replica_identity not in _REPLICA_IDENTITIES:
        raise DecodeError(f"unknown replica identity {replica_identity!r}")
    (ncols,) = _U16.unpack_from(buf, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        flags = buf[pos]
        column, pos = _string(buf, pos + 1)
        type_oid, typmod = _COLUMN_TYPE.unpack_from(buf, pos)
        pos += 8
        columns.append(Column(flags, column, type_oid, typmod))
    _end(buf, pos)
    return Relation(xid, relid, namespace, name, replica_identity, tuple(columns))


def _type(buf: bytes, pos: int, xid: int | None) -> Type:
    (oid,) = _U32.unpack_from(buf, pos)
    namespace, pos = _string(buf, pos + 4)
    name, pos = _string(buf, pos)
    _end(buf, pos)
    return Type(xid, oid, namespace, name)


def _truncate(buf: bytes, pos: int, xid: int | None) -> Truncate:
    nrels, flags = _TRUNCATE.unpack_from(buf, pos)
    pos += 5
    if flags & ~(_TRUNCATE_CASCADE | _TRUNCATE_RESTART_IDENTITY):
        raise DecodeError(f"unknown truncate flags {flags:#04x}")
    if len(buf) - pos != 4 * nrels:  # checked first: nrels is an untrusted 32-bit count
        raise DecodeError(f"{nrels} relation ids need {4 * nrels} bytes, {len(buf) - pos} remain")
    relids = tuple(relid for (relid,) in _U32.iter_unpack(buf[pos:]))
    return Truncate(xid, relids, bool(flags & _TRUNCATE_CASCADE), bool(flags & _TRUNCATE_RESTART_IDENTITY))


def _message(buf: bytes, pos: int, xid: int | None) -> Message:
    flags, lsn = _MESSAGE.unpack_from(buf, pos)
    if flags & ~_MESSAGE_TRANSACTIONAL:
        raise DecodeError(f"unknown message flags {flags:#04x}")
    prefix, pos = _string(buf, pos + 9)
    (length,) = _U32.unpack_from(buf, pos)
    pos += 4
    if len(buf) - pos != length:
        raise DecodeError(f"content length {length} does not match the {len(buf) - pos} bytes that remain")
    return Message(xid, bool(flags & _MESSAGE_TRANSACTIONAL), lsn, prefix, buf[pos:])


# -- messages without an xid prefix ---------------------------------------------------------------------------


def _begin(buf: bytes) -> Begin:
    return Begin(*_fixed(buf, _BEGIN))


def _commit(buf: bytes) -> Commit:
    return Commit(*_fixed(buf, _COMMIT))


def _origin(buf: bytes) -> Origin:
    (origin_lsn,) = _U64.unpack_from(buf, 1)
    name, pos = _string(buf, 9)
    _end(buf, pos)
    return Origin(origin_lsn, name)


def _stream_start(buf: bytes) -> StreamStart:
    xid, first_segment = _fixed(buf, _STREAM_START)
    if first_segment > 1:
        raise DecodeError(f"first_segment must be 0 or 1, got {first_segment}")
    return StreamStart(xid, first_segment == 1)


def _stream_stop(buf: bytes) -> StreamStop:
    _end(buf, 1)
    return StreamStop()


def _stream_commit(buf: bytes) -> StreamCommit:
    return StreamCommit(*_fixed(buf, _STREAM_COMMIT))


def _stream_abort(buf: bytes) -> StreamAbort:
    """Told apart by size: abort LSN and time are appended only under ``streaming 'parallel'``."""
    if len(buf) == 1 + _STREAM_ABORT_PARALLEL.size:
        return StreamAbort(*_STREAM_ABORT_PARALLEL.unpack_from(buf, 1))
    xid, subxid = _fixed(buf, _STREAM_ABORT)
    return StreamAbort(xid, subxid, None, None)


def _with_gid(buf: bytes, layout: struct.Struct) -> tuple[tuple[int, ...], str]:
    """The fixed fields of a two-phase message, then its NUL-terminated gid, which ends the message."""
    fields = layout.unpack_from(buf, 1)
    gid, pos = _string(buf, 1 + layout.size)
    _end(buf, pos)
    return fields, gid


def _begin_prepare(buf: bytes) -> BeginPrepare:
    (prepare_lsn, end_lsn, prepare_ts, xid), gid = _with_gid(buf, _BEGIN_PREPARE)
    return BeginPrepare(prepare_lsn, end_lsn, prepare_ts, xid, gid)


def _prepare(buf: bytes) -> Prepare:
    (flags, prepare_lsn, end_lsn, prepare_ts, xid), gid = _with_gid(buf, _PREPARE)
    return Prepare(flags, prepare_lsn, end_lsn, prepare_ts, xid, gid)


def _commit_prepared(buf: bytes) -> CommitPrepared:
    (flags, commit_lsn, end_lsn, commit_ts, xid), gid = _with_gid(buf, _PREPARE)
    return CommitPrepared(flags, commit_lsn, end_lsn, commit_ts, xid, gid)


def _rollback_prepared(buf: bytes) -> RollbackPrepared:
    (flags, prepare_end_lsn, rollback_end_lsn, prepare_ts, rollback_ts, xid), gid = _with_gid(buf, _ROLLBACK_PREPARED)
    return RollbackPrepared(flags, prepare_end_lsn, rollback_end_lsn, prepare_ts, rollback_ts, xid, gid)


def _stream_prepare(buf: bytes) -> StreamPrepare:
    (flags, prepare_lsn, end_lsn, prepare_ts, xid), gid = _with_gid(buf, _PREPARE)
    return StreamPrepare(flags, prepare_lsn, end_lsn, prepare_ts, xid, gid)


_IN_TRANSACTION: Final[dict[int, Callable[[bytes, int, int | None], PgoutputMessage]]] = {
    ord("I"): _insert,
    ord("U"): _update,
    ord("D"): _delete,
    ord("R"): _relation,
    ord("Y"): _type,
    ord("T"): _truncate,
    ord("M"): _message,
}
_CONTROL: Final[dict[int, Callable[[bytes], PgoutputMessage]]] = {
    ord("B"): _begin,
    ord("C"): _commit,
    ord("O"): _origin,
    ord("S"): _stream_start,
    ord("E"): _stream_stop,
    ord("c"): _stream_commit,
    ord("A"): _stream_abort,
    ord("b"): _begin_prepare,
    ord("P"): _prepare,
    ord("K"): _commit_prepared,
    ord("r"): _rollback_prepared,
    ord("p"): _stream_prepare,
}
_NAMES: Final = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}
_ORIGIN, _STREAM_STOP = b"OE"
_MALFORMED: Final = (struct.error, IndexError, UnicodeDecodeError, DecodeError)


class Decoder:
    """Decodes the pgoutput messages of one replication session, in the order the server sent them.

    Stateful because DML/Relation/Type/Message/Truncate carry an Int32 xid prefix only inside a
    Stream Start…Stream Stop block: the same bytes mean different things in and outside a block.
    The decoder follows the blocks and refuses what cannot occur in the current state (Stream Stop
    outside a block, Begin or a second Stream Start inside one) rather than misread the bytes that
    follow. Use a new decoder for each replication connection: after a reconnect the server starts
    outside any block. A message that fails to decode leaves the state as it was.
    """

    __slots__ = ("_stream_xid",)

    def __init__(self) -> None:
        self._stream_xid: int | None = None  # the Stream Start xid of the open block, None outside blocks

    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._stream_xid is not None

    def decode(self, data: bytes | memoryview) -> PgoutputMessage:
        """The message in ``data``: one XLogData payload, starting with its type byte.

        Column values, Message content and strings in the result are copies, so ``data`` (for
        example a memoryview into psycopg's receive buffer) may be reused afterwards.
        """
        buf = data if type(data) is bytes else bytes(data)
        if not buf:
            raise DecodeError("empty pgoutput message")
        tag = buf[0]
        body = _IN_TRANSACTION.get(tag)
        if body is not None:
            try:
                if self._stream_xid is None:
                    return body(buf, 1, None)
                (xid,) = _U32.unpack_from(buf, 1)
                return body(buf, 5, xid)
            except _MALFORMED as exc:
                raise _malformed(tag, buf, exc) from exc
        control = _CONTROL.get(tag)
        if control is None:
            raise DecodeError(f"unknown pgoutput message type {bytes([tag])!r} ({tag:#04x})")
        self._check_state(tag)
        try:
            message = control(buf)
        except _MALFORMED as exc:
            raise _malformed(tag, buf, exc) from exc
        if isinstance(message, StreamStart):
            self._stream_xid = message.xid
        elif tag == _STREAM_STOP:
            self._stream_xid = None
        return message

    def _check_state(self, tag: int) -> None:
        """Refuse a control message that cannot occur in the current stream state."""
        if tag == _ORIGIN:  # follows Begin, Begin Prepare, or the first Stream Start of a transaction
            return
        if tag == _STREAM_STOP:
            if self._stream_xid is None:
                raise DecodeError("pgoutput Stream Stop outside a stream block")
        elif self._stream_xid is not None:
            raise DecodeError(
                f"pgoutput {_NAMES[tag]} inside the stream block of transaction {self._stream_xid} "
                "(Stream Stop missing)"
            )


def _malformed(tag: int, buf: bytes, exc: Exception) -> DecodeError:
    """The error for a message whose type is known but whose body is not valid."""
    return DecodeError(f"malformed pgoutput {_NAMES[tag]} message ({len(buf)} bytes): {exc}")
