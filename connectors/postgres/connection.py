"""Connection strings for the two connections a slot reader opens.

Both pin the settings that decide how values are printed as text: the walsender renders
tuple values with *its* session settings and psycopg's loaders parse with the normal
connection's, so both must agree (ISO dates, UTC, postgres intervals, exact floats,
hex bytea, UTF-8). The strings hold the password: never log them.
"""

from __future__ import annotations

from psycopg.conninfo import make_conninfo

from config.schema import DatabaseConfig

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
        "sslmode": "require" if db.ssl else "prefer",
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
    if replication:
        params["replication"] = "database"
    return make_conninfo("", **params)
