"""Fixtures: one real PostgreSQL and one real NATS per session, and per-test names on them.

``WALFLOW_TEST_PG_DSN`` / ``WALFLOW_TEST_NATS_URL`` point the suite at external servers
instead; tests that stop or restart a server are then skipped.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from embedded import NatsServer, PostgresServer, ServerError
from tests.harness import Database, ExternalNats, ExternalPostgres, Nats, Postgres, TestNames, delete_stream


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Postgres]:
    if os.environ.get("WALFLOW_TEST_PG_DSN"):
        yield ExternalPostgres(os.environ["WALFLOW_TEST_PG_DSN"])
        return
    try:
        server = PostgresServer().start()
    except ServerError as exc:  # missing binaries: one clear message, not a traceback
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def nats_server() -> Iterator[Nats]:
    if os.environ.get("WALFLOW_TEST_NATS_URL"):
        yield ExternalNats(os.environ["WALFLOW_TEST_NATS_URL"])
        return
    try:
        server = NatsServer().start()
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg(pg_server: Postgres) -> Postgres:
    """The session's PostgreSQL, started again if an earlier test stopped it."""
    if not pg_server.running:
        pg_server.start()
    return pg_server


@pytest.fixture
def nats_srv(nats_server: Nats) -> Nats:
    """The session's NATS, started again if an earlier test stopped it."""
    if not nats_server.running:
        nats_server.start()
    return nats_server


@pytest.fixture
def names(request: pytest.FixtureRequest) -> TestNames:
    return TestNames.for_test(request.node.name)


@pytest.fixture
def database(pg: Postgres, names: TestNames) -> Iterator[Database]:
    """A fresh database for this test; dropped afterwards with its slots."""
    db = Database(pg, names)
    db.create()
    try:
        yield db
    finally:
        if not pg.running:
            pg.start()
        db.drop()


@pytest.fixture
def stream_cleanup(nats_srv: Nats, names: TestNames) -> Iterator[str]:
    """The test's stream name; the stream is deleted afterwards if the test created it."""
    yield names.stream
    if not nats_srv.running:
        nats_srv.start()
    delete_stream(nats_srv.url, names.stream)
