"""The sans-IO core of the source: CopyData messages in, changes and positions out.

The session hands every CopyData message of the replication stream to :meth:`Decoder.feed`;
the decoder never touches a socket, a thread or a clock, so it is tested with bytes. It reads
exactly what the session asks the server for (``proto_version '1'``, text values, logical
messages; no streaming of in-progress transactions, no two-phase decoding, so everything that
arrives is committed) and refuses everything else with :class:`DecodeError`: a client that
guesses past bytes it could not read loses changes without noticing.

What it promises the session:

- ``received`` is the furthest LSN seen (the status update's ``write``); position markers (an
  ``int`` LSN: a commit's end, a keepalive's walEnd while no transaction is open) are staged
  in order with the changes, and everything before a marker has been staged.
- Each change is named by its transaction's commit LSN and its index in it, counted as Sequin
  counts ``commit_idx``, and staged as soon as it is decoded (a transaction is never held
  whole); a resumed session skips what a previous run already emitted (:class:`ResumePoint`).
- Logical messages are input: only those under a prefix walflow owns, within its size limit,
  are kept (:mod:`connectors.postgres.messages`); Sequin's transaction annotations apply to
  the changes that follow them.
- Each staged change carries its memory estimate (:func:`change_memory`); a row message over
  ``max_change`` has its largest values replaced by markers (:mod:`core.sizes`).
- Values stay the text the server sent (:class:`core.events.RawChange`): conversion is
  :mod:`transforms.convert`'s. Why each rule holds: ``docs/design.md``, *connectors/postgres/decoder.py*.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol, cast

import psycopg

from connectors.postgres.messages import ANNOTATIONS_CLEAR, ANNOTATIONS_SET, HEARTBEAT, LIMITS, Reason
from connectors.postgres.protocol import XLOGDATA_HEADER, parse_keepalive, pg_timestamp
from connectors.postgres.relations import Column, Relation, TypeName
from core.errors import FatalError
from core.events import UNCHANGED_TOAST, Action, RawChange, RawRow, RawValue, Table, new_tuple
from core.sizes import largest, replaced

#: An index beyond any transaction's last: "all of it" in ResumePoint.emitted_up_to.
WHOLE_TRANSACTION: Final = 1 << 62

#: What a change costs in memory until JetStream acknowledges it, estimated from its WAL
#: message's size and its number of column values (decoded, converted and rendered as
#: JSON on the way): the buffer and the epoch budget count this, so ``buffer_mb`` and
#: ``max_memory_mb`` bound what the process really holds. ``tests/`` hold it above
#: tracemalloc's measure for narrow, wide and many-column rows.
_MEMORY_PER_CHANGE: Final = 512
_MEMORY_PER_COLUMN: Final = 120
_MEMORY_PER_WAL_BYTE: Final = 2
#: A row message longer than this is decoded on views of it, its values copied once: below it,
#: copying the message first and slicing the copy costs less than a view per value.
VIEW_ABOVE: Final = 64 * 1024

# Message kinds (a byte, read as an int) as int literals: compiled, a ``Final`` literal is a C
# constant, where a name unpacked from ``b"BCIUD"`` is a module dict lookup at every use
# (tests/connectors/postgres/test_decoder.py holds each to its letter).
_XLOGDATA: Final = 0x77  # w
_KEEPALIVE: Final = 0x6B  # k
_BEGIN: Final = 0x42  # B
_COMMIT: Final = 0x43  # C
_INSERT: Final = 0x49  # I
_UPDATE: Final = 0x55  # U
_DELETE: Final = 0x44  # D
_RELATION: Final = 0x52  # R
_TYPE: Final = 0x59  # Y
_ORIGIN: Final = 0x4F  # O
_TRUNCATE: Final = 0x54  # T
_MESSAGE: Final = 0x4D  # M
_NEW: Final = 0x4E  # N
_KEY: Final = 0x4B  # K
_OLD: Final = 0x4F  # O
_TEXT: Final = 0x74  # t
_NULL: Final = 0x6E  # n
_UNCHANGED: Final = 0x75  # u
#: The XLogData header's length, as a name of this module (compiled: not a lookup in protocol's).
_HEADER: Final = XLOGDATA_HEADER
_REPLICA_IDENTITIES: Final = frozenset("dnfi")
_TRUNCATE_FLAGS: Final = 3  # cascade, restart identity
_MESSAGE_TRANSACTIONAL: Final = 1
_ANNOTATIONS_SET: Final = ANNOTATIONS_SET.encode()
_ANNOTATIONS_CLEAR: Final = ANNOTATIONS_CLEAR.encode()
_HEARTBEAT: Final = HEARTBEAT.encode()
#: Longer than every prefix walflow owns: a logical message's prefix is looked for in this
#: many bytes (copied), so another's message of any size is passed over without a copy.
_PREFIX_WINDOW: Final = 64

# XLogData header ('w', dataStart, walEnd, sendTime) and the pgoutput message behind it,
# one unpack each, skipping ('x') what is not used.
#   dataStart, then after 'B': final_lsn, commit_ts, xid
_XLOG_BEGIN: Final = struct.Struct("!xQ16xxQqI")
_BEGIN_COMMIT_TS: Final = slice(XLOGDATA_HEADER + 9, XLOGDATA_HEADER + 17)  # for the catalog's loader
#   dataStart, then after 'C': flags, commit_lsn, end_lsn (commit_ts: Begin had it)
_XLOG_COMMIT: Final = struct.Struct("!xQ16xxBQQ8x")
#   dataStart, then after 'I'/'U'/'D': relid, the first tuple's marker; the tuple follows
_XLOG_ROW: Final = struct.Struct("!xQ16xxIB")
_XLOG_START: Final = struct.Struct("!xQ")
_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_U64: Final = struct.Struct("!Q")
_COLUMN_TYPE: Final = struct.Struct("!Ii")  # type_oid, typmod
_TRUNCATE_HEAD: Final = struct.Struct("!IB")  # nrels, flags
_XLOG_MESSAGE: Final = struct.Struct("!xQ16xxBQ")  # dataStart, then after 'M': flags, lsn; the prefix follows
#: Message types that exist but that only options this session does not set bring.
_NOT_REQUESTED: Final = {
    ord("S"): "Stream Start", ord("E"): "Stream Stop", ord("c"): "Stream Commit", ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare", ord("P"): "Prepare", ord("K"): "Commit Prepared", ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}


class DecodeError(FatalError):
    """Bytes from the walsender that are not what the session asked for, byte by byte.

    Fatal: walflow cannot read past them, and nothing after them is confirmed, so the
    changes are still in the slot when a fixed walflow starts again.
    """


def change_memory(wal_bytes: int, values: int) -> int:
    """The estimated memory of a change from a WAL message of ``wal_bytes`` carrying ``values`` column values."""
    return _MEMORY_PER_CHANGE + _MEMORY_PER_COLUMN * values + _MEMORY_PER_WAL_BYTE * wal_bytes


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where to pick up: every transaction committed at or before ``lsn`` is done, and in
    the transaction at ``commit_lsn`` (if any) the changes up to ``commit_idx`` were emitted."""

    lsn: int = 0
    commit_lsn: int | None = None
    commit_idx: int = -1

    def emitted_up_to(self, commit_lsn: int) -> int:
        """The last index of the transaction at ``commit_lsn`` that was emitted before: -1 for
        none, beyond any index for all of it (a transaction is checked once, not per change)."""
        # A transaction is done iff its commit record starts before a position that is the
        # end of a commit record (or a keepalive walEnd): the server's own skip rule.
        if commit_lsn < self.lsn:
            return WHOLE_TRANSACTION + 1
        return self.commit_idx if commit_lsn == self.commit_lsn else -1


