"""One error taxonomy: every failure walflow reports is fatal or transient, decided where it is raised.

- :class:`FatalError`: an operator must act (a wrong config, a missing privilege, an
  invalidated slot, a message JetStream will never take). Its message is one line that says
  what happened and what to do; the pipeline stops with exit status 2
  (:meth:`core.runtime.Runtime.fatal`), and nothing past the problem is confirmed, so a
  restart after the fix loses nothing.
- :class:`TransientError`: passes by itself (a restarted server, a network reset, a slot
  still held by a previous connection). The part that met it retries with capped backoff,
  resuming exactly where it was.

Library exceptions (psycopg, nats-py) are translated at the connector boundary, by looking
their code up in one table per server below (as psycopg's ``errors.py`` maps SQLSTATE to
classes); code above it looks at the class only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, TypeVar

T = TypeVar("T")


class WalflowError(Exception):
    """Any failure walflow classified."""


class FatalError(WalflowError):
    """An operator must act; the message says what to do. Stops the pipeline (exit 2)."""


class InternalError(FatalError):
    """Something walflow did not foresee escaped a step: a bug. Stops the pipeline like any
    fatal error (nothing past it confirmed), with one line instead of a traceback."""


class TransientError(WalflowError):
    """Passes by itself: retried with backoff by the part that met it."""


class ValueFree(Exception):
    """Marks an exception whose text walflow wrote from the config, names, types and positions
    alone, never from a row's values: a dead letter, a fatal line and a log line say it as it
    is. Any other exception met by a step that sees a row's values (filters, enrichment,
    transforms, routing) is said by its type alone, since its text may quote them
    (``transforms/render.py``)."""


class WordedTypeError(ValueFree, TypeError):
    """A failure walflow words itself, from types only (never a value): said as it is, like every
    :class:`ValueFree` (routing, transform, enrichment and condition errors). Here, not beside
    its users: a class deriving from two built-in exceptions cannot be compiled (mypyc)."""


# -- PostgreSQL: one table per kind of work, by SQLSTATE --------------------------------------


def by_sqlstate(table: Mapping[str, T], sqlstate: str | None, default: T) -> T:
    """``table``'s entry for ``sqlstate``: its exact code, else its class (the first two
    characters, as SQLSTATE groups them), else ``default``."""
    if not sqlstate:
        return default
    return table.get(sqlstate, table.get(sqlstate[:2], default))


class ReplicationSetupError(FatalError):
    """The database is not ready for walflow, or can no longer be replicated; the message says what to change."""


class StreamError(TransientError):
    """The server refused or ended the replication stream, or the connection broke; retried."""

    def __init__(self, message: str, sqlstate: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        #: When set, how soon a reconnect may try again (a stale holder was just removed).
        self.retry_after = retry_after


class SlotInUse(StreamError):
    """55006: another connection holds the slot (who it is decides what to do: the supervisor's job)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "55006")


#: The replication stream's errors an operator must act on, with what to do; any other
#: SQLSTATE (a restarted server, a terminated walsender) is a :class:`StreamError`.
REPLICATION_FATAL: Final[Mapping[str, str]] = {
    "55000": "replication slot '{slot}' can no longer be used: {error}. PostgreSQL invalidated it (its WAL was "
    "removed, e.g. by max_slot_wal_keep_size), so the changes since its last confirmed position are gone from it. "
    "To recover: SELECT pg_drop_replication_slot('{slot}'); start walflow again to recreate the slot, and "
    "backfill the tables from their current contents.",
    "42704": "replication of slot '{slot}' stopped: {error}. The publication was dropped (or never existed) while "
    "walflow was reading; PostgreSQL cannot decode past that point with it. Recreate the publication, then "
    "drop and recreate the slot and backfill the changes since.",
}


def replication_error(message: str, sqlstate: str | None, slot: str) -> StreamError | FatalError:
    """The error the server's ``sqlstate`` means for replication of ``slot``."""
    fatal = by_sqlstate(REPLICATION_FATAL, sqlstate, None)
    if fatal is not None:
        return ReplicationSetupError(fatal.format(slot=slot, error=message))
    if sqlstate == "55006":
        return SlotInUse(message)
    return StreamError(message, sqlstate)


class PostgresTlsError(FatalError):
    """The TLS that the database's keys ask for could not be set up: the server's certificate
    failed verification, the server has no TLS, or a TLS file is unusable. Retrying cannot fix
    any of them, and nothing (no password, no row) crossed the connection."""


#: libpq's words for a TLS setup that failed: what they mean, and what to do (libpq reports
#: them before any SQLSTATE exists, so its text is all there is). Anything else (a reset
#: during the handshake: ``SSL SYSCALL error``, ``SSL connection has been closed
#: unexpectedly``) is the network's, and transient. Looked up in order: the first words found win.
POSTGRES_TLS: Final[Mapping[str, tuple[str, str]]] = {
    "certificate verify failed": (
        "the server's certificate is not signed by a CA in sslrootcert {rootcert} (sslmode {sslmode})",
        "give sslrootcert the CA that signed the server's certificate"),
    "does not match host name": ("the server's certificate does not name {host} (sslmode verify-full)",
                                 "set hostname to a name the certificate holds"),
    "server does not support ssl, but ssl was required": (
        "the server does not offer TLS, but sslmode {sslmode} needs it",
        "turn ssl on in the server's postgresql.conf, or check that hostname and port name the right server"),
    "root certificate file": ("the CA file in sslrootcert {rootcert} cannot be read (sslmode {sslmode})",
                              "give sslrootcert the PEM file of the CA that signed the server's certificate"),
    "private key file": ("the client key in sslkey cannot be used", "give sslkey a key file of mode 0600"),
    "could not load private key": ("the client key in sslkey cannot be read", "check sslkey and sslpassword"),
    "certificate file": ("the client certificate in sslcert cannot be used", "give sslcert a readable PEM file"),
    "unknown ca": ("the server does not trust the client certificate in sslcert",
                   "give one signed by the CA that the server's ssl_ca_file holds"),
    "certificate required": ("the server requires a client certificate", "give sslcert and sslkey"),
}


def postgres_tls_error(text: str, where: str, **keys: str) -> PostgresTlsError | None:
    """The :class:`PostgresTlsError` libpq's connection error ``text`` means for the database
    at ``where`` (``host:port``), its message filled in from ``keys`` (``host``, ``sslmode``,
    ``rootcert``); None when ``text`` is not a TLS setup failure (:data:`POSTGRES_TLS`)."""
    lowered = text.lower()
    for words, (what, fix) in POSTGRES_TLS.items():
        if words in lowered:
            # libpq's reason without its "connection to server at …, port … failed:" preamble (``where`` says it)
            line = next(line for line in text.splitlines() if words in line.lower()).strip()
            reason = line.rpartition(" failed: ")[2] or line
            return PostgresTlsError(f"PostgreSQL at {where}: {what.format(**keys)} ({reason}); {fix}")
    return None


#: What a backfill does when its query fails: ``shrink`` the chunk and read it again (a
#: statement timeout), ``end`` the backfill with the error (the same query fails the same
#: way every time: the table dropped, a start position its column cannot hold, a column
#: dropped, SELECT revoked), else ``retry`` on a new connection with backoff.
BackfillOutcome = Literal["shrink", "end", "retry"]
BACKFILL_QUERY: Final[Mapping[str, BackfillOutcome]] = {
    "57014": "shrink",  # query_canceled: statement_timeout
    "22": "end",  # data exception
    "42": "end",  # syntax error or access rule violation (42P01: the table was dropped)
}


# -- NATS and JetStream: one table per kind of answer, by the server's text or JetStream's code -------


def by_code(table: Mapping[int, T], code: int, default: T) -> T:
    """``table``'s entry for JetStream's ``code`` (HTTP's numbers): the code itself, else its
    class (``code // 100``: 4 for 4xx, 5 for 5xx), else ``default``."""
    return table.get(code, table.get(code // 100, default))


class NatsAuthError(FatalError):
    """The NATS server refused the sink's credentials."""


class NatsPermissionError(FatalError):
    """The NATS server refused a request the sink's user has no permission for."""


class NatsTlsError(FatalError):
    """TLS to NATS did not come about as the config asks (not started, or the server's certificate
    not verified): nothing was sent in clear, and retrying cannot fix it."""


class NatsUnavailable(TransientError):
    """NATS did not answer, or dropped the connection: waited for, and retried."""


#: What the NATS server's ``-ERR`` says, by the words it holds (lower case; nats-py passes the
#: text on, ``nats: 'Authorization Violation'``). Any other error is :class:`NatsUnavailable`.
NATS_SERVER: Final[Mapping[str, type[WalflowError]]] = {
    "authorization violation": NatsAuthError,  # at connect: the credentials (retrying cannot fix them)
    "permissions violation": NatsPermissionError,  # a request refused (it times out: the text comes first)
}


def nats_error(text: str) -> type[WalflowError]:
    """The class of a NATS server's error ``text`` (:data:`NATS_SERVER`)."""
    lowered = text.lower()
    for words, kind in NATS_SERVER.items():
        if words in lowered:
            return kind
    return NatsUnavailable


class StreamSetupError(FatalError):
    """No stream can hold the sink's events as configured; the message says what to change."""


#: What stream setup does with an error of JetStream's API (``$JS.API.STREAM.*``), by its
#: ``err_code``, else its ``code``: ``again``, the streams changed meanwhile (another process
#: created one: name in use, subjects overlap) and the lookup starts over; ``missing``, the stream
#: does not exist (or was deleted meanwhile); ``refused``, a :class:`StreamSetupError` quoting
#: JetStream. Anything else (a timeout, a 5xx) is raised as it is.
StreamOutcome = Literal["again", "missing", "refused"]
JETSTREAM_API: Final[Mapping[int, StreamOutcome]] = {
    10058: "again",  # stream name already in use
    10065: "again",  # subjects overlap with an existing stream
    404: "missing",
    400: "refused",
}


def stream_outcome(code: int | None, err_code: int | None) -> StreamOutcome | None:
    """What stream setup does with a JetStream API error (:data:`JETSTREAM_API`); None: raise it."""
    found = JETSTREAM_API.get(err_code or 0)
    return found if found is not None else JETSTREAM_API.get(code or 0)


class PublishError(WalflowError):
    """One message was not stored; ``code`` is JetStream's error code when it answered (None: it
    did not), as ``walflow_publish_failures_total`` counts it. Not raised: the publisher keeps it
    with the message, re-sends it when it is a :class:`TransientError` and stops otherwise."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def retryable(self) -> bool:
        return isinstance(self, TransientError)


class PublishFailed(PublishError, TransientError):
    """Sending the message again may store it: no ack in time, a disconnect, a JetStream 5xx."""


class PublishRefused(PublishError, FatalError):
    """Sending the message again cannot store it: a JetStream 4xx, larger than ``max_payload``."""


class NoStreamError(PublishFailed):
    """Nothing answered the publish (JetStream's 503 "no responders"): the stream has no leader (a
    cluster's election) or no stream captures the subject. The sink finds out which
    (``connectors/nats/target.py``): it waits for the leader, or sets the stream up again; then re-sends."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders on {subject}: the stream has no leader (an election) or is gone", "503")


class RestartRequired(WalflowError):
    """Only a fresh start recovers: replication again from the slot's confirmed position.
    Neither fatal nor retried in place: the process starts itself again
    (:meth:`core.runtime.Runtime.restart`), carrying ``record`` (plain data) to the new one."""

    def __init__(self, message: str, record: dict[str, Any]) -> None:
        super().__init__(message)
        self.record = record


class StreamRegressed(RestartRequired):
    """A JetStream stream lost messages it had acknowledged (``connectors/nats/regression.py``)."""


class PermanentPublishError(FatalError):
    """JetStream refused a message for a reason that retrying cannot fix: the pipeline stops."""


#: A publish's error acknowledgement, by its ``code`` (:func:`by_code`); any other code,
#: 4xx above all (a bad header, a message too large), is :class:`PublishRefused`.
JETSTREAM_PUBLISH: Final[Mapping[int, type[PublishError]]] = {
    408: PublishFailed,  # request timeout
    409: PublishFailed,  # conflict (e.g. a leader change)
    429: PublishFailed,  # too many requests
    5: PublishFailed,  # the server's side: 500, 503 (e.g. no quorum, maximum messages exceeded)
}
