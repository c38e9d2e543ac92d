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

A backfill's progress lives in the slot alone (docs/design.md, ``connectors/postgres/signals.py``).

Each signal names the slot it is meant for: several walflow deployments may read one
database through slots of their own.

**Signals are input.** Any role may write one (:mod:`connectors.postgres.messages`), so
:func:`decode` checks it against a strict schema (known fields, their types, sizes) and,
when ``walflow.backfill.secret`` is set, its signature: an HMAC-SHA256 over the JSON with
that key, written after it on a line of its own, so that only who holds the key (walflow,
``walflow backfill`` with the same config) can start, resume or end a backfill. What a
request may ask for is checked again where it is acted on (:class:`connectors.postgres.backfill.Backfills`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, NamedTuple

import psycopg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from config.schema import BackfillSettings
from connectors.postgres.messages import BACKFILL, Reason
from connectors.postgres.protocol import str_to_lsn

PREFIX: Final = BACKFILL
_VERSION: Final = 1
#: The most a name, a position or an error text in a signal may hold (characters), and the
#: most columns a cursor may have (an index has at most 32).
_TEXT: Final = 8192
_CURSOR_COLUMNS: Final = 32

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

    def encode(self, key: bytes | None = None) -> str:
        """The signal's JSON; signed with ``key`` (walflow.backfill.secret) when given."""
        text = json.dumps({"v": _VERSION, **asdict(self)}, separators=(",", ":"))
        return text if key is None else f"{text}\n{_mac(key, text.encode())}"


class NotASignal(NamedTuple):
    """Content under walflow's backfill prefix that is ignored: why, in walflow's words."""

    reason: Reason
    detail: str


class _RequestSchema(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    sink: str = Field(min_length=1, max_length=_TEXT)
    table: str = Field(min_length=1, max_length=_TEXT)
    sort_column: str | None = Field(default=None, max_length=_TEXT)
    start_position: str | None = Field(default=None, max_length=_TEXT)


class _SignalSchema(BaseModel):
    """A signal exactly as :meth:`Signal.encode` writes it."""

    model_config = ConfigDict(strict=True, extra="forbid")

    v: Literal[1]
    kind: Kind
    slot: str = Field(max_length=_TEXT)
    request: _RequestSchema
    run: str | None = Field(default=None, max_length=64)
    chunk: int | None = Field(default=None, ge=0)
    after: list[str | None] | None = Field(default=None, max_length=_CURSOR_COLUMNS)
    rows: int = Field(default=0, ge=0)
    estimate: int = Field(default=0, ge=0)
    last: bool = False
    error: str | None = Field(default=None, max_length=_TEXT)


def signing_key(settings: BackfillSettings) -> bytes | None:
    """The key signals are signed and checked with: ``walflow.backfill.secret``, if set."""
    return None if settings.secret is None else settings.secret.get_secret_value().encode()


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def decode(content: bytes, slot: str, key: bytes | None = None) -> Signal | NotASignal | None:
    """The signal in ``content`` if it is a well-formed one for ``slot`` (and, with ``key``,
    signed with it); None for another slot's (another deployment's); otherwise why it is
    not one. Total: it never raises, whatever ``content`` holds."""
    body, newline, mac = content.rpartition(b"\n")
    if not newline:
        body, mac = content, b""
    try:
        data = _SignalSchema.model_validate_json(body)
    except ValidationError as exc:
        return NotASignal("malformed", f"not a backfill signal as walflow writes it ({exc.error_count()} error(s))")
    if data.slot != slot:
        return None
    if key is not None and not hmac.compare_digest(mac, _mac(key, body).encode()):
        return NotASignal("unauthenticated", "its signature is missing or is not walflow.backfill.secret's")
    fields = data.model_dump(exclude={"v", "request"})
    return Signal(request=BackfillRequest(**data.request.model_dump()), **fields)


def emit(conn: psycopg.Connection[Any], signal: Signal, key: bytes | None = None) -> int:
    """Write ``signal`` (signed with ``key``) in a transaction of its own (``conn`` in autocommit); its LSN."""
    row = conn.execute("SELECT pg_logical_emit_message(true, %s, %s)::text", [PREFIX, signal.encode(key)]).fetchone()
    assert row is not None
    return str_to_lsn(row[0])
