"""Subjects: ``<prefix>.<database>.<schema>.<table>.<action>``, one NATS token per name.

A NATS subject token may not be empty nor contain ``.``, ``*``, ``>`` or whitespace, but
Postgres names (quoted identifiers) and walflow's database names may hold any of them.
Every name is therefore escaped into a token by one documented, reversible rule:

- ``A``-``Z``, ``a``-``z``, ``0``-``9``, ``_`` and ``-`` stand for themselves;
- every other character becomes ``%XX`` for each byte of its UTF-8 encoding, in
  upper-case hex (``.`` → ``%2E``, ``é`` → ``%C3%A9``, space → ``%20``), so ``%`` itself
  becomes ``%25`` and a ``%`` in a token always starts an escape;
- the empty name becomes a lone ``%``, which no non-empty name can produce (every other
  ``%`` is followed by two hex digits).

Ordinary names (``public``, ``order_items``) are unchanged, so subjects match Sequin's for
them; a consumer recovers any name by percent-decoding the token. The rule is injective:
distinct names never share a subject. The subject prefix is not escaped: the config
already restricts it to dot-separated tokens of the safe characters.

Subjects are cached per (prefix, database, schema, table, action): this runs per change,
and a database has far fewer tables than changes.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ALL_SAFE: Final = re.compile(r"[A-Za-z0-9_-]+")
#: The token of the empty name: never produced by a non-empty name (see the module docstring).
EMPTY_TOKEN: Final = "%"


def escape_token(name: str) -> str:
    """``name`` as one NATS subject token, by the rule in this module's docstring."""
    if _ALL_SAFE.fullmatch(name):
        return name
    if not name:
        return EMPTY_TOKEN
    # surrogatepass: total over every Python str, so the rule stays injective even there.
    return "".join(
        char if char in _SAFE else "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
        for char in name
    )


@lru_cache(maxsize=65_536)
def subject(prefix: str, database: str, schema: str, table: str, action: str) -> str:
    """The subject of one change: ``<prefix>.<database>.<schema>.<table>.<action>``, names escaped."""
    return ".".join((prefix, escape_token(database), escape_token(schema), escape_token(table), escape_token(action)))
