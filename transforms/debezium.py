"""The Debezium envelope (``envelope: debezium``): one change as the value of a Debezium
PostgreSQL connector's change event, JSON converter with schemas disabled, so that Debezium
consumers (Flink's ``debezium-json``, Debezium's own sinks, hand-written ones) read it::

    {"before": {...} | null, "after": {...} | null,
     "source": {"version", "connector": "postgresql", "name", "ts_ms", "snapshot", "db",
                "sequence", "ts_us", "ts_ns", "schema", "table", "txId", "lsn", "xmin"},
     "op": "c" | "u" | "d" | "r", "ts_ms", "ts_us", "ts_ns", "transaction": null}

Keys come in the order Debezium's JSON converter writes them (Debezium 2.6-3.4). ``before``
and ``after`` arrive shaped from render (columns renamed, masked, the TOAST policy applied)
and are only encoded here: an unchanged TOAST value is Debezium's placeholder
``"__debezium_unavailable_value"``, an oversized one walflow's marker (``core/sizes.py``).

**Values follow walflow's Sequin encoding** (:meth:`transforms.envelope.Envelope.encode_row`,
``timestamp_format`` included), not Debezium's logical types (``README.md``, *Values, type by
type*). ``source.lsn`` is the commit's LSN (pgoutput gives no per-change LSN), ``sequence``
and ``xmin`` are null; a backfill's read has ``snapshot: "true"``, ``lsn`` its chunk's
watermark and ``txId`` null. ``ts_ms``/``ts_us``/``ts_ns`` say when walflow rendered it.

Unlike Debezium: a key-changing update is one ``u``, a delete has no tombstone, truncates are
not published. Each field's choice and Debezium's own value beside it: ``docs/design.md``,
*transforms/debezium.py*.
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
