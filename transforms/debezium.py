"""The Debezium envelope (``envelope: debezium``): one change as the value of a Debezium
PostgreSQL connector's change event, JSON converter with schemas disabled, so that Debezium
consumers (Flink's ``debezium-json``, Debezium's own sinks, hand-written ones) read it::

    {"before": {...} | null, "after": {...} | null,
     "source": {"version", "connector": "postgresql", "name", "ts_ms", "snapshot", "db",
                "sequence", "ts_us", "ts_ns", "schema", "table", "txId", "lsn", "xmin"},
     "op": "c" | "u" | "d" | "r", "ts_ms", "ts_us", "ts_ns", "transaction": null}

Keys in the order Debezium's JSON converter writes them, its schema's (Debezium 2.6-3.4:
``SchemaFactory.sourceInfoSchemaBuilder``, ``PostgresSourceInfoStructMaker``,
``Envelope.defineSchema``; 3.5 appends ``origin`` and ``origin_lsn``, set only for a change
that came through a replication origin, left out here).

**Rows**: ``before`` is an update's old row when Postgres sent one (REPLICA IDENTITY FULL, or
the key's columns when the key changed), else null, and a delete's old row (under REPLICA
IDENTITY DEFAULT its key columns, the others null); ``after`` is the new row of an insert,
update or read, null for a delete. Render passes both shaped (columns renamed, masked, the
TOAST policy applied); they are encoded here only. An unchanged TOAST value a row still
holds is Debezium's placeholder ``"__debezium_unavailable_value"`` (its default
``unavailable.value.placeholder``, as a string for every type); a value too large to publish
is walflow's marker, ``"__walflow_oversized_value:<bytes>"`` (``core/sizes.py``; Debezium has
no such marker).

**Values follow walflow's Sequin encoding** (:meth:`transforms.envelope.Envelope.encode_row`,
``timestamp_format`` included), not Debezium's logical types: numeric as a decimal string
(as ``decimal.handling.mode=string``; Debezium's default writes base64 of the unscaled
bytes), timestamps as ISO 8601 with six digits (Debezium: ``timestamp`` as epoch
milli/microseconds, ``timestamptz`` as ISO), dates and times as ISO (Debezium: days since the
epoch, microseconds since midnight), json and jsonb as JSON values (Debezium: their text in
a string), bytea as Postgres's hex text (Debezium: base64), intervals as ``{"months",
"days", "microseconds"}`` (Debezium: microseconds), arrays and the rest as the Sequin
payload shows them (``README.md``, *Values, type by type*).

**Source**: ``name`` is the database's config name (Debezium's ``topic.prefix``), ``db`` the
Postgres database, ``version`` walflow's, ``ts_ms``/``ts_us``/``ts_ns`` the commit's time.
``txId`` is the transaction's id and ``lsn`` its commit LSN: Debezium's ``lsn`` is each
change's own, which pgoutput does not give walflow. For the same reason ``sequence`` is
null (Debezium's is ``["<last commit LSN>","<this change's LSN>"]``; a pair made of commit
LSNs would order the changes of one transaction as equal, a wrong answer where none is
honest), and so is ``xmin`` (Debezium's only with ``xmin.fetch.interval.ms``). A backfill's
read has ``snapshot: "true"`` (else ``"false"``), ``lsn`` the chunk's watermark, where the
read stands in the stream, and ``txId`` null: it is no transaction's change. (Debezium's
incremental snapshots, which walflow's backfills resemble, say ``"incremental"`` and null
``lsn``; ``"true"`` is its initial snapshot's.)

**Envelope**: ``op`` as Debezium's (``c`` insert, ``u`` update, ``d`` delete, ``r`` read);
``ts_ms``/``ts_us``/``ts_ns`` when walflow rendered it (Debezium: when the connector
processed it), so ``ts_ms - source.ts_ms`` is the lag as in Debezium; ``transaction`` null
(Debezium without ``provide.transaction.metadata``).

**Where walflow differs in events**: an update that changes the key is one ``u`` whose
``before`` holds the old key (Debezium sends a ``d`` for the old key and a ``c`` for the
new); a delete is not followed by a tombstone (a Kafka compaction device, nothing in NATS);
truncates are not published, as with the Sequin envelope.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from pydantic_core import to_json

from config.schema import DatabaseConfig, SinkConfig
from core.events import UNCHANGED_TOAST, Change, Row
from transforms.envelope import Envelope, unix_microseconds

#: Debezium's ``unavailable.value.placeholder``: what a TOASTed column an update left alone shows.
UNAVAILABLE: Final = "__debezium_unavailable_value"
#: Debezium's ``op`` of each action.
OPS: Final = {"insert": b"c", "update": b"u", "delete": b"d", "read": b"r"}


def _walflow_version() -> str:
    try:
        return version("walflow")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


_VERSION: Final = _walflow_version()
#: The value around its parts: before, after, the source's start (version, connector, name),
#: its ts_ms, snapshot, db, ts_us, ts_ns, schema and table, txId, lsn; op, and the envelope's
#: ts_ms, ts_us, ts_ns.
_VALUE: Final = (
    b'{"before":%s,"after":%s,"source":{%s"ts_ms":%d,"snapshot":"%s","db":%s,"sequence":null,"ts_us":%d,'
    b'"ts_ns":%d,%s"txId":%s,"lsn":%d,"xmin":null},"op":"%s","ts_ms":%d,"ts_us":%d,"ts_ns":%d,"transaction":null}'
)


class Debezium:
    """The Debezium envelope of one sink: a change's shaped rows → its change-event value."""

    def __init__(self, sink: SinkConfig, database: DatabaseConfig, clock: Callable[[], int] = time.time_ns) -> None:
        """``clock``: the envelope's ``ts_*``, in nanoseconds since the epoch (tests fix it)."""
        self._rows = Envelope(sink, database)
        self._clock = clock
        self._start = b'"version":%s,"connector":"postgresql","name":%s,' % (to_json(_VERSION), to_json(database.name))
        self._db = to_json(database.database)
        #: (schema, table) -> the source's ``"schema":…,"table":…,``.
        self._tables: dict[tuple[str, str], bytes] = {}

    def payload(self, change: Change, before: Row | None, after: Row | None, key: bytes) -> bytes:
        """``change``'s Debezium value, from its rows as render shaped them (see the module's
        docstring for which rows). ``key`` is the message's id: Debezium's value has no field
        for it (it travels as ``Nats-Msg-Id``)."""
        op = OPS.get(change.action)
        if op is None:
            raise ValueError(f"a {change.action} has no payload: SinkFilter must drop it before the envelope")
        names = self._tables.get((change.schema, change.table))
        if names is None:
            names = self._tables[(change.schema, change.table)] = b'"schema":%s,"table":%s,' % (
                to_json(change.schema), to_json(change.table))
        committed = unix_microseconds(change.commit_ts)
        rendered = self._clock()
        read = change.read is not None
        return _VALUE % (
            self._row(before),
            self._row(after),
            self._start,
            committed // 1000,
            b"true" if read else b"false",
            self._db,
            committed,
            committed * 1000,
            names,
            b"null" if read else b"%d" % change.xid,
            change.commit_lsn,
            op,
            rendered // 1_000_000,
            rendered // 1000,
            rendered,
        )

    def _row(self, row: Row | None) -> bytes:
        if row is None:
            return b"null"
        if UNCHANGED_TOAST in row.values():
            row = {name: UNAVAILABLE if value is UNCHANGED_TOAST else value for name, value in row.items()}
        return self._rows.encode_row(row)
