"""The idempotency-id scheme: one encoder and one decoder, shared by the envelope and the replay scan.

An id is standard base64 of ``"<database>/<sink>/<lsn>:<idx>"``, database and sink names
escaped as subject tokens (:mod:`core.tokens`, so they hold no ``/`` and the text is
unambiguous). It names one change of one sink of one database, from names in the config
and the change's position only, so a replay produces the same id: JetStream drops the copy
by ``Nats-Msg-Id``, and after a restart the sink finds what is already stored by decoding
the ids it reads back.

Sequin's key (``Base64("<lsn>:<idx>")``) is unique only within one sink of one database:
two sinks or two databases publishing into one stream would have JetStream drop each
other's messages as duplicates.
"""

from __future__ import annotations

from binascii import Error as Base64Error
from binascii import a2b_base64, b2a_base64

from core.events import Position
from core.tokens import escape_token


class IdScheme:
    """The ids of one sink of one database."""

    __slots__ = ("_prefix_bytes", "prefix")

    def __init__(self, database: str, sink: str) -> None:
        #: What every id of this sink starts with, before base64.
        self.prefix = f"{escape_token(database)}/{escape_token(sink)}/"
        self._prefix_bytes = self.prefix.encode()

    def encode(self, lsn: int, idx: int) -> bytes:
        """The id of the change at ``(lsn, idx)``, as ASCII bytes (it goes into the payload as is)."""
        return b2a_base64(b"%s%d:%d" % (self._prefix_bytes, lsn, idx), newline=False)

    def decode(self, msg_id: str) -> Position | None:
        """The position an id of this sink names; None for anyone else's id (or none at all)."""
        try:
            text = a2b_base64(msg_id.encode("ascii"), strict_mode=True)
        except (Base64Error, UnicodeEncodeError, ValueError):
            return None
        prefix = self._prefix_bytes
        if not text.startswith(prefix):
            return None
        lsn, sep, idx = text[len(prefix) :].partition(b":")
        if not sep or not lsn.isdigit() or not idx.isdigit():
            return None
        return Position(int(lsn), int(idx))
