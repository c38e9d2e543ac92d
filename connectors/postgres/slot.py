"""Before streaming: check the server, and create the publication and slot when asked to.

The role need not be a superuser (docs/least-privilege.sql): one that may not create the
publication, or not write logical messages (heartbeats, backfill signals), is told in one
line what to run, its names quoted (:mod:`connectors.postgres.hints`).

Every condition that would make replication fail later, or silently deliver nothing,
is turned into one clear error here that says what to run. Runs on a normal connection
(the replication connection cannot run parameterised queries).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql

from config.schema import DatabaseConfig
from connectors.postgres import hints
from connectors.postgres.connection import conninfo, tls_failure
from connectors.postgres.protocol import str_to_lsn
from core.errors import ReplicationSetupError
from core.once import warn_once

log = logging.getLogger("walflow.postgres")


@dataclass(frozen=True, slots=True)
class SlotState:
    """Where the server says the slot stands."""

    confirmed_flush_lsn: int
    wal_status: str | None
    active_pid: int | None


def prepare(conn: psycopg.Connection[Any], db: DatabaseConfig) -> SlotState:
    """Check ``wal_level`` and the role, ensure the publication and slot; return the slot's state."""
    _check_wal_level(conn)
    _check_role(conn, db)
    _ensure_publication(conn, db)
    state = _ensure_slot(conn, db)
    _warn_about_identity(conn, db.publication.name)
    denied = messages_denied(conn)
    if denied:
        warn_once(log, ("messages refused", db.name), "%s", messages_refusal(db, denied))
    return state


def _check_wal_level(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SHOW wal_level").fetchone()
    level = row[0] if row else "unknown"
    if level != "logical":
        raise ReplicationSetupError(
            f"wal_level is '{level}' on this server; logical replication needs 'logical'. "
            "Run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL."
        )


def _check_role(conn: psycopg.Connection[Any], db: DatabaseConfig) -> None:
    row = conn.execute(
        "SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if not row or not row[0]:
        raise ReplicationSetupError(
            f"role '{db.username}' may not stream changes: it needs the REPLICATION attribute. "
            f"Run {hints.grant_replication(db.username)} as a superuser."
        )


def _ensure_publication(conn: psycopg.Connection[Any], db: DatabaseConfig) -> None:
    pub = db.publication
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [pub.name]).fetchone():
        return
    if not pub.create_if_not_exists:
        raise ReplicationSetupError(
            f"publication '{pub.name}' does not exist in database '{db.database}'. Create it "
            f"({hints.create_publication(pub.name)}) or set publication.create_if_not_exists: true "
            f"for database '{db.name}'."
        )
    statement = (
        sql.SQL(pub.init_sql)  # the operator's own SQL, from the config file
        if pub.init_sql
        else sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES WITH (publish_via_partition_root = true)").format(
            sql.Identifier(pub.name)
        )
    )
    try:
        conn.execute(statement)
    except psycopg.errors.DuplicateObject:
        return  # created meanwhile by someone else: fine
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ReplicationSetupError(
            f"could not create publication '{pub.name}' as role '{db.username}': {exc.diag.message_primary}. "
            f"Create it once as the tables' owner: {hints.create_publication(pub.name, [])} (docs/least-privilege.sql), "
            f"or as a superuser: {hints.create_publication(pub.name)}"
        ) from None
    log.info("created publication %s", pub.name)


_SLOT_QUERY = """
SELECT plugin, database, confirmed_flush_lsn::text, wal_status, active_pid
FROM pg_replication_slots WHERE slot_name = %s
"""


