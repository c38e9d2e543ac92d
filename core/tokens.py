"""Names as NATS subject tokens: documented, reversible escapes.

A NATS subject token may not be empty nor contain ``.``, ``*``, ``>`` or whitespace, but
Postgres names (quoted identifiers) and walflow's database and sink names may hold any of
them. Two rules, both ``%XX`` per UTF-8 byte, both reversible by percent-decoding:

**Subjects** (:func:`subject_token`) escape only what a token cannot hold, so that every
name a NATS subject can carry is published as Sequin publishes it (``café``, ``$x``,
``Order/Items`` unchanged): ``.``, ``*``, ``>``, whitespace and control characters, and
``%`` itself; the empty name becomes a lone ``%``.

**Message ids** (:func:`escape_token`, the strict rule, where ``/`` must separate names):

- ``A``-``Z``, ``a``-``z``, ``0``-``9``, ``_`` and ``-`` stand for themselves;
- every other character becomes ``%XX`` for each byte of its UTF-8 encoding, in
  upper-case hex (``.`` → ``%2E``, ``é`` → ``%C3%A9``, space → ``%20``), so ``%`` itself
  becomes ``%25`` and a ``%`` in a token always starts an escape;
- the empty name becomes a lone ``%``, which no non-empty name can produce (every other
  ``%`` is followed by two hex digits).

Ordinary names (``public``, ``order_items``) are unchanged by both; a consumer recovers
any name by percent-decoding the token. Both rules are injective: distinct names never
share a token.
"""

from __future__ import annotations

import re
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


def _subject_unsafe(char: str) -> bool:
    return char in ".*>%" or char.isspace() or not char.isprintable()


def subject_token(name: str) -> str:
    """``name`` as one NATS subject token, escaping only what a token cannot hold (module docstring)."""
    if not name:
        return EMPTY_TOKEN
    if not any(_subject_unsafe(char) for char in name):
        return name
    return "".join(
        "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass")) if _subject_unsafe(char) else char
        for char in name
    )
