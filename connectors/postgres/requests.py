"""Asking for backfills: request signals written into the slot, checked first.

``walflow backfill`` and a sink's ``initial_backfill`` both end here. A request is written
only after the slot exists (a message written before the slot was created would never
reach it) and after its table is known to be streamed, so a mistake is reported to the
person who made it, not logged later by a pipeline somewhere.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from config.schema import DatabaseConfig
from connectors.postgres import signals
from connectors.postgres.connection import conninfo
from connectors.postgres.signals import BackfillRequest
from connectors.postgres.slot import messages_denied, messages_refusal, prepare
from core.errors import FatalError

_PUBLISHED_QUERY = "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1"
#: Tables of the publication without a primary key or replica identity index: a backfill cannot match their rows.
_KEYLESS_QUERY = """
SELECT p.schemaname || '.' || p.tablename
FROM pg_publication_tables p
JOIN pg_namespace n ON n.nspname = p.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
WHERE p.pubname = %s AND NOT EXISTS (
    SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident))
"""
_COLUMN_QUERY = """
SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


class BackfillRequestError(FatalError):
    """A backfill that cannot be asked for as given; the message says why."""


def _connect(db: DatabaseConfig) -> psycopg.Connection[Any]:
    return psycopg.connect(conninfo(db, application_name=f"walflow:{db.slot.name}:backfill-request"), autocommit=True)


def _published(conn: psycopg.Connection[Any], db: DatabaseConfig) -> list[str]:
    return [name for (name,) in conn.execute(_PUBLISHED_QUERY, [db.publication.name]).fetchall()]


def _keyless(conn: psycopg.Connection[Any], db: DatabaseConfig) -> set[str]:
    return {name for (name,) in conn.execute(_KEYLESS_QUERY, [db.publication.name]).fetchall()}


def keyless_refusal(table: str) -> str:
    return (f"table {table} has no primary key (nor a replica identity index): walflow cannot tell which change "
            "belongs to which row it read, so it does not backfill it. Add a primary key")


def publication_tables(db: DatabaseConfig) -> tuple[list[str], set[str]]:
    """The tables ``db``'s publication streams, as ``schema.table``, and which of them have
    no key to backfill by (the publication is made if it should be)."""
    with _connect(db) as conn:
        prepare(conn, db)
        return _published(conn, db), _keyless(conn, db)


def request_backfills(db: DatabaseConfig, requests: list[BackfillRequest], key: bytes | None = None) -> None:
    """Check each request against the database, make sure the slot exists, and write them
    (signed with ``key``, ``walflow.backfill.secret``, when it is set)."""
    with _connect(db) as conn:
        denied = messages_denied(conn)
        if denied:
            raise BackfillRequestError(messages_refusal(db, denied))
        prepare(conn, db)
        published, keyless = set(_published(conn, db)), _keyless(conn, db)
        for request in requests:
            if request.table not in published:
                raise BackfillRequestError(
                    f"table {request.table} is not in publication {db.publication.name} of database '{db.name}': "
                    "walflow does not stream it, so it cannot backfill it"
                )
            if request.table in keyless:
                raise BackfillRequestError(keyless_refusal(request.table))
            if request.sort_column is not None:
                _check_start(conn, request)
        for request in requests:
            signals.emit(conn, signals.Signal("request", db.slot.name, request), key)


def _check_start(conn: psycopg.Connection[Any], request: BackfillRequest) -> None:
    """The sort column exists and its type reads the start position (else every chunk would fail)."""
    schema, _, name = request.table.partition(".")
    found = conn.execute(_COLUMN_QUERY, [schema, name, request.sort_column]).fetchone()
    if found is None:
        raise BackfillRequestError(f"table {request.table} has no column {request.sort_column}")
    try:
        conn.execute(sql.SQL("SELECT %s::{}").format(sql.SQL(found[0])), [request.start_position])
    except psycopg.errors.DataError as exc:
        raise BackfillRequestError(
            f"start position '{request.start_position}' is not a {found[0]} for column {request.sort_column} "
            f"of {request.table}: {exc.diag.message_primary}"
        ) from None
