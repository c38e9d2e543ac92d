"""The idempotency-id scheme: one encoder and one decoder, shared by the envelope and the replay scan.

walflow's form (``msg_id: walflow``, the default): standard base64 of
``"<database>/<sink>/<lsn>:<idx>"``, database and sink names escaped as subject tokens
(:mod:`core.tokens`, so they hold no ``/`` and the text is unambiguous). It names one
change of one sink of one database, from names in the config and the change's position
only, so a replay produces the same id: JetStream drops the copy by ``Nats-Msg-Id``, and
after a restart the sink finds what is already stored by decoding the ids it reads back.
Sinks and databases can share a stream.

Sequin's form (``msg_id: sequin``): standard base64 of ``"<lsn>:<idx>"``, exactly Sequin's
``idempotency_key``, so that Sequin and walflow publishing the same changes into one
stream during a cutover have JetStream drop the overlap. It names a position only: two
sinks, or two databases, publishing it into one stream would have JetStream drop each
other's messages as duplicates (the sink refuses to start so: ``connectors/nats/sink.py``),
and the replay scan can tell this sink's messages only by their subjects.

A backfill's ``read`` is named by the backfill and the row instead of a position, in both
forms: ``"<database>/<sink>/read/<backfill id>/<row key>"``. A chunk that is read again
after a crash may hold other rows at other positions, but every row it shares with the
first read gets the same id, so the stream keeps one copy (:class:`core.events.ReadOf`).
Such ids name no position: :meth:`IdScheme.decode` returns None for them.

A schema event (``transforms/schema_events.py``) is named by the position of the first change
of its table's new shape, in both forms: ``"<database>/<sink>/schema/<lsn>:<idx>"`` (a position
names one change, so one table). Every sink partition that publishes a copy gives it this id;
:meth:`IdScheme.decode` returns None for it too, so the replay scan never takes it for the
change at that position.

A transaction's markers (``transforms/transactions.py``) are named by its commit LSN, in both
forms: ``"<database>/<sink>/begin/<lsn>"`` and ``".../end/<lsn>"``. :meth:`IdScheme.marker_lsn`
reads the LSN back, so the replay scan finds a stored marker of a transaction published again.
"""

from __future__ import annotations

from binascii import Error as Base64Error
from binascii import a2b_base64, b2a_base64
from collections.abc import Sequence
from typing import Literal

from pydantic_core import PydanticSerializationError, to_json

from core.events import Position, RawValue
from core.tokens import escape_token

#: Which form a sink's change ids take (``destination.msg_id``).
IdForm = Literal["walflow", "sequin"]


def row_key(texts: Sequence[RawValue | object]) -> str:
    """A row's key columns' texts as one string: a JSON array (texts that are not UTF-8, from
    a ``SQL_ASCII`` database, in URL-safe base64). Equal texts give equal keys in every process.
    Total: a marker among them (an oversized value in a sink's ``group_column_names``; key
    columns never lose theirs, ``core/sizes.py``) is its ``repr``, which names its size and CRC."""
    if len(texts) == 1:
        only = texts[0]
        if type(only) is bytes and only.isdigit():  # an integer key, the usual: its JSON is its text quoted
            return '["' + only.decode("ascii") + '"]'
    try:
        return to_json(texts).decode()
    except PydanticSerializationError:
        return to_json(texts, bytes_mode="base64", fallback=repr).decode()


class IdScheme:
    """The ids of one sink of one database, in the form its ``destination.msg_id`` names."""

    __slots__ = ("_marker_prefix", "_prefix_bytes", "_read_prefix", "_schema_prefix", "msg_id", "prefix")

    def __init__(self, database: str, sink: str, msg_id: IdForm = "walflow") -> None:
        self.msg_id: IdForm = msg_id
        names = f"{escape_token(database)}/{escape_token(sink)}/"
        #: What every change id of this sink starts with, before base64 (nothing in Sequin's form).
        self.prefix = names if msg_id == "walflow" else ""
        self._prefix_bytes = self.prefix.encode()
        self._read_prefix = names.encode() + b"read/"  # reads name the sink in both forms
        self._schema_prefix = names.encode() + b"schema/"  # and so do schema events
        self._marker_prefix = names.encode()  # and transactions' markers, then begin/ or end/

    def encode(self, lsn: int, idx: int) -> bytes:
        """The id of the change at ``(lsn, idx)``, as ASCII bytes (it goes into the payload as is)."""
        return b2a_base64(b"%s%d:%d" % (self._prefix_bytes, lsn, idx), newline=False)

    def encode_read(self, backfill: str, row_key: str) -> bytes:
        """The id of the row ``row_key`` read by backfill ``backfill``."""
        return b2a_base64(b"%s%s/%s" % (self._read_prefix, backfill.encode(), row_key.encode()), newline=False)

    def encode_schema(self, lsn: int, idx: int) -> bytes:
        """The id of the schema event before the first change of a new shape, at ``(lsn, idx)``."""
        return b2a_base64(b"%s%d:%d" % (self._schema_prefix, lsn, idx), newline=False)

    def encode_marker(self, kind: Literal["begin", "end"], lsn: int) -> str:
        """The id of the BEGIN or END marker of the transaction committed at ``lsn``."""
        return b2a_base64(b"%s%s/%d" % (self._marker_prefix, kind.encode(), lsn), newline=False).decode()

    def marker_lsn(self, msg_id: str) -> int | None:
        """The commit LSN a marker's id names; None for any other id."""
        text = self._text(msg_id)
        if not text.startswith(self._marker_prefix):
            return None
        kind, sep, lsn = text[len(self._marker_prefix) :].partition(b"/")
        if not sep or kind not in (b"begin", b"end") or not lsn.isdigit() or len(lsn) > 20:
            return None
        return int(lsn)

    def is_read(self, msg_id: str) -> bool:
        """Whether ``msg_id`` is one of this sink's reads."""
        return self._text(msg_id).startswith(self._read_prefix)

    @staticmethod
    def _text(msg_id: str) -> bytes:
        try:
            return a2b_base64(msg_id.encode("ascii"), strict_mode=True)
        except (Base64Error, UnicodeEncodeError, ValueError):
            return b""

    def decode(self, msg_id: str) -> Position | None:
        """The position an id of this sink names; None for anyone else's id (or none at all).

        In Sequin's form every ``base64("<lsn>:<idx>")`` is taken for this sink's: only the
        subject it was read from can tell (the replay scan reads this sink's subjects only)."""
        text = self._text(msg_id)
        prefix = self._prefix_bytes
        if not text.startswith(prefix):
            return None
        lsn, sep, idx = text[len(prefix) :].partition(b":")
        if not sep or not lsn.isdigit() or not idx.isdigit() or len(lsn) > 20 or len(idx) > 20:
            return None  # a stored message is anyone's: more digits than a 64-bit position has is not ours
        return Position(int(lsn), int(idx))
