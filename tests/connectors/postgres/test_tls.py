"""TLS to PostgreSQL with libpq's own keys, against servers whose certificates a test CA signed.

``sslmode: verify-full`` runs end to end: every connection walflow opens (the walsender's
above all) is TLS, and a certificate the server starts to serve mid-run that the CA did not
sign stops the pipeline instead of being retried. A wrong CA, a wrong host name and a
server without TLS each fail closed with one line, at the first connection (no waiting
for the database), in the pipeline and in ``walflow check``. Sequin's ``ssl: true`` still
works, and says once that it verifies nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from config.schema import DatabaseConfig
from connectors.postgres.connection import conninfo
from connectors.postgres.slot import confirmed_lsn
from core.errors import PostgresTlsError
from embedded import PostgresServer, wait_for
from tests.cli.helpers import edit, run_both
from tests.harness import Database, Nats, TestNames, slot_active
from tests.pipeline import assert_running, fatal_line, pipeline, run_to_exit, stored, write_config
from tests.tls import TlsFiles, issue


@dataclass(frozen=True)
class Pki:
    good: TlsFiles  # for "localhost" only: connecting by 127.0.0.1 is the wrong host name
    other: TlsFiles  # the same name, from a CA the clients do not trust


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    return Pki(issue(directory, "localhost", name="good"), issue(directory, "localhost", name="other"))


@pytest.fixture(scope="module")
def tls_pg(pki: Pki) -> Iterator[PostgresServer]:
    with PostgresServer(tls=(pki.good.cert, pki.good.key)) as server:
        yield server


@pytest.fixture(scope="module")
def plain_pg() -> Iterator[PostgresServer]:
    """A server without TLS at all (``ssl = off``)."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def tls_db(tls_pg: PostgresServer, names: TestNames) -> Iterator[Database]:
    with Database.created(tls_pg, names) as db:
        yield db


def _db(port: int, **keys: Any) -> DatabaseConfig:
    """The ``postgres`` database of the server at ``port`` as a config's entry, with ``keys`` over it."""
    return DatabaseConfig.model_validate({
        "name": "shop", "hostname": "localhost", "port": port, "database": "postgres",
        "slot": {"name": "wf_tls"}, "publication": {"name": "wf_tls"}, **keys,
    })


