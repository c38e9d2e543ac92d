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

**Positions are sealed where a sink hides columns.** A ``low``'s ``after`` is the last row's
key (and sort column): values a sink may mask. Whoever reads the WAL (a slot, an archive, a
replica) would read them in the watermark, whatever the sink publishes. So for a table that
a sink masks or leaves columns out of (:class:`CursorSeal`), the position is written
encrypted and authenticated (libsodium's secretbox, XSalsa20-Poly1305), never as text: with
a key derived from ``walflow.backfill.secret`` when it is set (a later run opens it and
resumes where the backfill stood), else with a key of the run's own (a later run cannot:
it starts that table's backfill again from its start, and says so). This run matches its
watermarks by run and chunk number as before, and opens its own positions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, NamedTuple

import nacl.exceptions
import nacl.utils
import psycopg
from nacl.secret import SecretBox
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from config.schema import BackfillSettings, SinkConfig
from connectors.postgres.messages import BACKFILL, Reason
from connectors.postgres.protocol import str_to_lsn

PREFIX: Final = BACKFILL
_VERSION: Final = 1
#: The most a name, a position or an error text in a signal may hold (characters), and the
#: most columns a cursor may have (an index has at most 32).
_TEXT: Final = 8192
_CURSOR_COLUMNS: Final = 32
#: The most a sealed position may hold: a signal is at most 64 KiB (connectors/postgres/messages.py).
_SEALED: Final = 64 * 1024
#: What a sealing key is derived from ``walflow.backfill.secret`` under (its signing key stays its own).
_SEAL_CONTEXT: Final = b"walflow.backfill cursor seal v1"

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
    #: Decoded only: its position was sealed with a key this run does not hold (an earlier
    #: run's own), so where it stood is unknown and ``after`` is None.
    unknown_position: bool = False

    def encode(self, key: bytes | None = None, seal: CursorSeal | None = None) -> str:
        """The signal's JSON, its position sealed if ``seal`` covers its table; signed with
        ``key`` (walflow.backfill.secret) when given."""
        data: dict[str, Any] = {"v": _VERSION, **asdict(self)}
        del data["unknown_position"]
        if seal is not None and self.after is not None and seal.covers(self.request.table):
            data["after"], data["sealed"] = None, seal.close(self.after)
        text = json.dumps(data, separators=(",", ":"))
        return text if key is None else f"{text}\n{_mac(key, text.encode())}"


class CursorSeal:
    """Which tables' positions are sealed in watermarks, and the key they are sealed with.

    A table is covered when a sink of the slot masks one of its columns or publishes only some
    of them (``columns.mask``, ``exclude``, ``include``): its key may be among them. The key
    is derived from ``walflow.backfill.secret`` if set (every run of the config holds it), else
    drawn at random for this run alone.
    """

    def __init__(self, tables: Iterable[str], secret: bytes | None) -> None:
        self.tables = frozenset(tables)
        #: Whether later runs hold the key too (it comes from walflow.backfill.secret).
        self.shared = secret is not None
        key = nacl.utils.random(SecretBox.KEY_SIZE) if secret is None else hmac.new(
            secret, _SEAL_CONTEXT, hashlib.sha256).digest()
        self._box = SecretBox(key)

    @classmethod
    def of(cls, sinks: Iterable[SinkConfig], settings: BackfillSettings) -> CursorSeal:
        """The seal of a slot read by ``sinks``."""
        hidden = {table.name for sink in sinks for table in sink.tables
                  if (c := table.columns) is not None and (c.mask or c.exclude or c.include is not None)}
        return cls(hidden, signing_key(settings))

    def covers(self, table: str) -> bool:
        return table in self.tables

    def close(self, cursor: Cursor) -> str:
        """``cursor`` encrypted and authenticated (a fresh nonce each time), as base64 text."""
        return base64.b64encode(self._box.encrypt(json.dumps(cursor).encode())).decode()

    def open(self, sealed: str) -> Cursor | None:
        """The cursor :meth:`close` sealed with this key; None if it was another key's (or is not one)."""
        try:
            cursor = json.loads(self._box.decrypt(base64.b64decode(sealed, validate=True)))
        except (binascii.Error, nacl.exceptions.CryptoError, ValueError):
            return None
        if isinstance(cursor, list) and all(v is None or isinstance(v, str) for v in cursor):
            return cursor
        return None


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
    sealed: str | None = Field(default=None, max_length=_SEALED)
    rows: int = Field(default=0, ge=0)
    estimate: int = Field(default=0, ge=0)
    last: bool = False
    error: str | None = Field(default=None, max_length=_TEXT)


def signing_key(settings: BackfillSettings) -> bytes | None:
    """The key signals are signed and checked with: ``walflow.backfill.secret``, if set."""
    return None if settings.secret is None else settings.secret.get_secret_value().encode()


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def decode(content: bytes, slot: str, key: bytes | None = None, seal: CursorSeal | None = None) -> Signal | NotASignal | None:
    """The signal in ``content`` if it is a well-formed one for ``slot`` (and, with ``key``,
    signed with it), its sealed position opened with ``seal`` if it can; None for another
    slot's (another deployment's); otherwise why it is not one. Total: it never raises,
    whatever ``content`` holds."""
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
    fields = data.model_dump(exclude={"v", "request", "sealed"})
    if data.sealed is not None:
        fields["after"] = None if seal is None else seal.open(data.sealed)
        fields["unknown_position"] = fields["after"] is None
    return Signal(request=BackfillRequest(**data.request.model_dump()), **fields)


def emit(conn: psycopg.Connection[Any], signal: Signal, key: bytes | None = None, seal: CursorSeal | None = None) -> int:
    """Write ``signal`` (signed with ``key``, its position sealed by ``seal``) in a transaction of
    its own (``conn`` in autocommit); its LSN."""
    text = signal.encode(key, seal)
    row = conn.execute("SELECT pg_logical_emit_message(true, %s, %s)::text", [PREFIX, text]).fetchone()
    assert row is not None
    return str_to_lsn(row[0])
