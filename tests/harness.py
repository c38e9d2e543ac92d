"""Test-side helpers around the embedded servers: per-test names, external servers, cleanup.

Each test gets its own database, slot, publication, stream and subject prefix, so tests
never see each other's data while sharing one PostgreSQL and one NATS per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import nats
import psycopg
import pytest
from nats.js.errors import NotFoundError
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from config.schema import DatabaseConfig
from connectors.postgres.protocol import str_to_lsn
from embedded import wait_for
from embedded.postgres import find_bindir

_counter = itertools.count(1)
#: The password of the roles tests create and log in as: the embedded server lets no role in without one.
ROLE_PASSWORD = "walflow-test-role"


@dataclass(frozen=True)
class TestNames:
    """Names that belong to one test only."""

    __test__ = False  # not a test class, despite its name

    database: str
    slot: str
    publication: str
    stream: str
    subject_prefix: str

    @classmethod
    def for_test(cls, test_name: str) -> TestNames:
        slug = re.sub(r"[^a-z0-9]+", "_", test_name.lower()).strip("_")[:30]
        tag = f"{next(_counter)}_{os.getpid()}"
        return cls(
            database=f"wf_{slug}_{tag}",
            slot=f"wf_slot_{tag}",
            publication=f"wf_pub_{tag}",
            stream=f"WF_{tag}",
            subject_prefix=f"wf{tag}",
        )


class Postgres(Protocol):
    """What tests use of a PostgreSQL server, embedded or external."""

    @property
    def running(self) -> bool: ...
    #: The password of the DSN's user, for walflow configs (which take no passfile); None: none is needed.
    @property
    def password(self) -> str | None: ...
    def dsn(self, dbname: str = "postgres", **params: str) -> str: ...
    def start(self) -> object: ...
    def stop(self, mode: str = "fast") -> None: ...
    def kill(self) -> None: ...
    def restart(self, mode: str = "fast") -> None: ...


class Nats(Protocol):
    """What tests use of a NATS server, embedded or external."""

    @property
    def running(self) -> bool: ...
    #: What clients connect with (the login in it), where it listens as walflow prints it, and
    #: a walflow NATS destination's keys that reach it (``host``, ``port``, the login).
    @property
    def url(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def destination(self) -> dict[str, Any]: ...
    def start(self) -> object: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def restart(self) -> None: ...


def _needs_embedded(what: str, variable: str) -> None:
    pytest.skip(f"needs the embedded {what}: {variable} points the tests at an external server")


class ExternalPostgres:
    """A server given by ``WALFLOW_TEST_PG_DSN``: usable, but not ours to stop."""

    running = True

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        password = conninfo_to_dict(dsn).get("password")
        self.password = None if password is None else str(password)

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        return make_conninfo(self._dsn, dbname=dbname, **params)

    def start(self) -> object:
        return self

    def stop(self, mode: str = "fast") -> None:
        _needs_embedded("PostgreSQL", "WALFLOW_TEST_PG_DSN")

    kill = restart = stop


class ExternalNats:
    """A server given by ``WALFLOW_TEST_NATS_URL``."""

    running = True

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.address = f"{parts.scheme}://{parts.hostname}:{parts.port}"
        login = {} if parts.username is None else {"username": unquote(parts.username),
                                                   "password": unquote(parts.password or "")}
        self.destination: dict[str, Any] = {"host": parts.hostname, "port": parts.port, **login}

    def start(self) -> object:
        return self

    def stop(self) -> None:
        _needs_embedded("NATS", "WALFLOW_TEST_NATS_URL")

    kill = restart = stop


@dataclass
class Database:
    """A test's own database on the shared server."""

    server: Postgres
    names: TestNames

    @property
    def dsn(self) -> str:
        return self.server.dsn(self.names.database)

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn, autocommit=True)

    def config(self, *, create: bool = True, **overrides: object) -> DatabaseConfig:
        """A walflow database entry for this test's database, slot and publication."""
        params = conninfo_to_dict(self.dsn)
        return DatabaseConfig.model_validate(
            {
                "name": "app",
                "hostname": params.get("host", "127.0.0.1"),
                "port": int(str(params.get("port", 5432))),
                "database": self.names.database,
                "username": params.get("user", "postgres"),
                "password": self.server.password,
                "slot": {"name": self.names.slot, "create_if_not_exists": create},
                "publication": {"name": self.names.publication, "create_if_not_exists": create},
                **overrides,
            }
        )

    def current_lsn(self) -> int:
        """The server's current WAL insert position: everything committed so far lies before it."""
        with self.connect() as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return str_to_lsn(str(row[0]))

    @classmethod
    @contextlib.contextmanager
    def created(cls, server: Postgres, names: TestNames) -> Iterator[Database]:
        """A new database for ``names`` on ``server``, dropped with its slots on leaving."""
        db = cls(server, names)
        db.create()
        try:
            yield db
        finally:
            db.drop()

    def create(self) -> None:
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.names.database)))

    def drop(self) -> None:
        """Drop the test's slots (ending any walsender that holds one) and its database."""
        if not self.server.running:
            return
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            wait_for(lambda: self._drop_slots(conn), timeout=30, what=f"the slots of {self.names.database} to drop")
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.names.database)))

    def _drop_slots(self, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
        rows = conn.execute(
            "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", [self.names.database]
        ).fetchall()
        for slot, active_pid in rows:
            if active_pid is not None:
                conn.execute("SELECT pg_terminate_backend(%s)", [active_pid])
                continue
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            except (psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
                continue
        return not conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE database = %s", [self.names.database]
        ).fetchone()


def slot_confirmed(db: Database) -> int:
    """The test slot's confirmed_flush_lsn (0 while it does not exist)."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [db.names.slot]
        ).fetchone()
    return str_to_lsn(str(row[0])) if row and row[0] else 0


def slot_active(db: Database) -> bool:
    """True while a walsender holds the test slot."""
    with db.connect() as conn:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [db.names.slot]).fetchone()
    return bool(row and row[0])


def walsender(db: Database) -> tuple[int, str] | None:
    """(pid, application_name) of the walsender holding the test slot, or None while nobody holds it.

    Tells walflow (``walflow:<slot>``) from a foreign holder and one holder from the next (the pid).
    """
    with db.connect() as conn:
        row = conn.execute(
            "SELECT s.active_pid, r.application_name FROM pg_replication_slots s "
            "JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
            [db.names.slot],
        ).fetchone()
    return (int(str(row[0])), str(row[1])) if row else None


@contextlib.contextmanager
def hung_pg_recvlogical(db: Database, wal_sender_timeout: str) -> Iterator[int]:
    """A ``pg_recvlogical`` holding the test's slot (which must exist), stopped with SIGSTOP:
    a hung client, as in the first seed. Yields its walsender's PID; killed on exit.
    ``wal_sender_timeout`` is its session's (``0``: the server never gives up on it)."""
    dsn = f"{db.dsn} options='-c wal_sender_timeout={wal_sender_timeout}'"
    holder = subprocess.Popen(
        [str(find_bindir() / "pg_recvlogical"), "-d", dsn, "--slot", db.names.slot, "--start", "-f", "/dev/null",
         "-o", "proto_version=1", "-o", f"publication_names={db.names.publication}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (w := walsender(db)) is not None and w[1] == "pg_recvlogical", timeout=30,
                 what="pg_recvlogical to hold the slot")
        holder.send_signal(signal.SIGSTOP)
        held = walsender(db)
        assert held is not None
        yield held[0]
    finally:
        holder.kill()
        holder.wait()


def delete_stream(url: str, stream: str) -> None:
    """Remove a test's stream if it exists."""

    async def run() -> None:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            try:
                await nc.jetstream().delete_stream(stream)
            except NotFoundError:
                pass
        finally:
            await nc.close()

    asyncio.run(run())


def children_of(pid: int) -> set[int]:
    """PIDs whose parent is ``pid`` (PostgreSQL's backends), read from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
