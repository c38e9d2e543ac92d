"""Connection strings for every connection walflow opens to a database, and what their TLS failures mean.

Every connection (replication, heartbeats, backfill, enrichment, the commands' probes) is
made from :func:`conninfo`, so each uses the database's TLS keys (``sslmode``,
``sslrootcert``, ``sslcert``, ``sslkey``, ``sslpassword``) as libpq means them. A TLS setup
that failed is a :class:`~core.errors.PostgresTlsError` (:func:`tls_failure`): fatal, one
line, since no retry can make a certificate verify; nothing crossed the connection. Sequin's
``ssl: true``, which does not verify the server, is said once per process.

All pin the settings that decide how values are printed as text: the walsender renders
tuple values with *its* session settings and psycopg's loaders parse with the normal
connection's, so both must agree (ISO dates, UTC, postgres intervals, exact floats,
hex bytea, UTF-8). The strings hold the password: never log them.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg.conninfo import make_conninfo

from config.schema import DatabaseConfig
from core.errors import PostgresTlsError, postgres_tls_error
from core.once import warn_once

log = logging.getLogger("walflow.postgres")

PINNED_SETTINGS = {
    "datestyle": "ISO",
    "intervalstyle": "postgres",
    "extra_float_digits": "3",
    "TimeZone": "UTC",
    "bytea_output": "hex",
}


def conninfo(
    db: DatabaseConfig,
    *,
    application_name: str,
    replication: bool = False,
    settings: dict[str, str] | None = None,
) -> str:
    """A libpq connection string for ``db``; ``replication`` opens a walsender connection."""
    options = " ".join(f"-c {key}={value}" for key, value in {**PINNED_SETTINGS, **(settings or {})}.items())
    params: dict[str, str | int | None] = {
        "host": db.hostname,
        "port": db.port,
        "dbname": db.database,
        "user": db.username,
        "sslmode": db.libpq_sslmode,
        "sslrootcert": db.sslrootcert,
        "sslcert": db.sslcert,
        "sslkey": db.sslkey,
        "client_encoding": "UTF8",
        "application_name": application_name,
        "options": options,
        "connect_timeout": 10,
        # a server host that vanished is noticed in about a minute, not TCP's default hours
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    if db.password is not None:
        params["password"] = db.password.get_secret_value()
    if db.sslpassword is not None:
        params["sslpassword"] = db.sslpassword.get_secret_value()
    if db.ssl and db.sslmode is None:
        warn_once(log, ("unverified tls", db.name),
                  "database %s: ssl: true is sslmode=require, which encrypts but does not verify the server: whoever "
                  "answers at %s:%s can read the stream. Add sslmode: verify-full and sslrootcert: <the CA's PEM file>",
                  db.name, db.hostname, db.port, extra={"database": db.name, "sslmode": "require"})
    if replication:
        params["replication"] = "database"
    return make_conninfo("", **params)


def tls_failure(db: DatabaseConfig, exc: psycopg.Error) -> PostgresTlsError | None:
    """The fatal error ``exc`` (met connecting to ``db``) is when its TLS setup failed; None otherwise."""
    if not isinstance(exc, psycopg.OperationalError):
        return None
    rootcert = db.sslrootcert or "(not set: libpq's ~/.postgresql/root.crt)"
    return postgres_tls_error(str(exc), f"{db.hostname}:{db.port}", host=db.hostname, sslmode=db.libpq_sslmode,
                              rootcert=rootcert)
