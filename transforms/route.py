"""Subjects: ``<prefix>.<database>.<schema>.<table>.<action>``, one NATS token per name.

Every name is escaped into a token by :func:`core.tokens.escape_token`'s documented,
reversible rule: ordinary names (``public``, ``order_items``) are unchanged, so subjects
match Sequin's for them; a consumer recovers any name by percent-decoding the token, and
distinct names never share a subject. The subject prefix is not escaped: the config
already restricts it to dot-separated tokens of the safe characters.

The sink addresses each message by this function (``connectors/nats/publisher.py``).
Subjects are cached per (prefix, database, schema, table, action): this runs per change,
and a database has far fewer tables than changes.
"""

from __future__ import annotations

from functools import lru_cache

from core.tokens import escape_token


@lru_cache(maxsize=65_536)
def subject(prefix: str, database: str, schema: str, table: str, action: str) -> str:
    """The subject of one change: ``<prefix>.<database>.<schema>.<table>.<action>``, names escaped."""
    return ".".join((prefix, escape_token(database), escape_token(schema), escape_token(table), escape_token(action)))