class Catalog(Protocol):
    """What the decoder needs to know beyond the bytes (:class:`connectors.postgres.types.Catalog`)."""

    def type_seen(self, type_name: TypeName) -> None: ...

    def describe(self, relation: Relation) -> Table: ...

    @property
    def commit_time(self) -> Callable[[bytes], datetime]:
        """8 bytes of binary timestamptz → an aware UTC datetime; ``psycopg.DataError`` out of range."""
        ...


class Signal(NamedTuple):
    """A logical message that must be read in order with the changes (a backfill's
    watermarks and requests, :mod:`connectors.postgres.signals`), staged where it was committed."""

    commit_lsn: int
    commit_ts: datetime
    content: bytes


#: What the decoder stages: changes, signals, and position markers (an LSN).
Item = RawChange | Signal | int


class Decoder:
    """Decodes one replication session's CopyData messages into staged changes and markers."""

    def __init__(
        self,
        catalog: Catalog,
        resume: ResumePoint,
        on_message: Callable[[str, bytes], None] | None = None,
        staged_prefixes: frozenset[str] = frozenset(),
        on_ignored: Callable[[str, Reason, str], None] | None = None,
        max_change: int = sys.maxsize,
        on_oversized: Callable[[RawChange, str, int], None] | None = None,
    ) -> None:
        """Logical messages (``pg_logical_emit_message``) under the prefixes walflow owns
        (:data:`connectors.postgres.messages.LIMITS`) and within their size: transactional
        ones with a prefix in ``staged_prefixes`` are staged in order as :class:`Signal`;
        heartbeats go to ``on_message(prefix, content)``; one over its size limit, or a
        signal outside a transaction, to ``on_ignored(prefix, reason, detail)``. Every other
        message is passed over, its content not even copied. ``max_change``: the longest row
        message staged whole (bytes of CopyData; default: no limit); ``on_oversized(change,
        column, size)`` is called for each value a longer one loses."""
        self._catalog = catalog
        self._commit_time = catalog.commit_time
        self.resume = resume
        self._on_message = on_message
        self._on_ignored = on_ignored
        self._staged_prefixes = frozenset(prefix.encode() for prefix in staged_prefixes)
        self._max_change = max_change
        self._view_above = min(max_change, VIEW_ABOVE)
        self._on_oversized = on_oversized
        #: The furthest LSN seen: the status update's ``write``.
        self.received = resume.lsn
        self._marked = resume.lsn  # the last position marker staged
        self._last = (resume.commit_lsn, resume.commit_idx)  # the last change staged
        # beyond this LSN a previous run emitted nothing: emitted_up_to is -1
        self._resume_lsn = max(resume.lsn, resume.commit_lsn or 0)
        self._tables: dict[int, Table] = {}
        # The open transaction (none: _txn_lsn is None): its commit LSN, time and xid, the
        # index of its next change, and the last index a previous run already emitted.
        self._txn_lsn: int | None = None
        self._txn_ts = pg_timestamp(0)
        self._txn_xid = 0
        self._txn_idx = 0
        self._txn_emitted = -1
        #: The JSON text of the open transaction's latest ``sequin:transaction_annotations.set``.
        self._txn_annotations: bytes | None = None
        #: Decoded and not yet taken, with their sizes (0 for a marker) and the sizes' total.
        self.staged: list[Item] = []
        self.staged_sizes: list[int] = []
        self.staged_size = 0

    # -- the session's side ----------------------------------------------------------------

    def feed(self, data: memoryview | bytes) -> bool:
        """Decode one CopyData message; True if the server asked for a reply at once."""
        # Keep this short: in CPython 3.11 a comparison whose jump needs an EXTENDED_ARG (a block
        # over 255 code units) is not specialized, and these run for every message.
        try:
            if data[0] != _XLOGDATA:
                return self._keepalive(data)
            size = len(data)
            tag = data[_HEADER] if size > _HEADER else -1
            if tag == _INSERT or tag == _UPDATE or tag == _DELETE:
                if size > self._view_above:
                    self._large(data, size, tag)
                else:
                    self._row(bytes(data), tag)
            elif tag == _BEGIN and size == _XLOG_BEGIN.size:
                self._begin(data)
            elif tag == _COMMIT and size == _XLOG_COMMIT.size:
                self._commit(data)
            elif tag == _MESSAGE:
                self._message(data)
            else:
                self._other(bytes(data), tag)
            return False
        except (struct.error, IndexError, UnicodeDecodeError, OverflowError) as exc:  # Overflow: a timestamp no datetime holds
            raise DecodeError(f"malformed message {_show(data)}: {exc}") from None

    def _keepalive(self, data: memoryview | bytes) -> bool:
        """A primary keepalive ('k' walEnd sendTime replyRequested); anything else is refused."""
        if data[0] != _KEEPALIVE or len(data) != 18:
            raise DecodeError(f"unexpected CopyData message {_show(data)} from the walsender")
        keepalive = parse_keepalive(data)
        self.received = max(self.received, keepalive.wal_end)
        if self._txn_lsn is None:
            self.mark(keepalive.wal_end)  # nothing open: every commit before walEnd was received
        return keepalive.reply_requested

    def mark(self, lsn: int) -> None:
        """Stage a position: everything staged so far lies before ``lsn``."""
        if lsn > self._marked:
            self._marked = lsn
            staged = self.staged
            if staged and type(staged[-1]) is int:
                staged[-1] = lsn  # consecutive markers collapse into one, as in the buffer
            else:
                staged.append(lsn)
                self.staged_sizes.append(0)

    def take(self) -> tuple[list[Item], list[int], int]:
        """What was staged (items, their sizes, the total), emptied."""
        taken = self.staged, self.staged_sizes, self.staged_size
        self.staged, self.staged_sizes, self.staged_size = [], [], 0
        return taken

    def start_at(self, server_confirmed: int) -> None:
        """The slot's confirmed position, as START_REPLICATION reported it: on a fresh start
        (nothing emitted yet) that is where the pipeline stands."""
        self.received = max(self.received, server_confirmed)
        if server_confirmed > self.resume.lsn and self.resume.commit_lsn is None:
            self.mark(server_confirmed)

    def resume_point(self) -> ResumePoint:
        """Where a new session continues right after everything staged so far."""
        commit_lsn, idx = self._last
        if commit_lsn is not None and self._marked <= commit_lsn:  # that transaction is unfinished
            return ResumePoint(self._marked, commit_lsn, idx)
        return ResumePoint(self._marked)

    # -- transactions ----------------------------------------------------------------------

    def _begin(self, data: memoryview | bytes) -> None:
        start, commit_lsn, commit_ts, xid = _XLOG_BEGIN.unpack_from(data)
        if self._txn_lsn is not None:
            raise DecodeError(f"Begin of transaction {xid} inside transaction {self._txn_xid}")
        self.received = max(self.received, start)
        self._txn_lsn = commit_lsn
        try:
            self._txn_ts = self._commit_time(data[_BEGIN_COMMIT_TS])  # type: ignore[arg-type]  # any buffer will do
        except psycopg.DataError:  # beyond what a datetime holds: the exact way, or refuse
            try:
                self._txn_ts = pg_timestamp(commit_ts)
            except OverflowError:
                raise DecodeError(f"commit timestamp {commit_ts} of transaction {xid} is out of range") from None
        self._txn_xid = xid
        self._txn_idx = 0
        self._txn_annotations = None
        self._txn_emitted = -1 if commit_lsn > self._resume_lsn else self.resume.emitted_up_to(commit_lsn)

    def _commit(self, data: memoryview | bytes) -> None:
        start, flags, commit_lsn, end_lsn = _XLOG_COMMIT.unpack_from(data)
        if self._txn_lsn is None:
            raise DecodeError("Commit outside a transaction")
        if flags or commit_lsn != self._txn_lsn:
            raise DecodeError(f"Commit (flags {flags}, commit LSN {commit_lsn}) does not end the open transaction")
        self.received = max(self.received, start)
        self._txn_lsn = None
        if self._txn_emitted < WHOLE_TRANSACTION:
            self.mark(end_lsn)

    def _stage(self, change: RawChange, size: int) -> None:
        self.staged.append(change)
        self.staged_sizes.append(size)
        self.staged_size += size
        self._last = (change.commit_lsn, change.commit_idx)

    # -- row changes -----------------------------------------------------------------------

    def _row(self, buf: bytes | memoryview, tag: int) -> None:
        """Insert ('I' relid 'N' tuple), Update ('U' relid ['K'|'O' tuple] 'N' tuple), Delete ('D' relid 'K'|'O' tuple)."""
        start, relid, marker = _XLOG_ROW.unpack_from(buf)
        commit_lsn = self._txn_lsn
        if commit_lsn is None:
            raise DecodeError(f"row change for relation {relid} outside a transaction")
        table = self._tables.get(relid)
        if table is None:
            raise DecodeError(f"row change for relation {relid} before its Relation message")
        ncols = len(table.columns)
        pos = _XLOG_ROW.size
        new: RawRow | None = None
        old: RawRow | None = None
        old_is_key = False
        action: Action
        if tag == _INSERT:
            if marker != _NEW:
                raise DecodeError(f"Insert: expected 'N' (new tuple), got {bytes([marker])!r}")
            action = "insert"
            new, pos = _read_tuple(buf, pos, ncols)
        elif tag == _UPDATE:
            action = "update"
            old_is_key = marker == _KEY
            if marker == _KEY or marker == _OLD:
                old, pos = _read_tuple(buf, pos, ncols)
                marker = buf[pos]
                pos += 1
            if marker != _NEW:
                raise DecodeError(f"Update: expected 'N' (new tuple), got {bytes([marker])!r}")
            new, pos = _read_tuple(buf, pos, ncols)
        else:
            if marker != _KEY and marker != _OLD:
                raise DecodeError(f"Delete: expected 'K' or 'O' (old tuple), got {bytes([marker])!r}")
            action = "delete"
            old_is_key = marker == _KEY
            old, pos = _read_tuple(buf, pos, ncols)
        if pos != len(buf):
            raise DecodeError(f"{len(buf) - pos} unexpected trailing bytes at offset {pos}")
        self.received = max(self.received, start)
        idx = self._txn_idx
        self._txn_idx = idx + 1
        if idx > self._txn_emitted:
            # what _stage and change_memory do, inline: this runs for every change; and
            # new_tuple (core/events.py), as RawChange's generated __new__ is a Python call of its own
            size = (_MEMORY_PER_CHANGE + _MEMORY_PER_WAL_BYTE * len(buf)
                    + _MEMORY_PER_COLUMN * ((0 if new is None else ncols) + (0 if old is None else ncols)))
            self.staged.append(new_tuple(RawChange, (action, table, new, old, old_is_key, commit_lsn, idx,
                                                     self._txn_ts, self._txn_xid, None, self._txn_annotations)))
            self.staged_sizes.append(size)
            self.staged_size += size
            self._last = (commit_lsn, idx)

    def _large(self, data: memoryview | bytes, size: int, tag: int) -> None:
        """A row message over :data:`VIEW_ABOVE`: decoded as every row is, but on views of
        ``data``, so that each value it keeps is copied once (not the message first). One over
        ``max_change`` is staged with its largest values replaced (:func:`core.sizes.largest`,
        key columns kept) until what is left fits: those are not copied at all, and the change is
        counted at the size it keeps."""
        before = len(self.staged)
        self._row(data, tag)  # on a view, its slices are views too
        if len(self.staged) == before:  # a previous run emitted it
            return
        change = cast(RawChange, self.staged[-1])
        places, removed = largest((change.old, change.new), change.table.key_positions, size - self._max_change)
        lost = [{c for r, c, _ in places if r == row} for row in (0, 1)]
        fitted = self.staged[-1] = change._replace(old=None if change.old is None else replaced(change.old, lost[0]),
                                                   new=None if change.new is None else replaced(change.new, lost[1]))
        if not places:
            return
        saved = _MEMORY_PER_WAL_BYTE * removed
        self.staged_sizes[-1] -= saved
        self.staged_size -= saved
        if self._on_oversized is not None:
            for _, c, length in places:
                self._on_oversized(fitted, change.table.columns[c], length)

    # -- everything else -------------------------------------------------------------------

    def _other(self, buf: bytes, tag: int) -> None:
        """Relation, Type, Origin, Truncate and logical messages; anything else is refused."""
        if tag < 0:
            raise DecodeError(f"XLogData of {len(buf)} bytes holds no message")
        (start,) = _XLOG_START.unpack_from(buf)
        self.received = max(self.received, start)
        pos = _HEADER + 1
        if tag == _RELATION:
            relation = _relation(buf, pos)
            self._tables[relation.relid] = self._catalog.describe(relation)
        elif tag == _TYPE:
            (oid,) = _U32.unpack_from(buf, pos)
            namespace, pos = _string(buf, pos + 4)
            name, pos = _string(buf, pos)
            _end(buf, pos)
            self._catalog.type_seen(TypeName(oid, namespace, name))
        elif tag == _ORIGIN:
            if self._txn_lsn is None:
                raise DecodeError("Origin outside a transaction")
            _, pos = _string(buf, pos + 8)  # origin LSN, name: replayed transactions are not reported as such
            _end(buf, pos)
        elif tag == _TRUNCATE:
            self._truncate(buf, pos)
        elif tag == _BEGIN or tag == _COMMIT:
            raise DecodeError(f"{'Begin' if tag == _BEGIN else 'Commit'} of {len(buf) - _HEADER} bytes")
        elif tag in _NOT_REQUESTED:
            raise DecodeError(f"unexpected {_NOT_REQUESTED[tag]} message: walflow did not ask for it")
        else:
            raise DecodeError(f"unknown pgoutput message type {bytes([tag])!r}")

    def _truncate(self, buf: bytes, pos: int) -> None:
        """'T' nrels flags relid…: one change per truncated table."""
        nrels, flags = _TRUNCATE_HEAD.unpack_from(buf, pos)
        pos += 5
        if flags & ~_TRUNCATE_FLAGS:
            raise DecodeError(f"unknown truncate flags {flags:#04x}")
        if len(buf) - pos != 4 * nrels:  # checked first: nrels is an untrusted 32-bit count
            raise DecodeError(f"{nrels} relation ids need {4 * nrels} bytes, {len(buf) - pos} remain")
        commit_lsn = self._txn_lsn
        if commit_lsn is None:
            raise DecodeError("Truncate outside a transaction")
        idx = self._txn_idx  # one message, one index (as Sequin counts), shared by its tables
        self._txn_idx = idx + 1
        for (relid,) in _U32.iter_unpack(buf[pos:]):
            table = self._tables.get(relid)
            if table is None:
                raise DecodeError(f"Truncate of relation {relid} before its Relation message")
            if idx > self._txn_emitted:
                change = RawChange("truncate", table, None, None, False, commit_lsn, idx, self._txn_ts, self._txn_xid)
                self._stage(change, change_memory(len(buf), 0))

    def _message(self, data: memoryview | bytes) -> None:
        """'M' flags lsn prefix length content: walflow's own are checked and handed on, others'
        are passed over (:mod:`connectors.postgres.messages`). Every transactional message
        takes its place among the transaction's changes, whoever wrote it."""
        start, flags, _lsn = _XLOG_MESSAGE.unpack_from(data)
        self.received = max(self.received, start)
        if flags & ~_MESSAGE_TRANSACTIONAL:
            raise DecodeError(f"unknown message flags {flags:#04x}")
        if flags:
            if self._txn_lsn is None:
                raise DecodeError("transactional logical message outside a transaction")
            self._txn_idx += 1  # as Sequin counts commit_idx
        pos = _XLOG_MESSAGE.size
        head = bytes(data[pos : pos + _PREFIX_WINDOW])
        end = head.find(0)
        limit = LIMITS.get(head[:end]) if end >= 0 else None
        if limit is None:
            return  # not walflow's (nor Sequin's annotations): not copied, not decoded
        prefix = head[:end]
        pos += end + 1
        (length,) = _U32.unpack_from(data, pos)
        pos += 4
        if len(data) - pos != length:
            raise DecodeError(f"content length {length} does not match the {len(data) - pos} bytes that remain")
        if length > limit:
            self._ignored(prefix, "too_large", f"{length:,} bytes, more than the {limit:,} walflow reads there")
            return
        content = bytes(data[pos:])
        if prefix == _HEARTBEAT:
            if self._on_message is not None:
                self._on_message(HEARTBEAT, content)
        elif prefix in self._staged_prefixes:
            if not flags:
                self._ignored(prefix, "malformed", "not transactional (walflow writes its signals in transactions)")
            elif self._txn_emitted < WHOLE_TRANSACTION:  # not in a transaction a previous run finished
                commit_lsn = self._txn_lsn
                assert commit_lsn is not None
                size = change_memory(length, 0)
                self.staged.append(Signal(commit_lsn, self._txn_ts, content))
                self.staged_sizes.append(size)
                self.staged_size += size
        elif flags and prefix == _ANNOTATIONS_SET:
            self._txn_annotations = content
        elif flags and prefix == _ANNOTATIONS_CLEAR:
            self._txn_annotations = None

    def _ignored(self, prefix: bytes, reason: Reason, detail: str) -> None:
        if self._on_ignored is not None:
            self._on_ignored(prefix.decode(), reason, detail)