def _ensure_slot(conn: psycopg.Connection[Any], db: DatabaseConfig) -> SlotState:
    slot = db.slot
    row = conn.execute(_SLOT_QUERY, [slot.name]).fetchone()
    if row is None:
        if not slot.create_if_not_exists:
            raise ReplicationSetupError(
                f"replication slot '{slot.name}' does not exist. Create it "
                f"({hints.create_slot(slot.name)}) "
                f"or set slot.create_if_not_exists: true for database '{db.name}'."
            )
        try:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot.name])
            log.info("created replication slot %s", slot.name)
        except psycopg.errors.DuplicateObject:
            pass  # created meanwhile
        row = conn.execute(_SLOT_QUERY, [slot.name]).fetchone()
        assert row is not None
    plugin, database, confirmed, wal_status, active_pid = row
    if plugin != "pgoutput" or database != db.database:
        raise ReplicationSetupError(
            f"replication slot '{slot.name}' belongs to plugin '{plugin}' in database '{database}'; walflow needs "
            f"a pgoutput slot in '{db.database}'. Choose another slot name, or drop that slot if it is unused."
        )
    if wal_status == "lost":
        raise ReplicationSetupError(
            f"replication slot '{slot.name}' was invalidated by PostgreSQL (wal_status = lost): the WAL it needed "
            "was removed, so changes since its last confirmed position are gone from it. To recover: "
            f"{hints.drop_slot(slot.name)} then start walflow again to recreate the slot, "
            "and backfill the tables from their current contents."
        )
    if wal_status == "unreserved":
        log.warning("replication slot %s is about to lose WAL it needs (wal_status = unreserved)", slot.name)
    return SlotState(str_to_lsn(confirmed) if confirmed else 0, wal_status, active_pid)


_NO_IDENTITY_QUERY = """
SELECT p.schemaname, p.tablename, c.relreplident
FROM pg_publication_tables p
JOIN pg_namespace n ON n.nspname = p.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
WHERE p.pubname = %s
  AND (c.relreplident = 'n'
       OR (c.relreplident = 'd' AND NOT EXISTS (
             SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))
"""


def _warn_about_identity(conn: psycopg.Connection[Any], publication: str) -> None:
    for schema, table, _ in conn.execute(_NO_IDENTITY_QUERY, [publication]).fetchall():
        log.warning(
            "table %s.%s has no primary key or replica identity: PostgreSQL rejects its updates and deletes "
            "while it is published. Add a primary key, or %s",
            schema,
            table,
            hints.replica_identity_full(f"{schema}.{table}"),
        )


#: The variants of ``pg_logical_emit_message`` walflow calls (text content; PostgreSQL 17 adds
#: a ``flush`` argument), as the server names them, and whether the current role may call each.
EMIT_QUERY: Final = """
SELECT p.oid::regprocedure::text, has_function_privilege(p.oid, 'EXECUTE'), has_function_privilege('public', p.oid, 'EXECUTE')
FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' AND p.proargtypes[2] = 'text'::regtype ORDER BY 1
"""


def messages_denied(conn: psycopg.Connection[Any]) -> list[str]:
    """The variants of ``pg_logical_emit_message`` walflow calls that the role may not
    (docs/least-privilege.sql revokes them from PUBLIC and grants them to walflow's role)."""
    return [name for name, allowed, _ in conn.execute(EMIT_QUERY).fetchall() if not allowed]


def messages_refusal(db: DatabaseConfig, denied: list[str]) -> str:
    """What a role that may not write logical messages misses (heartbeats, backfill signals and
    watermarks are walflow's own role's), and what to grant."""
    return (f"role '{db.username}' may not write logical messages (pg_logical_emit_message): walflow writes no "
            f"heartbeats and cannot backfill. Run {hints.grant_execute(denied, db.username)} as a superuser.")


def confirmed_lsn(db: DatabaseConfig) -> int:
    """The slot's confirmed LSN (0 if there is no slot yet), waiting for the database as
    Sequin's ``await_database`` says: where a restarted pipeline replays from. A TLS setup
    that failed is not waited for: it is the pipeline's first connection, and its fatal line."""
    wait = db.await_database
    deadline = time.monotonic() + wait.timeout_ms / 1000
    while True:
        try:
            with psycopg.connect(conninfo(db, application_name=f"walflow:{db.slot.name}:check"), autocommit=True) as conn:
                row = conn.execute(_SLOT_QUERY, [db.slot.name]).fetchone()
            return str_to_lsn(row[2]) if row and row[2] else 0
        except psycopg.OperationalError as exc:
            fatal = tls_failure(db, exc)  # a certificate does not verify by waiting
            if fatal is not None:
                raise fatal from None
            if time.monotonic() >= deadline:
                raise ReplicationSetupError(
                    f"cannot reach database '{db.name}' at {db.hostname}:{db.port}: {exc}".strip()
                ) from None
            log.warning("waiting for database %s: %s", db.name, str(exc).strip())
            time.sleep(wait.interval_ms / 1000)
