"""Streaming-replication framing inside COPY BOTH: XLogData and keepalives in, status updates out.

The layouts are PostgreSQL's (its documentation's *Streaming Replication Protocol*). LSNs are plain ints;
timestamps on the wire are microseconds since 2000-01-01 UTC (the "Postgres epoch").
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_UNIX_US = 946_684_800 * 1_000_000
_fromtimestamp = datetime.fromtimestamp

_XLOGDATA = struct.Struct("!QQq")  # dataStart, walEnd, sendTime (after the 'w' byte)
_KEEPALIVE = struct.Struct("!QqB")  # walEnd, sendTime, replyRequested (after the 'k' byte)
_STATUS = struct.Struct("!cQQQqB")  # 'r', write, flush, apply, clientTime, replyRequested

XLOGDATA_HEADER = 1 + _XLOGDATA.size  # 25: the pgoutput message starts here


def lsn_to_str(lsn: int) -> str:
    """``0/16B3748`` form, as Postgres prints LSNs."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def str_to_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def pg_timestamp(us: int) -> datetime:
    """A wire timestamp as an aware UTC datetime (microseconds kept).

    Called for every transaction, so it takes the faster way first: ``fromtimestamp`` on a
    float, which is exact to well under a microsecond for any date near the present; the
    result is used only if its microseconds are the wire value's, which makes it exact (the
    float is never off by a whole second), else the exact sum is computed.
    """
    unix_us = us + _PG_EPOCH_UNIX_US
    try:
        ts = _fromtimestamp(unix_us / 1_000_000, UTC)
    except (OverflowError, ValueError, OSError):
        pass
    else:
        if ts.microsecond == unix_us % 1_000_000:
            return ts
    return PG_EPOCH + timedelta(microseconds=us)


def pg_now() -> int:
    return time.time_ns() // 1000 - _PG_EPOCH_UNIX_US


@dataclass(frozen=True, slots=True)
class Keepalive:
    """Primary keepalive 'k': walEnd is the end of the last WAL record the walsender decoded."""

    wal_end: int
    reply_requested: bool


def parse_keepalive(data: memoryview | bytes) -> Keepalive:
    wal_end, _send_time, reply = _KEEPALIVE.unpack_from(data, 1)
    return Keepalive(wal_end, bool(reply))


def status_update(write: int, flush: int, reply_requested: bool = False) -> bytes:
    """Standby status update 'r'. ``flush`` 0 confirms nothing; apply mirrors flush."""
    return _STATUS.pack(b"r", write, flush, flush, pg_now(), int(reply_requested))