def _read_tuple(buf: bytes | memoryview, pos: int, ncols: int) -> tuple[RawRow, int]:
    if isinstance(buf, bytes):
        return _tuple(buf, pos, ncols)
    return _view_tuple(buf, pos, ncols)


def _tuple(buf: bytes, pos: int, ncols: int) -> tuple[RawRow, int]:
    """The TupleData at ``pos`` (Int16 count, then per column a kind byte and, for ``t``, an
    Int32 length and the text), and the offset after it. Runs for every column of every change:
    on ``bytes``, so that compiled (core/compiled.py) each byte read is a C index and each length
    four of them, not a ``struct`` call; a large message's view takes :func:`_view_tuple`."""
    count = buf[pos] << 8 | buf[pos + 1]
    if count != ncols:
        raise DecodeError(f"a tuple of {count} columns, the relation has {ncols}")
    pos += 2
    size = len(buf)
    values: list[Any] = []
    for _ in range(count):
        kind = buf[pos]
        if kind == _TEXT:
            length = buf[pos + 1] << 24 | buf[pos + 2] << 16 | buf[pos + 3] << 8 | buf[pos + 4]
            start = pos + 5
            pos = start + length
            if pos > size:
                raise DecodeError(f"a {length}-byte value at offset {start} runs past the end")
            values.append(buf[start:pos])
        else:
            values.append(_no_text(kind, pos))
            pos += 1
    return tuple(values), pos


