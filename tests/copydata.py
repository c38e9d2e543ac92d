"""CopyData messages built by hand for the sans-IO tests of the replication source (decoder,
positions): XLogData around pgoutput messages (``tests/pgoutput_encode.py``), keepalives, a
catalog without a database."""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import datetime

from connectors.postgres import relations
from connectors.postgres.protocol import pg_timestamp
from core.events import Table
from tests import pgoutput_reference as ref
from tests.pgoutput_encode import encode

_HEADER = struct.Struct("!cQQq")  # XLogData: 'w', dataStart, walEnd, sendTime
TS = 770_000_000_000_000  # a commit time in 2024, in Postgres-epoch microseconds


def xlog(message: ref.PgoutputMessage | bytes, lsn: int = 0) -> bytes:
    """One XLogData CopyData message holding ``message``."""
    body = message if isinstance(message, bytes) else encode(message)
    return _HEADER.pack(b"w", lsn, lsn, 0) + body


def keepalive(wal_end: int, reply: bool = False) -> bytes:
    return struct.pack("!cQqB", b"k", wal_end, 0, int(reply))


class FakeCatalog:
    """A catalog without a database: every column loads as text, keys are the flagged columns."""

    def __init__(self) -> None:
        self.types: list[relations.TypeName] = []

    def type_seen(self, type_name: relations.TypeName) -> None:
        self.types.append(type_name)

    def describe(self, relation: relations.Relation) -> Table:
        keys = tuple(c.name for c in relation.columns if c.is_key)
        return Table(relation.namespace, relation.name, tuple(c.name for c in relation.columns), keys, keys,
                     tuple(bytes.decode for _ in relation.columns))

    @property
    def commit_time(self) -> Callable[[bytes], datetime]:
        return lambda raw: pg_timestamp(int.from_bytes(raw, signed=True))


def text(*values: str | None) -> ref.TupleData:
    return ref.TupleData(bytes(b"n"[0] if v is None else b"t"[0] for v in values),
                         tuple(None if v is None else v.encode() for v in values))


ORDERS = ref.Relation(None, 16400, "public", "orders", "d",
                      (ref.Column(1, "id", 23, -1), ref.Column(0, "note", 25, -1)))


def transaction(commit_lsn: int, end_lsn: int, *changes: ref.PgoutputMessage, xid: int = 7) -> list[bytes]:
    return [xlog(ref.Begin(commit_lsn, TS, xid), commit_lsn - 100), *(xlog(c, commit_lsn - 50) for c in changes),
            xlog(ref.Commit(0, commit_lsn, end_lsn, TS), commit_lsn)]
