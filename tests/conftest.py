"""Fixtures: one real PostgreSQL and one real NATS per session, and per-test names on them.

``WALFLOW_TEST_PG_DSN`` / ``WALFLOW_TEST_NATS_URL`` point the suite at external servers
instead; tests that stop or restart a server are then skipped. Under pytest-xdist each
worker has servers of its own, so a test that stops one disturbs only its own worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

from embedded import NatsServer, PostgresServer, ServerError
from embedded._process import EmbeddedServer
from tests.harness import Database, ExternalNats, ExternalPostgres, Nats, Postgres, TestNames, delete_stream

T = TypeVar("T")

#: tests/tiers.py keeps the markers true (``servers`` from these fixtures, a subprocess checked against
#: both); pytester runs the check itself on tests of its own (tests/test_tiers.py).
pytest_plugins = ["tests.tiers", "pytester"]

# Hypothesis's clocks (a 200 ms deadline per example, the too-slow check on generating them) time the
# machine, not the code: on 2 cores shared by parallel workers they fail tests that are right.
settings.register_profile("walflow", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("walflow")


def _session_server(variable: str, external: Callable[[str], T], embedded: Callable[[], EmbeddedServer]) -> Iterator[T]:
    """The external server named by ``variable``, else an embedded one for the whole session."""
    if os.environ.get(variable):
        yield external(os.environ[variable])
        return
    try:
        server = embedded().start()
    except ServerError as exc:  # missing binaries: one clear message, not a traceback
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server  # type: ignore[misc]
    finally:
        server.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Postgres]:
    yield from _session_server("WALFLOW_TEST_PG_DSN", ExternalPostgres, PostgresServer)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[Nats]:
    yield from _session_server("WALFLOW_TEST_NATS_URL", ExternalNats, NatsServer)


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


@pytest.fixture(autouse=True)
def _warnings_given_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: ``core.once.warn_once`` has warned of nothing."""
    monkeypatch.setattr("core.once._warned", set())