def _view_tuple(buf: memoryview, pos: int, ncols: int) -> tuple[RawRow, int]:
    """:func:`_tuple` on a view of a large message (``Decoder._large``): its values are views,
    each copied once later, never the whole message. Rare: ``struct`` reads it."""
    (count,) = _U16.unpack_from(buf, pos)
    if count != ncols:
        raise DecodeError(f"a tuple of {count} columns, the relation has {ncols}")
    pos += 2
    values: list[Any] = []
    for _ in range(count):
        kind = buf[pos]
        if kind == _TEXT:
            (length,) = _U32.unpack_from(buf, pos + 1)
            start = pos + 5
            if start + length > len(buf):
                raise DecodeError(f"a {length}-byte value at offset {start} runs past the end")
            values.append(buf[start : start + length])
            pos = start + length
        else:
            values.append(_no_text(kind, pos))
            pos += 1
    return tuple(values), pos


def _no_text(kind: int, pos: int) -> RawValue:
    """A column without text: NULL, or a TOASTed value the change left alone; 'b' (binary) only
    comes with the binary option, which the session does not set."""
    if kind == _NULL:
        return None
    if kind == _UNCHANGED:
        return UNCHANGED_TOAST
    raise DecodeError(f"unexpected tuple data kind {bytes([kind])!r} at offset {pos}")


