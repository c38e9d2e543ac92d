"""The embedded servers let in only the user who started them: another local user, who can reach
127.0.0.1 and the socket directory's name but not the private directory, gets nothing. NATS has
no unix socket to hide: its loopback port asks every client for the server's random login."""

from __future__ import annotations

import asyncio
import os
import stat

import nats
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from embedded import NatsServer, PostgresServer
from tests.harness import Nats, Postgres


@pytest.fixture
def server(pg: Postgres) -> PostgresServer:
    if not isinstance(pg, PostgresServer):
        pytest.skip("needs the embedded PostgreSQL: WALFLOW_TEST_PG_DSN points the tests at an external server")
    return pg


def _login(server: PostgresServer, host: str, **params: str) -> str:
    """A DSN as another local user would write it: no passfile of ours, no PGPASSWORD."""
    return make_conninfo(host=host, port=server.port, user=server.superuser, dbname="postgres",
                         passfile="/nonexistent", connect_timeout=5, **params)


def test_postgres_asks_every_connection_for_the_superusers_random_password(
    server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert server.base is not None
    for host in (server.host, str(server.base)):  # TCP, and the unix socket
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(_login(server, host))
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(_login(server, host, password="postgres"))
        with psycopg.connect(_login(server, host, password=server.password)) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    with psycopg.connect(server.dsn()) as conn:
        methods = conn.execute("SELECT DISTINCT type, auth_method FROM pg_hba_file_rules ORDER BY 1").fetchall()
    assert methods == [("host", "scram-sha-256"), ("local", "scram-sha-256")]


def test_postgres_password_lives_only_in_a_private_passfile(server: PostgresServer) -> None:
    assert server.base is not None
    assert server.password not in server.dsn()  # a printed DSN shows where it is, not what it is
    assert stat.S_IMODE(server.base.stat().st_mode) == 0o700
    passfile = server.passfile.stat()
    assert (stat.S_IMODE(passfile.st_mode), passfile.st_uid) == (0o600, os.geteuid())
    assert not (server.base / "initdb.pw").exists()
    assert len(server.password) >= 32 and server.password != PostgresServer().password


@pytest.fixture
def nats_server_ours(nats_srv: Nats) -> NatsServer:
    if not isinstance(nats_srv, NatsServer):
        pytest.skip("needs the embedded NATS: WALFLOW_TEST_NATS_URL points the tests at an external server")
    return nats_srv


async def _jetstream_streams(url: str) -> int:
    """How many streams JetStream reports to a client of ``url``: a refused login raises."""

    async def quiet(_: Exception) -> None:
        """The refusal is raised from connect; nats-py would also log it with a traceback."""

    nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False, error_cb=quiet)
    try:
        return int((await nc.jetstream().account_info()).streams)
    finally:
        await nc.close()


def test_nats_lets_in_only_a_client_with_the_servers_random_login(nats_server_ours: NatsServer) -> None:
    server = nats_server_ours
    stranger = server.address.replace("nats://", "nats://walflow:walflow@")
    for url in (server.address, stranger):  # no login, a guessed one
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            asyncio.run(_jetstream_streams(url))
    assert asyncio.run(_jetstream_streams(server.url)) >= 0
    assert server.login == {"username": "walflow", "password": server.password}
    assert server.password is not None and server.password not in server.address  # printed, it shows no secret
    assert len(server.password) >= 32 and server.password != NatsServer().password
    assert server.base is not None and stat.S_IMODE(server.base.stat().st_mode) == 0o700  # its config holds it


@pytest.mark.parametrize("block", ['authorization { token: "theirs" }', "accounts { A: { users: [{user: a}] } }"])
def test_a_nats_whose_config_says_who_may_connect_gets_no_login_of_ours(block: str) -> None:
    server = NatsServer(extra_config=f"max_payload: 1MB\n{block}")
    assert (server.password, server.login, server.url) == (None, {}, server.address)
