"""Names as NATS subject tokens: one documented, reversible escape.

A NATS subject token may not be empty nor contain ``.``, ``*``, ``>`` or whitespace, but
Postgres names (quoted identifiers) and walflow's database and sink names may hold any of
them. Subjects and message ids therefore escape every name by one rule:

- ``A``-``Z``, ``a``-``z``, ``0``-``9``, ``_`` and ``-`` stand for themselves;
- every other character becomes ``%XX`` for each byte of its UTF-8 encoding, in
  upper-case hex (``.`` → ``%2E``, ``é`` → ``%C3%A9``, space → ``%20``), so ``%`` itself
  becomes ``%25`` and a ``%`` in a token always starts an escape;
- the empty name becomes a lone ``%``, which no non-empty name can produce (every other
  ``%`` is followed by two hex digits).

Ordinary names (``public``, ``order_items``) are unchanged; a consumer recovers any name
by percent-decoding the token. The rule is injective: distinct names never share a token.
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
