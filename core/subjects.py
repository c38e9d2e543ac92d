"""The subject grammar: every subject walflow publishes on, scans or has a stream capture.

A change is published on ``<prefix>.<database>.<schema>.<table>.<action>`` (:func:`subject`),
each name one token by :func:`core.tokens.subject_token`'s reversible escape; the prefix
(``destination.subject_prefix``) is written as it is, the config having held it to
dot-separated safe tokens. A database's subjects are those under :func:`database_root`:
``<prefix>.<database>.>`` (:func:`database_subjects`) is what a stream walflow creates
captures and what an unrouted sink's replay scan reads; :func:`action_patterns`, one per
published action, are what a stream must capture to take every change of the database. A table's
schema events (a sink's ``schema_events``) are on ``<prefix>.<database>.<schema>.<table>.schema``
(:func:`schema_subject`, all of them :func:`schema_pattern`).

Whether a subject may be published on at all is NATS's rule (:func:`subject_problem`), and
whether a stream's pattern takes it, JetStream's (:func:`covers`, :func:`tokens_cover`).
Everything that builds or checks a subject asks this module: routing (``transforms/route.py``),
stream setup (``connectors/nats/stream.py``), the envelope's default subject, ``walflow check``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from core.tokens import subject_token

#: The actions that appear as a subject's last token (truncates are not published).
PUBLISHED_ACTIONS: Final = ("insert", "update", "delete", "read")
#: The last token of a schema event's subject.
SCHEMA_TOKEN: Final = "schema"
#: The longest subject walflow publishes on, in bytes of UTF-8: the server reads it in a control
#: line it caps at 4 KiB by default and closes the connection over.
MAX_SUBJECT_BYTES: Final = 1024


@lru_cache(maxsize=65_536)
def subject(prefix: str, database: str, schema: str, table: str, action: str) -> str:
    """The subject of one change: ``<prefix>.<database>.<schema>.<table>.<action>``, names escaped."""
    return ".".join((prefix, subject_token(database), subject_token(schema), subject_token(table), subject_token(action)))


def schema_subject(prefix: str, database: str, schema: str, table: str) -> str:
    """The subject of a table's schema events: ``<prefix>.<database>.<schema>.<table>.schema``."""
    return subject(prefix, database, schema, table, SCHEMA_TOKEN)


def transaction_subject(prefix: str, database: str, kind: str) -> str:
    """``<prefix>.<database>._transaction.<kind>`` (``begin``, ``end``): four tokens, never a
    change's subject (five)."""
    return ".".join((prefix, subject_token(database), "_transaction", kind))


def schema_pattern(prefix: str, database: str) -> str:
    """The pattern of every schema event's subject of ``database``."""
    return f"{database_root(prefix, database)}*.*.{SCHEMA_TOKEN}"


def database_root(prefix: str, database: str) -> str:
    """What every subject of ``database`` starts with: ``<prefix>.<database>.``."""
    return f"{prefix}.{subject_token(database)}."


def database_subjects(prefix: str, database: str) -> str:
    """The pattern of every subject of ``database``: ``<prefix>.<database>.>``."""
    return f"{database_root(prefix, database)}>"


def action_patterns(prefix: str, database: str) -> list[str]:
    """Every change subject of ``database``, as one pattern per published action."""
    root = database_root(prefix, database)
    return [f"{root}*.*.{action}" for action in PUBLISHED_ACTIONS]


def covers(pattern: str, subject: str) -> bool:
    """True if every subject matching ``subject`` (which may hold ``*`` and end in ``>``) also matches ``pattern``."""
    return tokens_cover(pattern.split("."), subject.split("."))


def tokens_cover(want: list[str], have: list[str]) -> bool:
    """:func:`covers` of a pattern and a subject already split into tokens (a router checks
    every routed subject against its stream's patterns, split once)."""
    for i, token in enumerate(want):
        if token == ">":
            return i < len(have)
        if i >= len(have) or have[i] == ">":
            return False
        if token != "*" and token != have[i]:
            return False
    return len(want) == len(have)


def uncaptured(patterns: list[str], prefix: str, database: str) -> list[str]:
    """The :func:`action_patterns` of ``database`` that none of a stream's ``patterns`` captures
    (empty: the stream takes every change of it)."""
    return [s for s in action_patterns(prefix, database) if not any(covers(p, s) for p in patterns)]


def too_long(subject: str) -> str | None:
    """Why ``subject`` is too long for NATS, if it is (encoded only when it could be: a character is 4 bytes at most)."""
    if len(subject) * 4 > MAX_SUBJECT_BYTES and len(subject.encode()) > MAX_SUBJECT_BYTES:
        return f"it is longer than {MAX_SUBJECT_BYTES} bytes"
    return None


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` cannot be published on by NATS's rules: at most :data:`MAX_SUBJECT_BYTES`,
    no whitespace or control character, no empty token, no ``*`` or ``>`` token, no ``$`` at
    its start (NATS's own ``$JS``, ``$SYS``, ``$KV``…); None if it can."""
    if not subject:
        return "it is empty"
    if " " in subject or not subject.isprintable():  # every other whitespace is not printable
        return "it holds whitespace or a control character"
    if (long := too_long(subject)) is not None:
        return long
    tokens = subject.split(".")
    if "" in tokens:
        return "it has an empty token (a '.' at its start or end, or two in a row)"
    if "*" in tokens or ">" in tokens:
        return "it has a wildcard token ('*' or '>'), which cannot be published on"
    if subject.startswith("$"):
        return "subjects starting with '$' are NATS's own ($JS, $SYS, $KV, ...)"
    return None
