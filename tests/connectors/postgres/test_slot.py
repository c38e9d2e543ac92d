"""Preflight: what walflow creates, and the one clear error for each thing it cannot fix."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from config.schema import DatabaseConfig
from connectors.postgres.connection import conninfo
from connectors.postgres.requests import BackfillRequestError, request_backfills
from connectors.postgres.signals import BackfillRequest
from connectors.postgres.slot import SlotState, prepare
from core.errors import ReplicationSetupError
from embedded import PostgresServer
from tests.harness import ROLE_PASSWORD, Database, TestNames


def _prepare(db: DatabaseConfig) -> SlotState:
    with psycopg.connect(conninfo(db, application_name="walflow-test"), autocommit=True) as conn:
        return prepare(conn, db)


def _one(db: Database, query: str, *params: Any) -> Any:
    with db.connect() as conn:
        row = conn.execute(query, list(params)).fetchone()
    return row[0] if row else None


def test_creates_publication_and_slot_when_asked(database: Database, names: TestNames) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    state = _prepare(database.config(create=True))
    assert _one(database, "SELECT puballtables FROM pg_publication WHERE pubname = %s", names.publication) is True
    assert _one(database, "SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", names.slot) == "pgoutput"
    assert state.confirmed_flush_lsn > 0 and state.wal_status == "reserved"
    assert _prepare(database.config(create=True)) == state  # idempotent


def test_missing_publication_is_a_clear_error(database: Database, names: TestNames) -> None:
    with pytest.raises(ReplicationSetupError) as info:
        _prepare(database.config(create=False))
    assert str(info.value) == (
        f"publication '{names.publication}' does not exist in database '{names.database}'. Create it "
        f"(CREATE PUBLICATION \"{names.publication}\" FOR ALL TABLES WITH (publish_via_partition_root = true);) or set "
        "publication.create_if_not_exists: true for database 'app'."
    )


def test_missing_slot_is_a_clear_error(database: Database, names: TestNames) -> None:
    with database.connect() as conn:
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR ALL TABLES")
    with pytest.raises(ReplicationSetupError, match=f"replication slot '{names.slot}' does not exist. Create it"):
        _prepare(database.config(create=False))


def test_role_without_replication_is_a_clear_error(database: Database, names: TestNames) -> None:
    role = f"r_{names.slot}"
    with database.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{ROLE_PASSWORD}'")
    try:
        with pytest.raises(ReplicationSetupError) as info:
            _prepare(database.config(username=role, password=ROLE_PASSWORD))
        assert str(info.value) == (
            f"role '{role}' may not stream changes: it needs the REPLICATION attribute. "
            f'Run ALTER ROLE "{role}" WITH REPLICATION; as a superuser.'
        )
    finally:
        with database.connect() as conn:
            conn.execute(f"DROP ROLE {role}")


def test_a_replication_role_that_is_not_superuser_is_enough(database: Database, names: TestNames) -> None:
    role = f"r_{names.slot}"
    with database.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{ROLE_PASSWORD}'")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR ALL TABLES")
    try:
        state = _prepare(database.config(username=role, password=ROLE_PASSWORD, slot={"name": names.slot, "create_if_not_exists": True}))
        assert state.confirmed_flush_lsn > 0
    finally:
        with database.connect() as conn:
            conn.execute(f"SELECT pg_drop_replication_slot('{names.slot}')")
            conn.execute(f"DROP ROLE {role}")


def test_tables_without_identity_are_warned_about(
    database: Database, names: TestNames, caplog: pytest.LogCaptureFixture
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE keyed (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE loose (x int)")
    with caplog.at_level(logging.WARNING, logger="walflow.postgres"):
        _prepare(database.config(create=True))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("table public.loose has no primary key or replica identity")
    assert warnings[0].endswith('Add a primary key, or ALTER TABLE "public"."loose" REPLICA IDENTITY FULL;')


@pytest.fixture(scope="module")
def replica_level_server() -> Iterator[PostgresServer]:
    with PostgresServer(settings={"wal_level": "replica"}) as server:
        yield server


@pytest.mark.servers
def test_wrong_wal_level_is_a_clear_error(replica_level_server: PostgresServer, names: TestNames) -> None:
    db = DatabaseConfig.model_validate(
        {
            "name": "app",
            "hostname": replica_level_server.host,
            "port": replica_level_server.port,
            "database": "postgres",
            "password": replica_level_server.password,
            "slot": {"name": names.slot, "create_if_not_exists": True},
            "publication": {"name": names.publication, "create_if_not_exists": True},
        }
    )
    with pytest.raises(ReplicationSetupError) as info:
        _prepare(db)
    assert str(info.value) == (
        "wal_level is 'replica' on this server; logical replication needs 'logical'. "
        "Run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL."
    )


@pytest.fixture
def odd_role(database: Database, names: TestNames) -> Iterator[str]:
    """A LOGIN REPLICATION role (not a superuser) whose name holds a quote and a space, with
    ``pg_logical_emit_message`` revoked from PUBLIC in the test's database (docs/least-privilege.sql)."""
    role = f'wf "odd" {names.slot}'
    with database.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(sql.Identifier(role),
                                                                                   sql.Literal(ROLE_PASSWORD)))
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC")
    try:
        yield role
    finally:
        database.drop()
        with psycopg.connect(database.server.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_publication_the_role_may_not_create_is_one_line_with_the_statements_quoted(
    database: Database, names: TestNames, odd_role: str
) -> None:
    publication = 'wf "pub" two'
    config = database.config(username=odd_role, password=ROLE_PASSWORD,
                             publication={"name": publication, "create_if_not_exists": True})
    with pytest.raises(ReplicationSetupError) as info:
        _prepare(config)
    owner = ('CREATE PUBLICATION "wf ""pub"" two" FOR TABLE <schema.table>, ... WITH (publish_via_partition_root = '
             "true);")
    assert str(info.value) == (
        f"could not create publication '{publication}' as role '{odd_role}': permission denied for database "
        f"{names.database}. Create it once as the tables' owner: {owner} (docs/least-privilege.sql), or as a "
        'superuser: CREATE PUBLICATION "wf ""pub"" two" FOR ALL TABLES WITH (publish_via_partition_root = true);')
    with database.connect() as conn:  # the owner's statement, its placeholder filled in, as it is
        conn.execute(owner.replace("<schema.table>, ...", "t").encode())
    assert _prepare(config).confirmed_flush_lsn > 0  # then the role streams: it created its slot


def test_a_role_that_may_not_write_logical_messages_is_told_what_to_grant(
    database: Database, names: TestNames, odd_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    with database.connect() as conn:
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE t")
    config = database.config(username=odd_role, password=ROLE_PASSWORD)
    grant = f'GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean,text,text) TO "wf ""odd"" {names.slot}";'
    refusal = (f"role '{odd_role}' may not write logical messages (pg_logical_emit_message): walflow writes no "
               f"heartbeats and cannot backfill. Run {grant} as a superuser.")
    with caplog.at_level(logging.WARNING, logger="walflow.postgres"):
        _prepare(config)
        _prepare(config)  # a session that starts again says nothing new
    assert [r.getMessage() for r in caplog.records] == [refusal]
    with pytest.raises(BackfillRequestError) as info:
        request_backfills(config, [BackfillRequest.new("s", "public.t")])
    assert str(info.value) == refusal
    with database.connect() as conn:
        conn.execute(grant)
    request_backfills(config, [BackfillRequest.new("s", "public.t")])  # granted: written
