"""A pgoutput encoder for the tests: the inverse of ``tests.pgoutput_reference``.

Written from PostgreSQL's ``proto.c`` (``logicalrep_write_*``), independently of the decoder's tables,
so that ``encode(decode(b)) == b`` on real captured bytes checks the decoder against the server, and
``decode(encode(m)) == m`` on random messages checks it against every value a field can hold.
"""

from __future__ import annotations

import struct
from typing import assert_never

from tests.pgoutput_reference import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgoutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)


def _xid(xid: int | None) -> bytes:
    """The Int32 xid prefix, present only inside a stream block."""
    return b"" if xid is None else struct.pack("!I", xid)


def _string(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape") + b"\0"


def _tuple(data: TupleData) -> bytes:
    out = [struct.pack("!H", len(data.kinds))]
    for kind, value in zip(data.kinds, data.values, strict=True):
        out.append(bytes([kind]))
        if value is not None:
            out.append(struct.pack("!I", len(value)) + value)
    return b"".join(out)


def encode(msg: PgoutputMessage) -> bytes:
    """The bytes PostgreSQL sends for ``msg``; an xid that is not None is written as the stream prefix."""
    match msg:
        case Begin(final_lsn, commit_ts, xid):
            return b"B" + struct.pack("!QqI", final_lsn, commit_ts, xid)
        case Commit(flags, commit_lsn, end_lsn, commit_ts):
            return b"C" + struct.pack("!BQQq", flags, commit_lsn, end_lsn, commit_ts)
        case Origin(origin_lsn, name):
            return b"O" + struct.pack("!Q", origin_lsn) + _string(name)
        case Relation(xid, relid, namespace, name, replica_identity, columns):
            out = [b"R", _xid(xid), struct.pack("!I", relid), _string(namespace), _string(name)]
            out.append(replica_identity.encode() + struct.pack("!H", len(columns)))
            for column in columns:
                out.append(bytes([column.flags]) + _string(column.name))
                out.append(struct.pack("!Ii", column.type_oid, column.typmod))
            return b"".join(out)
        case Type(xid, oid, namespace, name):
            return b"Y" + _xid(xid) + struct.pack("!I", oid) + _string(namespace) + _string(name)
        case Insert(xid, relid, new):
            return b"I" + _xid(xid) + struct.pack("!I", relid) + b"N" + _tuple(new)
        case Update(xid, relid, old_kind, old, new):
            head = b"U" + _xid(xid) + struct.pack("!I", relid)
            if old_kind is not None and old is not None:
                head += old_kind.encode() + _tuple(old)
            return head + b"N" + _tuple(new)
        case Delete(xid, relid, old_kind, old):
            return b"D" + _xid(xid) + struct.pack("!I", relid) + old_kind.encode() + _tuple(old)
        case Truncate(xid, relids, cascade, restart_identity):
            flags = (1 if cascade else 0) | (2 if restart_identity else 0)
            return b"T" + _xid(xid) + struct.pack(f"!IB{len(relids)}I", len(relids), flags, *relids)
        case Message(xid, transactional, lsn, prefix, content):
            head = b"M" + _xid(xid) + struct.pack("!BQ", 1 if transactional else 0, lsn) + _string(prefix)
            return head + struct.pack("!I", len(content)) + content
        case StreamStart(xid, first_segment):
            return b"S" + struct.pack("!IB", xid, 1 if first_segment else 0)
        case StreamStop():
            return b"E"
        case StreamCommit(xid, flags, commit_lsn, end_lsn, commit_ts):
            return b"c" + struct.pack("!IBQQq", xid, flags, commit_lsn, end_lsn, commit_ts)
        case StreamAbort(xid, subxid, abort_lsn, abort_ts):
            if abort_lsn is None or abort_ts is None:
                return b"A" + struct.pack("!II", xid, subxid)
            return b"A" + struct.pack("!IIQq", xid, subxid, abort_lsn, abort_ts)
        case BeginPrepare(prepare_lsn, end_lsn, prepare_ts, xid, gid):
            return b"b" + struct.pack("!QQqI", prepare_lsn, end_lsn, prepare_ts, xid) + _string(gid)
        case Prepare(flags, prepare_lsn, end_lsn, prepare_ts, xid, gid):
            return b"P" + struct.pack("!BQQqI", flags, prepare_lsn, end_lsn, prepare_ts, xid) + _string(gid)
        case CommitPrepared(flags, commit_lsn, end_lsn, commit_ts, xid, gid):
            return b"K" + struct.pack("!BQQqI", flags, commit_lsn, end_lsn, commit_ts, xid) + _string(gid)
        case RollbackPrepared(flags, prepare_end_lsn, rollback_end_lsn, prepare_ts, rollback_ts, xid, gid):
            fields = struct.pack("!BQQqqI", flags, prepare_end_lsn, rollback_end_lsn, prepare_ts, rollback_ts, xid)
            return b"r" + fields + _string(gid)
        case StreamPrepare(flags, prepare_lsn, end_lsn, prepare_ts, xid, gid):
            return b"p" + struct.pack("!BQQqI", flags, prepare_lsn, end_lsn, prepare_ts, xid) + _string(gid)
        case _:
            assert_never(msg)
