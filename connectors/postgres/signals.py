"""Backfill signals: the logical messages through which backfills travel in the slot itself.

Every backfill signal is ``pg_logical_emit_message(true, 'walflow.backfill', <json>)`` in a
transaction of its own, so it is durable (in the WAL, kept by the slot until walflow
confirms past it) and ordered with the changes (the source decodes it where it was
committed). Three kinds:

- ``request``: ``walflow backfill`` (or a sink's ``initial_backfill``) asks for a table.
- ``low``: a chunk's low watermark, written just before the chunk's ``SELECT``. It carries
  the whole backfill: its request, the key after which the chunk starts, the rows read so
  far. A ``low`` without a chunk number is a checkpoint of a backfill waiting its turn.
- ``high``: the chunk's high watermark, written right after the ``SELECT``: where its rows
  enter the stream. ``last`` says it was the table's last chunk; ``error`` that the
  backfill ended without finishing (the table was dropped, …).

**Where a backfill's progress lives.** In the slot: the source never confirms a position
past the newest ``low`` (or ``request``) of a backfill that is still running
(:mod:`connectors.postgres.backfill`), so after a crash the replay from the slot's
confirmed LSN always passes the signal that says where to continue; with ``-r`` the
source's snapshot holds the same. No table in the user's database, no other store, and
the progress is confirmed by the very rule that confirms the changes.

Each signal names the slot it is meant for: several walflow deployments may read one
database through slots of their own.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import psycopg

from connectors.postgres.protocol import str_to_lsn

PREFIX: Final = "walflow.backfill"
_VERSION: Final = 1

Kind = Literal["request", "low", "high"]
#: A keyset position: the texts of the pagination columns of the last row read, in order.
Cursor = list[str | None]


@dataclass(frozen=True, slots=True)
class BackfillRequest:
    """What to backfill: one table for one sink, whole or from a sort column's position on."""

    id: str
    sink: str
    table: str
    sort_column: str | None = None
    start_position: str | None = None

    @classmethod
    def new(cls, sink: str, table: str, sort_column: str | None = None, start_position: str | None = None) -> BackfillRequest:
        """A request with a fresh id."""
        return cls(uuid.uuid4().hex[:16], sink, table, sort_column, start_position)


@dataclass(frozen=True, slots=True)
class Signal:
    """One backfill signal, as written and as decoded."""

    kind: Kind
    slot: str
    request: BackfillRequest
    #: The run that wrote it (``low``/``high``): only that run holds the chunk's rows.
    run: str | None = None
    #: The chunk's number within its run; None for a request or a checkpoint.
    chunk: int | None = None
    #: ``low``: the chunk starts after this position (None: at the start of the table).
    after: Cursor | None = None
    #: Rows read before this chunk (for progress), and the table's estimated row count.
    rows: int = 0
    estimate: int = 0
    #: ``high``: this was the table's last chunk; or why the backfill ended unfinished.
    last: bool = False
    error: str | None = None

    def encode(self) -> str:
        data = asdict(self)
        return json.dumps({"v": _VERSION, **data}, separators=(",", ":"))


def decode(content: bytes, slot: str) -> Signal | None:
    """The signal in ``content`` if it is a well-formed one for ``slot``; None otherwise
    (another deployment's, or not walflow's: never a reason to stop the stream)."""
    try:
        data = json.loads(content)
        if not isinstance(data, dict) or data.get("v") != _VERSION or data.get("slot") != slot:
            return None
        request = BackfillRequest(**data.pop("request"))
        data.pop("v")
        signal = Signal(request=request, **data)
    except (ValueError, TypeError, KeyError):
        return None
    if signal.kind not in ("request", "low", "high"):
        return None
    return signal


def emit(conn: psycopg.Connection[Any], signal: Signal) -> int:
    """Write ``signal`` in a transaction of its own (``conn`` in autocommit); its LSN."""
    row = conn.execute("SELECT pg_logical_emit_message(true, %s, %s)::text", [PREFIX, signal.encode()]).fetchone()
    assert row is not None
    return str_to_lsn(row[0])