def _tls_config(path: Path, db: Database, nats_srv: Nats, names: TestNames, **keys: Any) -> Path:
    """A pipeline config for ``db`` on the TLS server, with the database's TLS ``keys``."""
    sink = {"name": "tls", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(path, db, nats_srv, names, [sink])
    return edit(config, lambda data: data["databases"][0].update(keys))


def _serve(server: PostgresServer, pair: TlsFiles) -> None:
    """``server`` serves ``pair`` from now on: returns once a connection verified by its CA succeeds."""
    server.replace_tls(pair.cert, pair.key)

    def verified() -> bool:
        try:
            with psycopg.connect(server.dsn(), host="localhost", sslmode="verify-full", sslrootcert=str(pair.ca),
                                 connect_timeout=5):
                return True
        except psycopg.OperationalError:
            return False

    wait_for(verified, timeout=30, what="the server to serve the new certificate")


# -- the keys as libpq gets them, and the warning of ssl: true (no server) --------------------------------


def test_every_tls_key_reaches_libpq(pki: Pki) -> None:
    db = _db(5432, sslmode="verify-full", sslrootcert=str(pki.good.ca), sslcert=str(pki.good.cert),
             sslkey=str(pki.good.key), sslpassword="canary-passphrase")

    params = conninfo_to_dict(conninfo(db, application_name="test", replication=True))

    assert {key: params.get(key) for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword")} == {
        "sslmode": "verify-full", "sslrootcert": str(pki.good.ca), "sslcert": str(pki.good.cert),
        "sslkey": str(pki.good.key), "sslpassword": "canary-passphrase",
    }


def test_ssl_true_still_encrypts_and_warns_once_per_process_naming_the_keys_to_add(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sequin = _db(5432, ssl=True)
    chosen = [_db(5432, sslmode="require"), _db(5432, ssl=False)]

    with caplog.at_level(logging.WARNING, logger="walflow.postgres"):
        infos = [conninfo(db, application_name="test") for db in (sequin, sequin, *chosen, sequin)]

    assert [conninfo_to_dict(info)["sslmode"] for info in infos] == ["require", "require", "require", "prefer",
                                                                    "require"]
    [record] = [r for r in caplog.records if r.name == "walflow.postgres"]
    assert record.getMessage() == (
        "database shop: ssl: true is sslmode=require, which encrypts but does not verify the server: whoever answers "
        "at localhost:5432 can read the stream. Add sslmode: verify-full and sslrootcert: <the CA's PEM file>"
    )
    assert (record.__dict__["database"], record.__dict__["sslmode"]) == ("shop", "require")


# -- failing closed: one line at the first connection -------------------------------------------------------


#: A TLS setup that cannot work: the server (``tls``: the one with TLS), the database's keys
#: (``{ca}``: the test CA's file, ``{other}``: another CA's) and the line it fails with.
FAILURES: dict[str, tuple[str, dict[str, str], str]] = {
    "wrong-ca": ("tls", {"sslmode": "verify-full", "sslrootcert": "{other}"},
                 "PostgreSQL at localhost:{port}: the server's certificate is not signed by a CA in sslrootcert "
                 "{other} (sslmode verify-full) (SSL error: certificate verify failed); give sslrootcert the CA that "
                 "signed the server's certificate"),
    "wrong-host": ("tls", {"hostname": "127.0.0.1", "sslmode": "verify-full", "sslrootcert": "{ca}"},
                   "PostgreSQL at 127.0.0.1:{port}: the server's certificate does not name 127.0.0.1 (sslmode "
                   "verify-full) (server certificate for \"localhost\" does not match host name \"127.0.0.1\"); set "
                   "hostname to a name the certificate holds"),
    "plaintext-require": ("plain", {"sslmode": "require"},
                          "PostgreSQL at localhost:{port}: the server does not offer TLS, but sslmode require needs it "
                          "(server does not support SSL, but SSL was required); turn ssl on in the server's "
                          "postgresql.conf, or check that hostname and port name the right server"),
    "plaintext-verify-full": ("plain", {"sslmode": "verify-full", "sslrootcert": "{ca}"},
                              "PostgreSQL at localhost:{port}: the server does not offer TLS, but sslmode verify-full "
                              "needs it (server does not support SSL, but SSL was required); turn ssl on in the "
                              "server's postgresql.conf, or check that hostname and port name the right server"),
}


def _failure(case: str, pki: Pki, port: int) -> tuple[dict[str, Any], str]:
    """:data:`FAILURES`' ``case`` for the server at ``port``: the database's keys, and the line."""
    _, keys, line = FAILURES[case]
    files = {"ca": pki.good.ca, "other": pki.other.ca, "port": port}
    return {"hostname": "localhost", **{key: value.format(**files) for key, value in keys.items()}}, line.format(**files)


@pytest.mark.servers
@pytest.mark.parametrize("case", FAILURES)
def test_a_tls_setup_that_fails_is_fatal_at_once_with_one_line(
    case: str, pki: Pki, tls_pg: PostgresServer, plain_pg: PostgresServer
) -> None:
    server = tls_pg if FAILURES[case][0] == "tls" else plain_pg
    keys, line = _failure(case, pki, server.port)
    db = _db(server.port, **keys, await_database={"timeout_ms": 60_000})  # a TLS failure is not waited for
    started = time.monotonic()

    with pytest.raises(PostgresTlsError) as failed:
        confirmed_lsn(db)

    assert str(failed.value) == line
    assert time.monotonic() - started < 20


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.parametrize("case", ["wrong-ca", "wrong-host"])
def test_the_pipeline_stops_with_the_line_and_walflow_check_says_it(
    case: str, pki: Pki, tls_pg: PostgresServer, tls_db: Database, nats_srv: Nats, names: TestNames, tmp_path: Path
) -> None:
    keys, line = _failure(case, pki, tls_pg.port)
    config = _tls_config(tmp_path, tls_db, nats_srv, names, **keys)

    stopped = fatal_line(run_to_exit(config))  # exit 2, one line, no traceback
    checked = run_both("check", config)

    assert stopped == f"walflow: {line}"
    assert checked.code != 0
    assert checked.finding("fail", line)["about"] == "database shop"
    assert not slot_active(tls_db)


# -- verify-full end to end ---------------------------------------------------------------------------------


_SSL_QUERY = """
SELECT a.application_name, a.backend_type, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
WHERE a.datname = %s AND a.application_name LIKE 'walflow:%%' ORDER BY 1, 2
"""


@pytest.mark.slow
@pytest.mark.servers
def test_verify_full_streams_over_tls_and_a_certificate_that_stops_verifying_stops_the_pipeline(
    pki: Pki, tls_pg: PostgresServer, tls_db: Database, nats_srv: Nats, names: TestNames, stream_cleanup: str,
    tmp_path: Path,
) -> None:
    with tls_db.connect() as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
    config = _tls_config(tmp_path, tls_db, nats_srv, names, hostname="localhost", sslmode="verify-full",
                         sslrootcert=str(pki.good.ca))
    slot = names.slot
    own = [(f"walflow:{slot}", "client backend", True), (f"walflow:{slot}", "walsender", True),
           (f"walflow:{slot}:heartbeat", "client backend", True)]

    def connections() -> list[tuple[str, str, bool]]:
        with psycopg.connect(tls_pg.dsn(), autocommit=True) as conn:
            return [(str(name), str(kind), bool(ssl))
                    for name, kind, ssl in conn.execute(_SSL_QUERY, [names.database]).fetchall()]

    try:
        with pipeline(config, "-s", "1") as proc:
            wait_for(lambda: slot_active(tls_db), timeout=60, what="the pipeline to open its slot",
                     check=lambda: assert_running(proc))
            with tls_db.connect() as conn:
                conn.execute("INSERT INTO orders VALUES (1, 9), (2, 12)")
                conn.execute("UPDATE orders SET total = 10 WHERE id = 1")
            wait_for(lambda: len(stored(nats_srv.url, names.stream)) >= 3, timeout=60, what="the changes in NATS",
                     check=lambda: assert_running(proc))
            # the walsender, the session's own connection and the heartbeat writer's: each one TLS
            wait_for(lambda: set(own) <= set(connections()), timeout=30, what="walflow's connections",
                     check=lambda: assert_running(proc))
            seen = connections()

            _serve(tls_pg, pki.other)  # a certificate the configured CA did not sign
            with psycopg.connect(tls_pg.dsn(), autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                             "AND application_name LIKE 'walflow:%%'", [names.database])
            wait_for(lambda: not proc.running, timeout=60, what="the pipeline to stop")
            exit_code = proc.returncode
        log = config.with_suffix(".log").read_text()
    finally:
        _serve(tls_pg, pki.good)

    assert all(ssl for _, _, ssl in seen) and set(own) <= set(seen), seen
    # JetStream holds each row's changes in commit order; across rows the order is free
    events = sorted(stored(nats_srv.url, names.stream),
                    key=lambda e: (e.event["metadata"]["commit_lsn"], e.event["metadata"]["commit_idx"]))
    assert [(e.event["action"], e.event["record"]) for e in events] == [
        ("insert", {"id": 1, "total": 9}), ("insert", {"id": 2, "total": 12}), ("update", {"id": 1, "total": 10}),
    ]
    # reconnecting met the wrong certificate: not retried, one line, exit 2
    assert exit_code == 2, log
    assert "Traceback" not in log
    # the config's CA (good) against a server whose CA is now the other one: wrong-ca with the roles swapped
    _, expected = _failure("wrong-ca", Pki(good=pki.other, other=pki.good), tls_pg.port)
    assert [line for line in log.splitlines() if line.startswith("walflow:")] == [f"walflow: {expected}"]
