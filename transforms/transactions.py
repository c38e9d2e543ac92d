"""Transaction markers (``transaction_markers: true``): a BEGIN and an END event around each
transaction a sink publishes anything of, with Debezium's transaction-metadata fields.

A sink with markers publishes in commit order from one partition, so one render sees all of
its messages in order. Dispatch sends ``(BEGIN, lsn, xid, µs)`` before a transaction's first
change the sink publishes and ``(COMMIT, …)`` after its last (``core/wire.py``); render notes
where in its output each fell (:meth:`Markers.note`) and, once its shaping has decided which
changes are published, :meth:`Markers.place` puts the markers in:

- BEGIN right before the transaction's first message that is published — none at all for a
  transaction every change of which render's filters drop — on
  ``<prefix>.<database>._transaction.begin``: ``{"status": "BEGIN", "id": "<xid>:<commit
  LSN>", "ts_ms", "event_count": null, "data_collections": null}``;
- END at the COMMIT, on ``….end``, with ``event_count`` and ``data_collections``
  (``[{"data_collection": "<schema>.<table>", "event_count": n}]``, in the order tables first
  appeared). A dead letter published for a change counts as its table's event: it is what
  the stream holds of that change.

With ``transactions: none`` each marker is a :data:`~core.events.BARRIER` (stored after
everything before it, before anything after it: ``connectors/nats/sink.py``); with
``atomic`` it is in its transaction's batch, which is ordered whole. The Debezium envelope's
``"transaction": null`` becomes ``{"id", "total_order", "data_collection_order"}`` (1-based,
as Debezium's ``provide.transaction.metadata``), rewritten in place in the payload here,
after shaping: only then is each message's order in the stream known. Ids are
:meth:`core.ids.IdScheme.encode_marker`'s, the same on every replay (a transaction is
re-emitted from its start after a crash, so its counts come out the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic_core import to_json

from config.schema import DatabaseConfig, SinkConfig
from core.errors import FatalError
from core.events import BARRIER, TRANSACTION_END
from core.ids import IdScheme
from core.message import Message
from core.subjects import covers, transaction_subject
from core.wire import BEGIN, commit_time

#: A Debezium payload's last field, as ``transforms/debezium.py`` writes it.
_NO_TRANSACTION: Final = b'"transaction":null}'
#: What the transaction block may add to a Debezium payload (render leaves the room).
BLOCK_ROOM: Final = 160


#: Where a BEGIN or COMMIT item fell in render's output (the index of the message after it), and the item.
Note = tuple[int, tuple[str, int, int, int]]


@dataclass(slots=True)
class _Open:
    """The transaction being published: what its markers say, and what it published so far."""

    lsn: int
    xid: int
    ts_ms: int
    begun: bool = False
    total: int = 0
    tables: dict[str, int] = field(default_factory=dict)  # per table, in the order they appeared


class Markers:
    """One sink partition's markers (see the module docstring)."""

    def __init__(self, sink: SinkConfig, database: DatabaseConfig) -> None:
        prefix = sink.destination.subject_prefix
        self._subjects = {kind: transaction_subject(prefix, database.name, kind).encode() for kind in ("begin", "end")}
        self._ids = IdScheme(database.name, sink.name, sink.destination.msg_id)
        self._row = 0 if sink.transactions == "atomic" else BARRIER
        self._debezium = sink.envelope == "debezium"
        self._open: _Open | None = None

    def place(self, out: list[Message | None], notes: list[Note]) -> list[Message]:
        """``out`` (None: filtered out) with the markers put in and the Debezium blocks filled;
        ``notes``: where in ``out`` each BEGIN and COMMIT item of this call fell, in order."""
        if not notes and self._open is None:
            return [message for message in out if message is not None]
        placed: list[Message] = []
        marks = iter(notes)
        mark = next(marks, None)
        for i, message in enumerate(out):
            while mark is not None and mark[0] == i:
                self._mark(mark[1], placed)
                mark = next(marks, None)
            if message is not None:
                self._counted(message, placed)
        while mark is not None:  # a COMMIT at the very end
            self._mark(mark[1], placed)
            mark = next(marks, None)
        return placed

    def _mark(self, item: tuple[str, int, int, int], placed: list[Message]) -> None:
        kind, lsn, xid, micros = item
        if kind == BEGIN:
            self._open = _Open(lsn, xid, int(commit_time(micros).timestamp() * 1000))
            return
        txn, self._open = self._open, None
        if txn is not None and txn.begun and txn.lsn == lsn:
            collections = [{"data_collection": table, "event_count": n} for table, n in txn.tables.items()]
            placed.append(self._marker(txn, "end", txn.total, collections))

    def _counted(self, message: Message, placed: list[Message]) -> None:
        """Add ``message``, counted in the open transaction (after its BEGIN if it is its first)."""
        txn = self._open
        if txn is None or message is TRANSACTION_END or message.row == BARRIER or self._ids.is_read(message.msg_id):
            placed.append(message)  # a read, a schema event, the end of a unit: outside the transaction's count
            return
        if not txn.begun:
            txn.begun = True
            placed.append(self._marker(txn, "begin", None, None))
        table = message.labels[0]
        txn.total += 1
        order = txn.tables[table] = txn.tables.get(table, 0) + 1
        if self._debezium and message.payload.endswith(_NO_TRANSACTION):
            block = to_json({"id": f"{txn.xid}:{txn.lsn}", "total_order": txn.total, "data_collection_order": order})
            payload = message.payload[: -len(_NO_TRANSACTION)] + b'"transaction":' + block + b"}"
            filled = Message(message.subject, payload, message.msg_id, message.labels, message.commit_ts,
                             message.headers)
            filled.row = message.row
            message = filled
        placed.append(message)

    def _marker(self, txn: _Open, kind: Literal["begin", "end"], count: int | None,
                collections: list[dict[str, object]] | None) -> Message:
        payload = to_json({"status": kind.upper(), "id": f"{txn.xid}:{txn.lsn}", "ts_ms": txn.ts_ms,
                           "event_count": count, "data_collections": collections})
        message = Message(self._subjects[kind], payload, self._ids.encode_marker(kind, txn.lsn),
                          ("_transaction", kind), txn.ts_ms / 1000)
        message.row = self._row
        return message


def check_captured(sink: SinkConfig, database: str, stream: str, captured: tuple[str, ...]) -> None:
    """Refuse, at startup, a stream that would not store a sink's markers (one capturing the
    change subjects only, ``<prefix>.<database>.*.*.*``): its publishes would find no stream."""
    if not sink.transaction_markers:
        return
    wanted = transaction_subject(sink.destination.subject_prefix, database, "*")
    if not any(covers(pattern, wanted) for pattern in captured):
        raise FatalError(
            f"sink '{sink.name}' has transaction_markers, but stream {stream} does not capture {wanted} (it captures "
            f"{', '.join(captured)}): add that subject to the stream, or set transaction_markers: false")
