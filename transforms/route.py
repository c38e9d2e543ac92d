"""Subjects: ``<prefix>.<database>.<schema>.<table>.<action>``, one NATS token per name.

Every name is escaped into a token by :func:`core.tokens.subject_token`'s documented,
reversible rule: only what a token cannot hold is escaped (``.``, ``*``, ``>``, whitespace,
``%``), so subjects match Sequin's for every name NATS accepts; a consumer recovers any
name by percent-decoding the token, and distinct names never share a subject. The subject prefix is not escaped: the config
already restricts it to dot-separated tokens of the safe characters.

The sink addresses each message by this function (``connectors/nats/publisher.py``).
Subjects are cached per (prefix, database, schema, table, action): this runs per change,
and a database has far fewer tables than changes.
"""

from __future__ import annotations

from functools import lru_cache

from core.tokens import subject_token


@lru_cache(maxsize=65_536)
def subject(prefix: str, database: str, schema: str, table: str, action: str) -> str:
    """The subject of one change: ``<prefix>.<database>.<schema>.<table>.<action>``, names escaped."""
    return ".".join((prefix, subject_token(database), subject_token(schema), subject_token(table), subject_token(action)))
