"""The walsender connection in COPY BOTH mode, on psycopg's ``pq`` layer.

Everything here is non-blocking except ``start``: the session decides when to wait on the
socket, so it can keep sending status updates while it does not read.

The server's errors are looked up in :data:`core.errors.REPLICATION_FATAL`: what an
operator must fix is fatal, with what to do; a slot held by another connection is
:class:`~core.errors.SlotInUse`; everything else is a transient :class:`~core.errors.StreamError`.
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from connectors.postgres.protocol import lsn_to_str
from core.errors import FatalError, StreamError, replication_error


def quote_identifier(name: str) -> str:
    """For ``publication_names``, which takes SQL identifiers inside a string literal."""
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class ReplicationStream:
    """One ``START_REPLICATION … LOGICAL`` session."""

    def __init__(self, conninfo: str) -> None:
        self._conn: psycopg.Connection[Any] = psycopg.connect(conninfo, autocommit=True)
        self._pgconn = self._conn.pgconn
        self._slot = ""

    @property
    def fileno(self) -> int:
        return self._pgconn.socket

    @property
    def backend_pid(self) -> int:
        return self._pgconn.backend_pid

    def start(self, slot: str, lsn: int, options: dict[str, str]) -> None:
        """Send START_REPLICATION and wait for the server to enter COPY BOTH (or refuse).

        ``slot`` is a validated slot name (lower-case letters, digits, underscores) and the
        option names are walflow's own, so neither needs quoting.
        """
        self._slot = slot
        opts = ", ".join(f"{key} {_quote_literal(value)}" for key, value in options.items())
        command = f"START_REPLICATION SLOT {slot} LOGICAL {lsn_to_str(lsn)} ({opts})"
        self._pgconn.send_query(command.encode())
        while self._pgconn.is_busy():
            select.select([self.fileno], [], [], 1.0)
            self._pgconn.consume_input()
        result = self._pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise self._error(result)

    @property
    def get_copy_data(self) -> Callable[[int], tuple[int, memoryview]]:
        """psycopg's own non-blocking read, called by the reader for every message (a Python
        method around it would cost a call each): ``get_copy_data(1)`` returns ``(size,
        payload)`` for a message already received, ``(0, b"")`` when the socket must be read
        first, and a negative size when the server ended COPY (then raise :meth:`ended`).
        Raises ``psycopg.OperationalError`` when the connection broke."""
        return self._pgconn.get_copy_data

    def ended(self) -> StreamError | FatalError:
        """Why the server ended COPY: its result's error, after ``get_copy_data`` returned a negative size."""
        return self._error(self._pgconn.get_result())

    def consume(self) -> None:
        """Pull what the socket holds into libpq, without waiting."""
        try:
            self._pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise StreamError(str(exc)) from None

    def wait(self, timeout: float, also: list[int]) -> list[int]:
        """Wait until the socket or one of ``also`` is readable; pull what arrived into libpq."""
        readable, _, _ = select.select([self.fileno, *also], [], [], timeout)
        try:
            # also on a timeout: with TLS, bytes already decrypted do not make the socket readable
            self._pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise StreamError(str(exc)) from None
        return readable

    def send(self, data: bytes) -> None:
        """Queue one CopyData and flush it (a status update is 34 bytes: this does not stall)."""
        try:
            while self._pgconn.put_copy_data(data) == 0:  # libpq's output buffer is full
                self._flush()
            self._flush()
        except psycopg.OperationalError as exc:
            raise StreamError(str(exc)) from None

    def _flush(self) -> None:
        while self._pgconn.flush() == 1:
            select.select([], [self.fileno], [], 1.0)

    def end(self) -> None:
        """Leave COPY cleanly (CopyDone), so the walsender exits at once instead of timing out."""
        try:
            self._pgconn.put_copy_end()
            self._flush()
        except psycopg.OperationalError as exc:
            raise StreamError(str(exc)) from None

    def close(self) -> None:
        self._conn.close()

    def _error(self, result: pq.abc.PGresult | None) -> StreamError | FatalError:
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            state = result.error_field(pq.DiagnosticField.SQLSTATE)
            message = result.error_message.decode(errors="replace").strip()
            return replication_error(message, state.decode() if state else None, self._slot)
        message = self._pgconn.error_message.decode(errors="replace").strip() or "replication connection lost"
        return StreamError(message)
