"""One replication session: the connections, START_REPLICATION, the read loop, status updates, the watchdog.

A session runs on the reader thread (:mod:`connectors.postgres.supervisor`) from connect
to its end: it ends cleanly when asked to stop, and with an error otherwise, which the
supervisor classifies and retries. It feeds every CopyData message to the decoder and hands
what the decoder staged to the byte-bounded buffer after each burst of messages.

Status updates follow ``shared/reference/postgres-replication.md`` §3–4: ``write`` is the
last LSN received (so keepalives never turn into a ping-pong), ``flush`` is the position the
pipeline made durable (:attr:`Control.confirmed`), replies go out at once when the server
asks, and at least every ``status_interval_ms``. A full buffer never silences the
connection: the session then stops reading but keeps sending status updates, so the
walsender neither times out nor has to ping.

Liveness is judged on *any* message, never on data: a long catch-up over WAL with nothing
to publish sends only keepalives. Silence past a status interval is met with
reply-requested pings, which the walsender answers even while catching up (at worst after
``wal_sender_timeout/2``); only no answer at all, from a walsender the server says is not
working, means the connection is dead.
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
from connectors.postgres.connection import conninfo
from connectors.postgres.decoder import Decoder, ResumePoint
from connectors.postgres.messages import Reason
from connectors.postgres.protocol import lsn_to_str, status_update
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
#: The least time between two status updates sent only because the confirmed LSN moved.
_CONFIRM_GAP: Final = 0.1
#: walEnd standing still this long (seconds) while connected is logged as a warning.
_STALL_WARNING: Final = 300.0
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

    @property
    def confirmed(self) -> int:
        """Everything before this LSN is durable downstream: the status update's ``flush``."""
        ...

    def drain_wakeups(self, readable: list[int]) -> None: ...

    def on_message(self, prefix: str, content: bytes) -> None:
        """A heartbeat came through the slot (it may be anyone's: the content is untrusted)."""
        ...

    def on_ignored(self, prefix: str, reason: Reason, detail: str) -> None:
        """A logical message under a prefix walflow owns was ignored (``connectors.postgres.messages``)."""
        ...


class Session:
    """One connection to the walsender, resumed at ``resume``."""

    def __init__(
        self,
        db: DatabaseConfig,
        settings: ReplicationSettings,
        resume: ResumePoint,
        control: Control,
        application_name: str,
    ) -> None:
        self.db = db
        self.settings = settings
        self.resume = resume
        self.control = control
        self.application_name = application_name
        self.decoder: Decoder | None = None
        self._confirm_sent = -1
        self._last_heard = 0.0  # when the server last sent anything
        self._progress_lsn, self._progress_at = resume.lsn, time.monotonic()  # walEnd's last move
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
        """Stream until the supervisor asks to stop (then confirm, end COPY and return) or an error."""
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
                self._send_status(stream, decoder)  # a clean stop: the last confirmed position, then CopyDone
                stream.end()
            finally:
                control.connected = False
                stream.close()

    def _start_position(self, decoder: Decoder, server_confirmed: int) -> None:
        if server_confirmed <= self.resume.lsn:
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
        control = self.control
        buffer = control.buffer
        full_wait = control.metrics.backpressure.labels("reader_buffer")
        interval = self.settings.status_interval_ms / 1000
        dead_after = self.settings.wal_sender_timeout_ms / 2000 + 3 * interval
        next_status = last_sent = 0.0
        self._last_heard = time.monotonic()
        while not control.stopping.is_set():
            now = time.monotonic()
            silent = now - self._last_heard
            if silent > dead_after:
                if not self._walsender_busy(meta, stream.backend_pid):
                    raise StreamError(f"no message from the server for {silent:.0f}s despite pings: connection lost")
                self._last_heard = now  # replaying a huge rewrite sends nothing, not even keepalives (PG15)
            self._watch_progress(decoder.received, now)
            confirmed = control.confirmed
            # a new confirmed position goes out promptly, but at most every _CONFIRM_GAP
            if now >= next_status or (confirmed != self._confirm_sent and now - last_sent >= _CONFIRM_GAP):
                self._send_status(stream, decoder, reply=silent > interval)
                last_sent, next_status = now, now + interval
            wake_by = next_status if control.confirmed == self._confirm_sent else min(next_status, last_sent + _CONFIRM_GAP)
            if buffer.full:
                # Backpressure: leave the rest in Postgres, wake for room, a confirm or the next status.
                readable, _, _ = select.select([control.wake_fd], [], [], max(0.0, wake_by - now))
                control.drain_wakeups(readable)
                self._last_heard = time.monotonic()  # not listening is not silence
                full_wait.inc(self._last_heard - now)
                continue
            if self._read_burst(stream, decoder) == 0:
                control.drain_wakeups(stream.wait(max(0.0, wake_by - time.monotonic()), [control.wake_fd]))

    def _read_burst(self, stream: ReplicationStream, decoder: Decoder) -> int:
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
                    self._send_status(stream, decoder)  # the server asked for a reply
            if handled:
                self._last_heard = time.monotonic()  # once per burst: a burst takes milliseconds
        finally:
            self._hand_over(decoder)
        return handled

    def _hand_over(self, decoder: Decoder) -> None:
        items, sizes, size = decoder.take()
        self.control.buffer.put_many(items, sizes, size)

    def _send_status(self, stream: ReplicationStream, decoder: Decoder, reply: bool = False) -> None:
        flush = self.control.confirmed
        stream.send(status_update(decoder.received, flush, reply))
        self._confirm_sent = flush

    def _watch_progress(self, received: int, now: float) -> None:
        """walEnd standing still while heartbeats are written is worth a warning, not a restart:
        the server may be replaying one huge transaction (it sends keepalives meanwhile)."""
        if received != self._progress_lsn:
            self._progress_lsn, self._progress_at = received, now
        elif (now - self._progress_at > _STALL_WARNING and not self.control.buffer.full
              and self.settings.heartbeat_interval_ms):
            log.warning("slot %s: no progress through the WAL for %.0f min (at %s); still connected, still waiting",
                        self.db.slot.name, (now - self._progress_at) / 60, lsn_to_str(received))
            self._progress_at = now

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
