"""One replication session: the connections, START_REPLICATION, the read loop.

A session runs on the reader thread (:mod:`connectors.postgres.supervisor`) from connect
to its end: it ends cleanly when asked to stop, and with an error otherwise, which the
supervisor retries or reports (:mod:`core.errors`). It is a shell around three sans-IO
parts: it feeds every CopyData message to the :class:`~connectors.postgres.decoder.Decoder`
and hands what it staged to the byte-bounded buffer after each burst; the slot's
:class:`~connectors.postgres.position.SlotPosition` writes the status updates; the session's
:class:`~connectors.postgres.liveness.Liveness` says when to send one, when silence is
suspect and when WAL stands still. A full buffer never silences the connection: the
session then stops reading but keeps sending status updates.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Any, Final, Protocol

import psycopg

from config.schema import DatabaseConfig, ReplicationSettings
from connectors.postgres import signals
from connectors.postgres.buffer import ChangeBuffer
from connectors.postgres.connection import conninfo, tls_failure
from connectors.postgres.decoder import Decoder, ResumePoint
from connectors.postgres.liveness import Liveness
from connectors.postgres.messages import Reason
from connectors.postgres.position import SlotPosition
from connectors.postgres.protocol import lsn_to_str
from connectors.postgres.slot import SlotState, prepare
from connectors.postgres.stream import ReplicationStream, quote_identifier
from connectors.postgres.types import Catalog
from core.errors import StreamError
from core.events import RawChange
from core.metrics import Metrics
from core.sizes import OversizedReport

log = logging.getLogger("walflow.postgres")

#: How many CopyData messages to handle before looking at the clock and the buffer again.
_READ_BURST: Final = 500
#: Wait events of a walsender that is idle or blocked on its client, not working.
WAITING_ON_CLIENT: Final = frozenset({"WalSenderWaitForWAL", "WalSenderWriteData", "ClientWrite", "ClientRead"})


class Control(Protocol):
    """What a session shares with the supervisor that runs it (and, through it, the partition)."""

    buffer: ChangeBuffer
    stopping: threading.Event
    #: Readable when the supervisor wants the session to look again (room, a confirm, stop).
    wake_fd: int
    connected: bool
    slot_state: SlotState | None
    #: The key columns used per relation so far in this run (:class:`~connectors.postgres.types.Catalog`).
    table_keys: dict[int, tuple[str, ...]]
    #: The process's metrics: the time spent with the buffer full counts as backpressure.
    metrics: Metrics
    #: The slot's positions: where a session starts, and what its status updates say.
    position: SlotPosition

    def drain_wakeups(self, readable: list[int]) -> None: ...

    def on_message(self, prefix: str, content: bytes) -> None:
        """A heartbeat came through the slot (it may be anyone's: the content is untrusted)."""
        ...

    def on_ignored(self, prefix: str, reason: Reason, detail: str) -> None:
        """A logical message under a prefix walflow owns was ignored (``connectors.postgres.messages``)."""
        ...


class Session:
    """One connection to the walsender, resumed at ``resume``."""

    def __init__(self, db: DatabaseConfig, settings: ReplicationSettings, control: Control,
                 application_name: str) -> None:
        self.db = db
        self.settings = settings
        self.control = control
        self.position = control.position
        #: Where this session starts: right after everything the previous one handed on.
        self.resume = self.position.resume
        self.application_name = application_name
        self.decoder: Decoder | None = None
        self._report = OversizedReport("max_change", control.metrics, "its change is larger than "
                                       f"walflow.max_change_mb ({settings.max_change_bytes} bytes)")

    def _oversized(self, change: RawChange, column: str, size: int) -> None:
        """The decoder replaced a value of ``change`` (over ``walflow.max_change_mb``): counted, said once."""
        self._report(change.table.qualified, column, size,
                     f"the {change.action} at commit LSN {lsn_to_str(change.commit_lsn)} (commit_idx {change.commit_idx})")

    def resume_point(self) -> ResumePoint:
        """Where the next session continues: right after everything this one handed on."""
        return self.resume if self.decoder is None else self.decoder.resume_point()

    def run(self) -> None:
        """Stream until the supervisor asks to stop (then confirm, end COPY and return) or an
        error: a connection that failed or broke (psycopg's ``OperationalError``, anywhere in
        the session) is a :class:`~core.errors.StreamError`, retried, unless its TLS setup
        failed (:func:`~connectors.postgres.connection.tls_failure`): that is fatal."""
        try:
            self._run()
        except psycopg.OperationalError as exc:
            raise tls_failure(self.db, exc) or StreamError(str(exc)) from None

    def _run(self) -> None:
        timeout = self.settings.wal_sender_timeout_ms
        control = self.control
        with psycopg.connect(conninfo(self.db, application_name=self.application_name), autocommit=True) as meta:
            control.slot_state = state = prepare(meta, self.db)
            catalog = Catalog(meta, control.table_keys, self.db.name)
            decoder = self.decoder = Decoder(catalog, self.resume, control.on_message,
                                             staged_prefixes=frozenset({signals.PREFIX}), on_ignored=control.on_ignored,
                                             max_change=self.settings.max_change_bytes,
                                             on_oversized=self._oversized)
            stream = ReplicationStream(
                conninfo(
                    self.db,
                    application_name=self.application_name,
                    replication=True,
                    settings={"wal_sender_timeout": f"{timeout}ms"},
                )
            )
            try:
                # Start at our own durable position; the server uses max(it, confirmed_flush_lsn).
                start = self.resume.lsn
                stream.start(
                    self.db.slot.name,
                    start,
                    {
                        "proto_version": "1",
                        "publication_names": quote_identifier(self.db.publication.name),
                        "messages": "true",  # heartbeats
                    },
                )
                control.connected = True
                log.info("streaming slot %s from %s (server confirmed %s)", self.db.slot.name,
                         lsn_to_str(start), lsn_to_str(state.confirmed_flush_lsn))
                self._start_position(decoder, state.confirmed_flush_lsn)
                self._loop(stream, decoder, meta)
                stream.send(self.position.status(decoder.received))  # a clean stop: the last confirmed position
                stream.end()
            finally:
                control.connected = False
                stream.close()

    def _start_position(self, decoder: Decoder, server_confirmed: int) -> None:
        if self.position.session_start(server_confirmed) is None:
            return
        if self.resume.lsn:
            log.warning(
                "slot %s was confirmed up to %s by someone else, beyond walflow's durable position %s: "
                "changes in between cannot be replayed from this slot",
                self.db.slot.name, lsn_to_str(server_confirmed), lsn_to_str(self.resume.lsn),
            )
        decoder.start_at(server_confirmed)
        self._hand_over(decoder)

    def _loop(self, stream: ReplicationStream, decoder: Decoder, meta: psycopg.Connection[Any]) -> None:
        control, position = self.control, self.position
        buffer = control.buffer
        full_wait = control.metrics.backpressure.labels("reader_buffer")
        clock = Liveness(time.monotonic(), decoder.received, self.settings.status_interval_ms / 1000,
                                       self.settings.wal_sender_timeout_ms / 1000,
                                       watch_stalls=bool(self.settings.heartbeat_interval_ms))
        while not control.stopping.is_set():
            now = time.monotonic()
            tick = clock.tick(now, decoder.received, position.confirm_unsent, not buffer.full)
            if tick.suspect:
                if not self._walsender_busy(meta, stream.backend_pid):
                    raise StreamError(f"no message from the server for {clock.silent_for(now):.0f}s despite pings: "
                                      "connection lost")
                clock.heard(now)  # replaying a huge rewrite sends nothing, not even keepalives (PG15)
            if tick.stalled is not None:
                log.warning("slot %s: no progress through the WAL for %.0f min (at %s); still connected, still waiting",
                            self.db.slot.name, tick.stalled / 60, lsn_to_str(decoder.received))
            if tick.send:
                stream.send(position.status(decoder.received, tick.reply))
                clock.sent(now)
            wake_by = clock.wake_by(position.confirm_unsent)
            if buffer.full:
                # Backpressure: leave the rest in Postgres, wake for room, a confirm or the next status.
                readable, _, _ = select.select([control.wake_fd], [], [], max(0.0, wake_by - now))
                control.drain_wakeups(readable)
                heard = time.monotonic()
                clock.heard(heard)  # not listening is not silence
                full_wait.inc(heard - now)
                continue
            if self._read_burst(stream, decoder, clock) == 0:
                control.drain_wakeups(stream.wait(max(0.0, wake_by - time.monotonic()), [control.wake_fd]))

    def _read_burst(self, stream: ReplicationStream, decoder: Decoder, clock: Liveness) -> int:
        """Feed up to a burst of messages already received to the decoder, then hand what it
        staged to the buffer. The burst stops where the staged changes fill the buffer's
        room, so the buffer overshoots its bound by at most one message."""
        handled = 0
        refilled = False
        get_copy_data = stream.get_copy_data
        feed = decoder.feed
        room = self.control.buffer.room
        try:
            while handled < _READ_BURST and decoder.staged_size < room:
                try:
                    size, data = get_copy_data(1)
                except psycopg.OperationalError as exc:
                    raise StreamError(str(exc)) from None
                if size <= 0:
                    if size < 0:
                        raise stream.ended()
                    if refilled:
                        break
                    # More has usually arrived while this burst was decoded: take it now,
                    # rather than after a trip through the loop and select().
                    refilled = True
                    stream.consume()
                    continue
                handled += 1
                if feed(data):
                    stream.send(self.position.status(decoder.received))  # the server asked for a reply
            if handled:
                clock.heard(time.monotonic())  # once per burst: a burst takes milliseconds
        finally:
            self._hand_over(decoder)
        return handled

    def _hand_over(self, decoder: Decoder) -> None:
        items, sizes, size = decoder.take()
        self.control.buffer.put_many(items, sizes, size)
        self.position.heard(decoder.received)

    def _walsender_busy(self, meta: psycopg.Connection[Any], pid: int) -> bool:
        """Ask over the normal connection whether our walsender is alive and working (not
        waiting on us or idle): then silence is a long replay, not a dead connection."""
        try:
            row = meta.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        except psycopg.Error:
            return False
        if row is None or row[0] in WAITING_ON_CLIENT:
            return False
        log.warning("slot %s: the walsender is busy (wait event %s) and silent; waiting for it",
                    self.db.slot.name, row[0] or "none, on CPU")
        return True
