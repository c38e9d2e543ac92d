"""The SQL that walflow's errors and ``walflow check`` / ``status`` tell an operator to run.

Every name in it is quoted by psycopg (:class:`psycopg.sql.Identifier`, :class:`~psycopg.sql.Literal`),
never by hand: a table, role or publication name may hold a ``"``, a ``'`` or a space, and a
statement pasted from a hint must do what it says, on that object and no other. The
statements are rendered without a connection (psycopg's own quoting rules), so an error can
say them when the connection is gone.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql

#: The published tables the operator fills in where walflow cannot know them.
_YOUR_TABLES = sql.SQL("<schema.table>, ...")


def table(qualified: str) -> sql.Identifier:
    """``schema.table`` (as ``pg_publication_tables`` lists it) as a quoted, qualified name."""
    schema, _, name = qualified.partition(".")
    return sql.Identifier(schema, name)


def render(statement: sql.Composable) -> str:
    return statement.as_string()


def grant_replication(role: str) -> str:
    return render(sql.SQL("ALTER ROLE {} WITH REPLICATION;").format(sql.Identifier(role)))


def grant_select(tables: Iterable[str], role: str) -> str:
    return render(sql.SQL("GRANT SELECT ON {} TO {};").format(
        sql.SQL(", ").join(table(t) for t in tables), sql.Identifier(role)))


def grant_execute(functions: Iterable[str], role: str) -> str:
    """``GRANT EXECUTE`` on each of ``functions``: signatures as the server renders a
    ``regprocedure`` (``pg_logical_emit_message(boolean,text,text)``), its own quoting."""
    return " ".join(render(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {};").format(sql.SQL(f), sql.Identifier(role)))
                    for f in functions)


def create_publication(name: str, tables: Iterable[str] | None = None) -> str:
    """``CREATE PUBLICATION`` as walflow would make it: ``FOR ALL TABLES`` (a superuser's), or
    ``FOR TABLE`` the given ones (their owner's), a placeholder for them if the list is empty."""
    target: sql.Composable
    if tables is None:
        target = sql.SQL("ALL TABLES")
    else:
        listed = [table(t) for t in tables]
        target = sql.SQL("TABLE {}").format(sql.SQL(", ").join(listed) if listed else _YOUR_TABLES)
    return render(sql.SQL("CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true);").format(
        sql.Identifier(name), target))


def add_to_publication(name: str) -> str:
    return render(sql.SQL("ALTER PUBLICATION {} ADD TABLE {};").format(sql.Identifier(name), _YOUR_TABLES))


def replica_identity_full(qualified: str) -> str:
    return render(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL;").format(table(qualified)))


def create_slot(name: str) -> str:
    return render(sql.SQL("SELECT pg_create_logical_replication_slot({}, 'pgoutput');").format(sql.Literal(name)))


def drop_slot(name: str) -> str:
    return render(sql.SQL("SELECT pg_drop_replication_slot({});").format(sql.Literal(name)))