def _relation(buf: bytes, pos: int) -> Relation:
    """'R' relid namespace name replica-identity ncols (flags name type_oid typmod)…"""
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
        if flags & ~1:
            raise DecodeError(f"unknown column flags {flags:#04x}")
        column, pos = _string(buf, pos + 1)
        type_oid, typmod = _COLUMN_TYPE.unpack_from(buf, pos)
        pos += 8
        columns.append(Column(column, type_oid, typmod, bool(flags)))
    _end(buf, pos)
    return Relation(relid, namespace, name, replica_identity, tuple(columns))


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    """The NUL-terminated UTF-8 string at ``pos``, and the offset after its terminator. A name
    that is not UTF-8 (a database in another encoding than UTF8 or SQL_ASCII) keeps its other
    bytes as ``\\xNN``: distinct names stay distinct, and reading goes on."""
    end = buf.find(0, pos)
    if end < 0:
        raise DecodeError(f"string at offset {pos} has no NUL terminator")
    return buf[pos:end].decode("utf-8", "backslashreplace"), end + 1


def _end(buf: bytes, pos: int) -> None:
    """Refuse bytes after the last field: the message is not what its type byte says."""
    if pos != len(buf):
        raise DecodeError(f"{len(buf) - pos} unexpected trailing bytes at offset {pos}")


def _show(data: memoryview | bytes) -> str:
    head = bytes(data[:1])
    tag = bytes(data[_HEADER : _HEADER + 1]) if head == b"w" else b""
    return f"{head!r}{'/' + repr(tag) if tag else ''} ({len(data)} bytes)"
