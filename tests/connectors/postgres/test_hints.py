"""The SQL walflow's hints say to run, run as it is against names that hold quotes and spaces:
each statement does what it says, on that object and no other."""

from __future__ import annotations

from psycopg import sql

from connectors.postgres import hints
from tests.harness import Database, TestNames

#: A schema and a table whose names a hand-quoted hint would break: a ``"``, a ``'``, spaces.
TABLE = 'odd "schema".it\'s a "table"'


def test_each_hint_runs_as_it_is_on_the_object_it_names(database: Database, names: TestNames) -> None:
    schema, table = TABLE.split(".")
    role, publication = f'a "role" {names.slot}', f'a "pub" {names.slot}'
    with database.connect() as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, table)))
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        try:
            for hint in (hints.grant_replication(role), hints.grant_select([TABLE], role),
                         hints.replica_identity_full(TABLE), hints.create_publication(publication, [TABLE]),
                         hints.create_slot(names.slot), hints.drop_slot(names.slot)):
                conn.execute(hint.encode())
            relid = sql.Identifier(schema, table).as_string()
            assert conn.execute("SELECT rolreplication FROM pg_roles WHERE rolname = %s", [role]).fetchone() == (True,)
            assert conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", [role, relid]).fetchone() == (True,)
            assert conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass",
                                [relid]).fetchone() == ("f",)
            assert conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                                [publication]).fetchall() == [(schema, table)]
            assert conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [names.slot]).fetchall() == []
        finally:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_placeholder_is_said_where_walflow_cannot_know_the_tables() -> None:
    assert hints.create_publication('p"1', []) == ('CREATE PUBLICATION "p""1" FOR TABLE <schema.table>, ... WITH '
                                                   "(publish_via_partition_root = true);")
    assert hints.add_to_publication('p"1') == 'ALTER PUBLICATION "p""1" ADD TABLE <schema.table>, ...;'
    assert hints.create_slot("it's") == "SELECT pg_create_logical_replication_slot('it''s', 'pgoutput');"
